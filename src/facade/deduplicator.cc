// The blocking driver of the call plan: performs each step the plan asks for on the caller's
// thread (hiredis and libpqxx calls, a wait for kWait), and renews leases from one helper thread
// per Deduplicator. It decides nothing: every rule lives in facade/plan.cc, and the in-process
// steps (local cache, metrics, events, the failure decision) in facade/in_process.cc.
#include "idem/deduplicator.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <stop_token>
#include <thread>
#include <utility>

#include "facade/call_state.h"
#include "facade/contract_steps.h"
#include "facade/in_process.h"
#include "facade/plan.h"
#include "facade/renewer.h"
#include "facade/steps.h"
#include "idem/errors.h"
#include "idem/local_cache.h"
#include "idem/request_id.h"
#include "pg/cancel.h"
#include "sink/pg_transaction.h"
#include "sink/sql.h"

namespace idem {

using SteadyClock = std::chrono::steady_clock;

std::string_view Context::request_id() const noexcept { return state_->request_id(); }
std::string_view Context::key() const noexcept { return state_->key(); }
std::string_view Context::fingerprint() const noexcept { return state_->fingerprint(); }
int Context::attempt() const noexcept { return state_->attempt(); }
std::chrono::milliseconds Context::remaining_lease() const noexcept {
  return state_->remaining_lease();
}
bool Context::renew() { return state_->renew(); }
bool Context::lease_lost() const noexcept { return state_->lease_lost(); }
std::stop_token Context::stop_token() const noexcept { return state_->stop_token(); }
std::string Context::step_impl(std::string_view name, std::string_view input,
                               const std::function<std::string()>& fn) {
  return state_->step(name, input, fn);
}
void Context::stage(std::string sql, std::vector<std::optional<std::string>> params) {
  state_->stage(std::move(sql), std::move(params));
}

namespace {

// While it lives, a stop of the call cancels the statement running on `tx`'s connection on the
// server (SQLSTATE 57014), from a helper thread.
class CancelOnStop {
 public:
  CancelOnStop(detail::PgTransaction& tx, std::chrono::milliseconds bound, std::stop_token stop)
      : cancel_(tx.raw_connection(), bound.count() > 0 ? bound : std::chrono::milliseconds(30000)),
        on_stop_(std::move(stop), Cancel{&cancel_}) {}

 private:
  struct Cancel {
    detail::PgStatementCancel* cancel;
    void operator()() const noexcept { cancel->request(); }
  };
  detail::PgStatementCancel cancel_;
  std::stop_callback<Cancel> on_stop_;
};

using Handler = std::function<std::string(pqxx::transaction_base*, Context&)>;

// What every call of one Deduplicator shares.
struct Shared {
  const detail::PlanRules& rules;
  LocalCache* cache;
  PgSink* pg;
  detail::Renewer& renewer;
  std::stop_token shutdown;
};

// One call of the blocking driver: the plan, and what the handler's Context asks of the driver.
class BlockingCall final : public detail::CallState, public detail::Renewable {
 public:
  BlockingCall(const Shared& shared, const Request& request, detail::CallMode mode,
               std::string attempt_id)
      : shared_(shared),
        options_(shared.rules.options()),
        in_process_(shared.rules, shared.cache),
        plan_(shared.rules, request, mode, SteadyClock::now(), std::chrono::system_clock::now(),
              std::move(attempt_id)),
        steps_(options_.metrics.get(), options_.max_step_result_bytes) {}

  Outcome drive(const Handler& handler);

  // detail::Renewable
  std::optional<detail::PlanTime> renewal_due() override {
    std::lock_guard lock(mutex_);
    return plan_.renewal_due();
  }
  void renew_now() override {
    try {
      (void)renew();
    } catch (const Error&) {
      // Told to the plan (lease_lost); renewal goes on trying while the handler runs.
    }
  }

