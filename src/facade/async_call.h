// One call of the asynchronous driver (src/facade/async_deduplicator.cc): the plan, the
// request it keeps, the handler, and what stops it (the caller's cancellation slot, Request::stop,
// the deadline, shutdown()). Lives on the deduplicator's executor; not thread-safe.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>

#include "facade/plan.h"
#include "facade/steps.h"
#include "idem/async_deduplicator.h"

namespace idem::detail {

class AsyncCall : public std::enable_shared_from_this<AsyncCall> {
 public:
  AsyncCall(std::shared_ptr<AsyncDeduplicator::Impl> dedup, Request request, AsyncHandler handler,
            CallMode mode, std::unique_ptr<AsyncCompletion> completion,
            asio::cancellation_slot slot);
  ~AsyncCall();
  AsyncCall(const AsyncCall&) = delete;
  AsyncCall& operator=(const AsyncCall&) = delete;

  /// Registers the call, arms its deadline and spawns its coroutine.
  void start();
  /// Stops the call (a cancellation, Request::stop, shutdown(): `deadline` false) or tells it
  /// its deadline passed: the step under way is cut short when the plan said it may be; the
  /// plan decides what that means.
  void interrupt(bool deadline);

  // For AsyncContext.
  [[nodiscard]] const CallPlan& plan() const noexcept { return plan_; }
  asio::awaitable<bool> renew();
  asio::awaitable<std::string> step(std::string_view name, std::string_view input,
                                    std::function<asio::awaitable<std::string>()> fn);
  [[nodiscard]] bool stop_requested() const noexcept;
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept {
    return plan_.deadline();
  }

  // The deduplicator's queue of calls by deadline (every call has the same deadline length, so
  // start order is deadline order): one timer for all, a bounded number interrupted per turn.
  AsyncCall* deadline_prev_ = nullptr;
  AsyncCall* deadline_next_ = nullptr;
  bool in_deadline_queue_ = false;
  // Its index in the deduplicator's running calls.
  std::size_t running_at_ = 0;

 private:
  // Runs the plan to its end: returns the exception the call ends with, or null when it ends
  // with plan_.outcome() (no exception is thrown to carry it).
  static asio::awaitable<std::exception_ptr> drive(std::shared_ptr<AsyncCall> self);
  // Gives the plan `result`, performs the steps of the process it asks for, and returns the
  // first step to await (its operation, not yet started), or nothing when the plan has ended.
  // Not a coroutine: neither the step nor its result takes room in drive()'s frame, which
  // lives as long as the call.
  std::optional<asio::awaitable<StepResult>> advance(StepResult result);
  asio::awaitable<StepResult> guard_step(Step step);
  asio::awaitable<StepResult> sink_step(Step step);
  asio::awaitable<StepResult> transaction_step(Step step);
  asio::awaitable<StepResult> wait_step(PlanTime at);
  asio::awaitable<StepResult> run_handler();
  [[nodiscard]] bool stopped() const noexcept;
  void schedule_renewal();
  static asio::awaitable<void> renew_in_background(std::shared_ptr<AsyncCall> self);
  void finish(std::exception_ptr error, Outcome outcome);

  std::shared_ptr<AsyncDeduplicator::Impl> dedup_;
  Request request_;
  CallPlan plan_;
  AsyncHandler handler_;
  std::unique_ptr<AsyncCompletion> completion_;
  asio::cancellation_slot user_slot_;
  asio::cancellation_signal signal_;  // the call's coroutine is bound to it
  std::optional<std::stop_callback<std::function<void()>>> on_request_stop_;
  std::optional<asio::steady_timer> renew_timer_;
  StepBook steps_;
  std::unique_ptr<AsyncPgTransaction> tx_;  // run_transactional(): from kSinkBegin to its end
  bool cancelled_ = false;                  // stopped: a cancellation, Request::stop, shutdown()
  bool interruptible_ = false;              // the step under way may be cut short
  bool handler_running_ = false;
  bool finished_ = false;
};

}  // namespace idem::detail
