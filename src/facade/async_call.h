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
  /// Stops the call: a cancellation (`deadline` false) or its deadline. Before the handler
  /// returned, the step or handler under way is cancelled; afterwards only the plan's stop is
  /// requested (a deadline then changes nothing).
  void interrupt(bool deadline);

  // For AsyncContext.
  [[nodiscard]] const CallPlan& plan() const noexcept { return plan_; }
  asio::awaitable<bool> renew();
  [[nodiscard]] bool stop_requested() const noexcept;
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept {
    return deadline_at_;
  }

  // The deduplicator's queue of calls by deadline (every call has the same deadline length, so
  // start order is deadline order): one timer for all, a bounded number interrupted per turn.
  AsyncCall* deadline_prev_ = nullptr;
  AsyncCall* deadline_next_ = nullptr;
  bool in_deadline_queue_ = false;
  // Its index in the deduplicator's running calls.
  std::size_t running_at_ = 0;

 private:
  // The call's end: an exception, or the outcome (no exception is thrown to carry it).
  using Ending = std::pair<std::exception_ptr, Outcome>;
  static asio::awaitable<Ending> drive(std::shared_ptr<AsyncCall> self);
  asio::awaitable<void> perform(const Step& step);
  // Performs `io` (returning an awaitable of a value) and reports it with `report`, or fails
  // the step. `cancellable`: a step before the handler, which a stop or the deadline cuts short.
  template <typename Io, typename Report>
  asio::awaitable<void> attempt(Layer layer, bool cancellable, Io io, Report report);
  asio::awaitable<void> run_handler(AsyncTransaction* tx);
  // The transactional steps (kSinkBegin to kCommit/kRollback) on tx_.
  asio::awaitable<void> perform_in_transaction(const Step& step);
  // Hands `event` to on_decision; what it throws is swallowed.
  void emit(const DecisionEvent& event) const noexcept;
  // Why a step of `layer` must not start now (the call was stopped), or null.
  [[nodiscard]] std::exception_ptr interruption(Layer layer) const;
  // The exception the call ends with for the plan's `error`.
  [[nodiscard]] std::exception_ptr thrown(std::exception_ptr error) const;
  // A cancellation this driver reported to the plan (so thrown() needs not inspect it).
  std::exception_ptr reported_cancellation_;
  void schedule_renewal();
  static asio::awaitable<void> renew_in_background(std::shared_ptr<AsyncCall> self);
  void finish(std::exception_ptr error, Outcome outcome);
  friend struct idem::AsyncDeduplicator::Impl;

  std::shared_ptr<AsyncDeduplicator::Impl> dedup_;
  Request request_;
  std::stop_source stop_;  // the plan's stop: cancellation, deadline, shutdown
  CallPlan plan_;
  AsyncHandler handler_;
  std::unique_ptr<AsyncCompletion> completion_;
  asio::cancellation_slot user_slot_;
  asio::cancellation_signal signal_;  // the call's coroutine is bound to it
  std::optional<std::stop_callback<std::function<void()>>> on_request_stop_;
  std::chrono::steady_clock::time_point deadline_at_ = std::chrono::steady_clock::time_point::max();
  std::optional<asio::steady_timer> renew_timer_;
  std::unique_ptr<AsyncPgTransaction> tx_;  // run_transactional(): from kSinkBegin to its end
  bool cancelled_ = false;
  bool deadline_passed_ = false;
  bool handler_running_ = false;
  bool shielded_ = false;  // the handler returned: nothing cuts the rest short
  bool finished_ = false;
};

}  // namespace idem::detail