  // detail::CallState
  std::string_view request_id() const noexcept override { return plan_.request().request_id; }
  std::string_view key() const noexcept override { return plan_.key(); }
  std::string_view fingerprint() const noexcept override { return plan_.fingerprint(); }
  int attempt() const noexcept override { return plan_.request().attempt; }
  std::chrono::milliseconds remaining_lease() const noexcept override {
    std::lock_guard lock(mutex_);
    return plan_.remaining_lease(SteadyClock::now());
  }
  bool lease_lost() const noexcept override {
    std::lock_guard lock(mutex_);
    return plan_.lease_lost(SteadyClock::now());
  }
  bool renew() override;
  std::stop_token stop_token() noexcept override;
  std::string step(std::string_view name, std::string_view input,
                   const std::function<std::string()>& fn) override;
  void stage(std::string sql, std::vector<std::optional<std::string>> params) override {
    if (!tx_) {
      throw Error("idem: Context::stage() outside a run_transactional() handler on a PgSink");
    }
    tx_->stage(std::move(sql), std::move(params));
  }

 private:
  [[nodiscard]] bool stopped() const noexcept {
    return plan_.request().stop.stop_requested() || shared_.shutdown.stop_requested();
  }
  detail::StepResult perform(const detail::Step& step, const Handler& handler);
  detail::StepResult perform_io(const detail::Step& step, const Handler& handler);
  detail::StepResult run_handler(const Handler& handler);
  void wait_until(detail::PlanTime at);

  struct StopForwarder {
    std::stop_source* target;
    void operator()() const noexcept { target->request_stop(); }
  };

