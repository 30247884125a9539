#include "sim_driver.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "facade/contract_steps.h"
#include "idem/errors.h"

namespace idem::conformance {

using detail::StepKind;
using detail::StepResult;

SimTestDriver::SimTestDriver(World& world, test::DriverSetup setup, Plant plant)
    : world_(world),
      plant_(plant),
      rules_(setup.options, detail::DriverTraits{.transactions = true, .deadline = setup.deadline}),
      cache_(detail::local_cache_for(rules_.options())),
      in_process_(rules_, cache_.get()) {}

test::Ending SimTestDriver::call(const Request& request, const test::Behaviour& behaviour,
                                 test::Saw& saw, bool transactional) {
  const detail::CallMode mode =
      transactional ? detail::CallMode::kTransactional : detail::CallMode::kRun;
  detail::CallPlan plan(rules_, request, mode, now(), std::chrono::system_clock::now(),
                        "sim-attempt-" + std::to_string(++attempts_));
  plan_ = &plan;
  behaviour_ = &behaviour;
  saw_ = &saw;
  struct Ended {
    SimTestDriver* driver;
    ~Ended() { driver->plan_ = nullptr; }
  } ended{this};
  detail::Input input{now(), stopped(request), detail::Started{}};
  for (int steps = 0; steps < 100'000; ++steps) {
    const detail::Step step = plan.resume(std::move(input));
    if (step.kind == StepKind::kReturn || step.kind == StepKind::kThrow) {
      (void)in_process_.perform(step);  // its notes
    }
    if (step.kind == StepKind::kReturn) return {plan.outcome(), nullptr};
    if (step.kind == StepKind::kThrow) return {std::nullopt, plan.error()};
    std::optional<StepResult> result = in_process_.perform(step);
    if (!result) result = perform(plan, step);
    input = detail::Input{now(), stopped(request), *std::move(result)};
  }
  return {std::nullopt, std::make_exception_ptr(std::logic_error("the plan never ended"))};
}

bool SimTestDriver::pass_deadline() {
  if (plan_ == nullptr || plan_->deadline() == detail::PlanTime::max() ||
      now() >= plan_->deadline()) {
    return false;
  }
  if (plant_ == Plant::kMissesDeadline) return true;
  now_ms_ =
      std::chrono::duration_cast<std::chrono::milliseconds>(plan_->deadline().time_since_epoch())
          .count();
  return true;
}

StepResult SimTestDriver::perform(detail::CallPlan& plan, const detail::Step& step) {
  try {
    return perform_io(plan, step);
  } catch (...) {
    if (step.kind == StepKind::kCommit && tx_ != 0) {
      // The connection is gone with its transaction: the server rolls it back.
      sim::SimPostgres& pg = *world_.sim_postgres();
      if (pg.is_open(tx_)) pg.rollback(tx_);
      tx_ = 0;
    }
    return detail::classify_current();
  }
}

StepResult SimTestDriver::perform_io(detail::CallPlan& plan, const detail::Step& step) {
  if (std::optional<StepResult> done = detail::perform_contract_step(
          rules_.options().guard.get(), rules_.options().sink.get(), tx_ != 0, step)) {
    return *std::move(done);
  }
  switch (step.kind) {
    case StepKind::kSinkClaim:
    case StepKind::kSinkComplete:
    case StepKind::kSinkBegin:
    case StepKind::kCommit:
    case StepKind::kRollback:
      return in_transaction(step);
    case StepKind::kRunHandler:
      return run_handler(plan);
    case StepKind::kWait:
      // Woken at `at`, or at the deadline when it comes first.
      now_ms_ = std::max(now_ms_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::min(step.at, plan.deadline()).time_since_epoch())
                                      .count());
      return detail::Done{};
    default:
      throw std::logic_error("the sim driver was asked to perform " +
                             std::string(detail::step_name(step.kind)));
  }
}

// The steps of a run_transactional() call, on SimPostgres' transactions. The hooks of the
// world's faulty sink do not see them: they are called here.
StepResult SimTestDriver::in_transaction(const detail::Step& step) {
  sim::SimPostgres& pg = *world_.sim_postgres();
  switch (step.kind) {
    case StepKind::kSinkBegin:
      world_.before(Op::kSinkBegin);
      tx_ = pg.begin();
      return detail::Done{};
    case StepKind::kSinkClaim: {
      world_.before(Op::kSinkClaim);
      sim::SimPostgres::TxId blocker = 0;
      std::optional<SinkClaim> claim =
          pg.claim(tx_, step.key, step.request_id, step.fingerprint, step.ttl, &blocker);
      if (!claim) {
        // Another transaction holds the key: its lock_timeout runs out at once.
        pg.rollback(tx_);
        claim = SinkClaim{.status = SinkStatus::kInProgress};
      }
      world_.after(Op::kSinkClaim);
      return *std::move(claim);
    }
    case StepKind::kSinkComplete:
      world_.before(Op::kSinkComplete);
      pg.complete(tx_, step.key, step.value, step.ttl);
      return detail::Done{};
    case StepKind::kCommit:
      world_.before(Op::kCommit);
      pg.commit(std::exchange(tx_, 0));
      world_.after(Op::kCommit);
      return detail::Done{};
    default:  // kRollback
      if (tx_ != 0 && pg.is_open(tx_)) pg.rollback(tx_);
      tx_ = 0;
      return detail::Done{};
  }
}

StepResult SimTestDriver::run_handler(detail::CallPlan& plan) {
  const test::Behaviour& behaviour = *behaviour_;
  test::Saw& saw = *saw_;
  ++saw.runs;
  saw.key = plan.key();
  saw.request_id = plan.request().request_id;
  saw.fingerprint = plan.fingerprint();
  saw.attempt = plan.request().attempt;
  StepResult result = detail::Done{};
  try {
    if (behaviour.on_start) behaviour.on_start();
    if (behaviour.renew) {
      try {
        saw.renewed = renew(plan);
      } catch (const BackendError&) {
        if (!behaviour.survive_failed_renewal) throw;
        saw.renewal_failed = true;
      }
    }
    if (behaviour.act != test::Behaviour::Act::kWaitUntilStopped) {
      result = detail::Response{test::detail_drivers::act(behaviour)};
    } else if (stopped(plan.request())) {
      throw Cancelled("the handler saw its stop");
    } else if (plan.deadline() != detail::PlanTime::max()) {
      // It waits until its deadline, where the driver cuts it short.
      now_ms_ = std::max(now_ms_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      plan.deadline().time_since_epoch())
                                      .count());
      result = detail::classify(std::make_exception_ptr(Cancelled("cut short at the deadline")));
    } else {
      result = detail::Response{"not stopped"};
    }
  } catch (...) {
    result = detail::classify_current();
  }
  saw.lease_lost = plan.lease_lost(now());
  return result;
}

bool SimTestDriver::renew(detail::CallPlan& plan) {
  const std::optional<detail::RenewalStep> step = plan.renewal();
  if (!step) return true;
  detail::RenewalAnswers answers;
  const DeduplicatorOptions& o = rules_.options();
  if (!step->owner_token.empty()) {
    answers.ask(answers.guard,
                [&] { return o.guard->renew(step->key, step->owner_token, step->lease); });
  }
  if (!step->sink_owner.empty()) {
    answers.ask(answers.sink, [&] {
      return o.sink->renew(step->key, step->sink_owner, std::chrono::milliseconds(0));
    });
  }
  in_process_.renewed(plan, now(), answers);
  return answers.answer();
}

}  // namespace idem::conformance
