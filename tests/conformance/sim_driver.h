// The third driver of the suite: a step driver over the simulator's backends (tests/sim/
// backends.h: SimRedis as the guard, SimPostgres as the sink and its transactions), on simulated
// time. It performs the plan's steps one after the other, the way the simulator does for one
// call, with the in-process steps of detail::InProcess: no threads, no timers. A wait jumps its
// clock to the wake-up time (or to the deadline, which cuts it short); the deadline passes when a
// scenario says (pass_deadline() moves the clock to it); a handler that waits until stopped is
// cut short at its deadline (the clock jumps to it), as the async driver cuts it.
#pragma once

#include <chrono>
#include <memory>

#include "conformance.h"
#include "facade/in_process.h"
#include "facade/plan.h"
#include "idem/local_cache.h"

namespace idem::conformance {

class SimTestDriver final : public test::TestDriver {
 public:
  /// A rule the driver breaks on purpose, to show that the suite fails a driver that breaks one.
  enum class Plant {
    kNone,
    kIgnoresStop,     ///< Reports every input as not stopped.
    kMissesDeadline,  ///< pass_deadline() says yes and moves nothing.
  };

  SimTestDriver(World& world, test::DriverSetup setup, Plant plant = Plant::kNone);

  [[nodiscard]] test::Abilities abilities() const override {
    return {.deadline = true, .transactions = true};
  }
  test::Ending call(const Request& request, const test::Behaviour& behaviour, test::Saw& saw,
                    bool transactional) override;
  bool pass_deadline() override;
  [[nodiscard]] bool deadline_ahead() const override {
    return plan_ != nullptr && plan_->deadline() != detail::PlanTime::max() &&
           now() < plan_->deadline();
  }
  void shutdown() override { shut_down_ = true; }

 private:
  [[nodiscard]] detail::PlanTime now() const {
    return detail::PlanTime{} + std::chrono::milliseconds(now_ms_);
  }
  detail::StepResult perform(detail::CallPlan& plan, const detail::Step& step);
  detail::StepResult perform_io(detail::CallPlan& plan, const detail::Step& step);
  detail::StepResult in_transaction(const detail::Step& step);
  detail::StepResult run_handler(detail::CallPlan& plan);
  bool renew(detail::CallPlan& plan);

  [[nodiscard]] bool stopped(const Request& request) const {
    return plant_ != Plant::kIgnoresStop && (shut_down_ || request.stop.stop_requested());
  }

  World& world_;
  Plant plant_;
  detail::PlanRules rules_;
  std::unique_ptr<LocalCache> cache_;
  detail::InProcess in_process_;
  std::int64_t now_ms_ = 3'600'000;
  int attempts_ = 0;
  bool shut_down_ = false;
  sim::SimPostgres::TxId tx_ = 0;  // the open transaction of a run_transactional() call
  detail::CallPlan* plan_ = nullptr;
  const test::Behaviour* behaviour_ = nullptr;
  test::Saw* saw_ = nullptr;
};

}  // namespace idem::conformance