  const Shared& shared_;
  const DeduplicatorOptions& options_;
  const detail::InProcess in_process_;
  mutable std::mutex mutex_;  // the plan, while the handler runs (renewals, Context)
  detail::CallPlan plan_;
  std::optional<detail::PgTransaction> tx_;  // run_transactional(): from kSinkBegin to its end
  std::optional<std::stop_source> stop_;     // made by stop_token(), under mutex_
  std::optional<std::stop_callback<StopForwarder>> on_caller_stop_;
  std::optional<std::stop_callback<StopForwarder>> on_shutdown_;
  detail::StepBook steps_;  // the handler's thread only
};

bool BlockingCall::renew() {
  std::optional<detail::RenewalStep> step;
  {
    std::lock_guard lock(mutex_);
    step = plan_.renewal();
  }
  if (!step) return true;
  const auto sent = SteadyClock::now();
  detail::RenewalAnswers answers;
  if (!step->owner_token.empty()) {
    answers.ask(answers.guard,
                [&] { return options_.guard->renew(step->key, step->owner_token, step->lease); });
  }
  if (!step->sink_owner.empty()) {
    answers.ask(answers.sink, [&] {
      return options_.sink->renew(step->key, step->sink_owner, std::chrono::milliseconds(0));
    });
  }
  std::lock_guard lock(mutex_);
  in_process_.renewed(plan_, sent, answers);
  return answers.answer();
}

std::stop_token BlockingCall::stop_token() noexcept {
  // A token requested when either the caller's or the shutdown token is; made on first use, so
  // calls whose handler never asks pay nothing. Under the call's mutex, not std::call_once:
  // glibc's pthread_once wakes futex waiters with a system call on every first use.
  std::lock_guard lock(mutex_);
  if (!stop_) {
    stop_.emplace();
    on_caller_stop_.emplace(plan_.request().stop, StopForwarder{&*stop_});
    on_shutdown_.emplace(shared_.shutdown, StopForwarder{&*stop_});
  }
  return stop_->get_token();
}

std::string BlockingCall::step(std::string_view name, std::string_view input,
                               const std::function<std::string()>& fn) {
  std::optional<detail::JournalTarget> journal;
  {
    std::lock_guard lock(mutex_);
    journal = plan_.step_journal();
  }
  if (!journal) {
    steps_.unguarded(name);
    return fn();
  }
  Guard& guard = *options_.guard;
  if (!steps_.loaded()) steps_.load(guard.steps(journal->key));
  detail::StepBook::Next next = steps_.next(name, input);
  if (next.replay) return *std::move(next.replay);
  const std::optional<detail::TransactionWrites> before =
      tx_ ? std::optional(tx_->writes()) : std::nullopt;
  JournaledStep done{std::move(next.fingerprint), fn()};
  const bool wrote = before && detail::wrote_between(*before, tx_->writes());
  if (const std::optional<StepEnding> why = steps_.unjournaled(done, wrote))
    return steps_.kept(name, std::move(done), *why);
  const bool owned = guard.put_step(journal->key, journal->owner_token, name, done);
  return steps_.journaled(name, std::move(done), owned);
}

Outcome BlockingCall::drive(const Handler& handler) {
  detail::Input input{SteadyClock::now(), stopped(), detail::Started{}};
  for (;;) {
    detail::Step step;
    {
      std::lock_guard lock(mutex_);
      step = plan_.resume(std::move(input));
    }
    if (step.kind == detail::StepKind::kReturn || step.kind == detail::StepKind::kThrow) {
      (void)in_process_.perform(step);  // its notes
    }
    if (step.kind == detail::StepKind::kReturn) return plan_.outcome();
    if (step.kind == detail::StepKind::kThrow) std::rethrow_exception(plan_.error());
    input.result = perform(step, handler);
    input.now = SteadyClock::now();
    input.stopped = stopped();
  }
}

detail::StepResult BlockingCall::perform(const detail::Step& step, const Handler& handler) {
  if (std::optional<detail::StepResult> done = in_process_.perform(step)) return *std::move(done);
  try {
    return perform_io(step, handler);
  } catch (...) {
    if (step.kind == detail::StepKind::kCommit) {
      const bool handlers = tx_ && tx_->handler_statement_failed();
      tx_.reset();  // ended, whatever it answered
      return detail::commit_failure(
          std::current_exception(),
          detail::business_duplicate(std::current_exception(),
                                     shared_.pg->options().business_constraints),
          handlers);
    }
    return detail::classify_current();
  }
}

detail::StepResult BlockingCall::perform_io(const detail::Step& step, const Handler& handler) {
  using detail::StepKind;
  if (std::optional<detail::StepResult> done = detail::perform_contract_step(
          options_.guard.get(), options_.sink.get(), tx_.has_value(), step)) {
    return *std::move(done);
  }
  switch (step.kind) {
    case StepKind::kSinkBegin:
      tx_.emplace(*shared_.pg);
      tx_->open(!step.with_next);
      return detail::Done{};
    case StepKind::kSinkClaim: {
      // The claim may wait on the key's lock: a stop meanwhile cancels it.
      const CancelOnStop cancel(*tx_, shared_.pg->options().response_timeout, stop_token());
      return tx_->claim(step.key, step.request_id, step.fingerprint);
    }
    case StepKind::kRunHandler:
      return run_handler(handler);
    case StepKind::kSinkComplete:  // staged: COMMIT carries it
      tx_->record(step.key, step.request_id, step.fingerprint, step.value, step.ttl);
      return detail::Done{};
    case StepKind::kCommit:
      tx_->commit();
      tx_.reset();
      return detail::Done{};
    case StepKind::kRollback:
      if (tx_) tx_->rollback();
      tx_.reset();
      return detail::Done{};
    case StepKind::kWait:
      wait_until(step.at);
      return detail::Done{};
    default:
      throw Error("idem: internal: a step the blocking driver does not perform");
  }
}

detail::StepResult BlockingCall::run_handler(const Handler& handler) {
  // The renewer reads the plan while the handler runs: it is done with this call (also when
  // unwinding) before the result is reported.
  struct Renewal {
    detail::Renewer* renewer;
    BlockingCall* call;
    ~Renewal() {
      if (renewer != nullptr) renewer->remove(*call);
    }
  } renewal{renewal_due() ? &shared_.renewer : nullptr, this};
  if (renewal.renewer != nullptr) shared_.renewer.add(*this);
  Context context(*this);
  try {
    if (!tx_) return detail::Response{handler(nullptr, context)};
    // A stop while the handler runs cancels its running statement on the server; the plan
    // counts the 57014 that ends it as a cancellation.
    const CancelOnStop cancel(*tx_, shared_.pg->options().response_timeout, stop_token());
    std::string response;
    if (!tx_->business_write([&] { response = handler(&tx_->tx(), context); })) {
      return detail::BusinessDuplicate{};
    }
    return detail::Response{std::move(response)};
  } catch (...) {
    return detail::classify_current();
  }
}

void BlockingCall::wait_until(detail::PlanTime at) {
  // Woken early by a stop: the plan ends the wait.
  std::mutex mutex;
  std::condition_variable_any woken;
  std::unique_lock lock(mutex);
  (void)woken.wait_until(lock, stop_token(), at, [] { return false; });
}

// Whether the sink can run a call in its transaction, and with business constraints.
detail::DriverTraits traits_of(const DeduplicatorOptions& options) {
  const auto* pg = dynamic_cast<const PgSink*>(options.sink.get());
  return detail::DriverTraits{
      .transactions = pg != nullptr,
      .business_constraints = pg != nullptr && !pg->options().business_constraints.empty()};
}

}  // namespace

struct Deduplicator::Impl {
  explicit Impl(DeduplicatorOptions options)
      : rules(options, traits_of(options)), cache(detail::local_cache_for(rules.options())) {
    // Gauges of the backends (breaker state, pool use) for the metrics that read them.
    const DeduplicatorOptions& o = rules.options();
    if (o.metrics) o.metrics->watch_backends(o.guard, o.sink);
  }

  detail::PlanRules rules;
  std::unique_ptr<LocalCache> cache;
  std::stop_source shutdown;
  // The calls in flight, in a block of its own: a call that ends notifies it after the
  // destructor may have gone on and freed the rest.
  const std::shared_ptr<std::atomic<std::size_t>> calls =
      std::make_shared<std::atomic<std::size_t>>(0);
  Uuid7Generator owner_ids;
  detail::Renewer renewer;  // last: its thread stops before the rest goes
  Shared shared{rules, cache.get(), dynamic_cast<PgSink*>(rules.options().sink.get()), renewer,
                shutdown.get_token()};
};

Deduplicator::Deduplicator(DeduplicatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

Deduplicator::~Deduplicator() {
  // As shutdown(), then wait for the calls in flight: each ends soon (a stopped call throws
  // Cancelled before its handler, a running handler is told by its stop token), and none may
  // outlive the state it uses.
  impl_->shutdown.request_stop();
  std::atomic<std::size_t>& calls = *impl_->calls;
  for (std::size_t n = calls.load(std::memory_order_acquire); n != 0;
       n = calls.load(std::memory_order_acquire)) {
    calls.wait(n, std::memory_order_acquire);
  }
}

void Deduplicator::shutdown() noexcept { impl_->shutdown.request_stop(); }

Outcome Deduplicator::run_handler(const Request& request, bool transactional,
                                  const ErasedHandler& handler) {
  const std::shared_ptr<std::atomic<std::size_t>> calls = impl_->calls;  // outlives the call
  calls->fetch_add(1, std::memory_order_relaxed);
  struct Leaving {
    std::atomic<std::size_t>& calls;
    ~Leaving() {
      // Release: what the call did happens before the destructor's acquire load of 0.
      if (calls.fetch_sub(1, std::memory_order_release) == 1) calls.notify_all();
    }
  } leaving{*calls};
  const detail::CallMode mode =
      transactional ? detail::CallMode::kTransactional : detail::CallMode::kRun;
  BlockingCall call(impl_->shared, request, mode,
                    detail::CallPlan::needs_attempt_id(impl_->rules, request, mode)
                        ? impl_->owner_ids.next()
                        : std::string());
  return call.drive(handler);
}

}  // namespace idem
