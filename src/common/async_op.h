// What the asynchronous clients (src/redis/async_connection.h, src/pg/async_connection.h) share:
// a type-erased completion handler that honours Asio per-operation cancellation, and one timer
// per connection for the earliest deadline of its queue of pending operations.
//
// Not thread-safe: both live on their connection's executor.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

#include "idem/async_handler.h"

namespace idem::detail {

/// The completion handler of one queued operation with signature
/// `void(std::exception_ptr, Result)`, its type erased.
template <typename Result>
struct PendingOp {
  virtual ~PendingOp() = default;
  /// Completes the handler exactly once, dispatched to its associated executor, after clearing
  /// its cancellation slot; consumes `self` first (the handler may start the next operation).
  /// `in_owner_handler`: called from a handler the owner's executor runs, so a handler on that
  /// executor is called directly (as dispatch() would, without wrapping it in a type-erased
  /// function: an allocation per operation).
  virtual void complete(std::unique_ptr<PendingOp> self, std::exception_ptr error, Result result,
                        bool in_owner_handler) = 0;
  /// Posts complete() to the handler's executor (from inside a cancellation handler, where the
  /// slot must not be cleared).
  virtual void post_complete(std::unique_ptr<PendingOp> self, std::exception_ptr error,
                             Result result) = 0;
  /// The owner's queue entry while the operation is queued; null once it is detached.
  void* entry = nullptr;
  /// Called when the handler's cancellation slot is emitted while `entry` is set.
  void (*on_cancel)(PendingOp& op) = nullptr;
};

/// complete() of `op` (which it consumes), from anywhere on the owner's executor.
template <typename Result>
void finish(std::unique_ptr<PendingOp<Result>> op, std::exception_ptr error, Result result) {
  PendingOp<Result>* raw = op.get();
  raw->complete(std::move(op), error, std::move(result), false);
}

/// finish() from inside a handler the owner's executor runs (a read's), where the loop is
/// running: see PendingOp::complete().
template <typename Result>
void finish_in_handler(std::unique_ptr<PendingOp<Result>> op, std::exception_ptr error,
                       Result result) {
  PendingOp<Result>* raw = op.get();
  raw->complete(std::move(op), error, std::move(result), true);
}

template <typename Result, typename Handler>
class HandlerOp final : public PendingOp<Result> {
 public:
  HandlerOp(Handler handler, const asio::any_io_executor& fallback,
            void (*on_cancel)(PendingOp<Result>&))
      : held_(std::move(handler), fallback) {
    this->on_cancel = on_cancel;
    auto slot = asio::get_associated_cancellation_slot(held_.handler());
    if (slot.is_connected()) slot.template emplace<Canceller>(this);
  }

  void complete(std::unique_ptr<PendingOp<Result>> self, std::exception_ptr error, Result result,
                bool in_owner_handler) override {
    auto slot = asio::get_associated_cancellation_slot(held_.handler());
    if (slot.is_connected()) slot.clear();
    HeldHandler<Handler> held = std::move(held_);
    self.reset();
    held.call(in_owner_handler, error, std::move(result));
  }

  void post_complete(std::unique_ptr<PendingOp<Result>> self, std::exception_ptr error,
                     Result result) override {
    const auto executor = held_.executor();
    asio::post(executor, [self = std::move(self), error, r = std::move(result)]() mutable {
      finish(std::move(self), error, std::move(r));
    });
  }

 private:
  struct Canceller {
    explicit Canceller(HandlerOp* op) : op(op) {}
    void operator()(asio::cancellation_type type) const {
      if (type != asio::cancellation_type::none && op->entry != nullptr &&
          op->on_cancel != nullptr) {
        op->on_cancel(*op);
      }
    }
    HandlerOp* op;
  };

  HeldHandler<Handler> held_;
};

/// A PendingOp for `handler`; `on_cancel` reacts to its cancellation (see PendingOp).
template <typename Result, typename Handler>
std::unique_ptr<PendingOp<Result>> make_pending_op(Handler handler,
                                                   const asio::any_io_executor& fallback,
                                                   void (*on_cancel)(PendingOp<Result>&)) {
  return std::make_unique<HandlerOp<Result, std::decay_t<Handler>>>(std::move(handler), fallback,
                                                                    on_cancel);
}

/// Empties `queue` (entries with an `op` member) and completes every operation still attached
/// with `error` (a dropped connection fails everything it had).
template <typename Queue>
void fail_all(Queue& queue, const std::exception_ptr& error) {
  Queue failed;
  failed.swap(queue);
  for (auto& entry : failed) {
    if (entry.op == nullptr) continue;
    entry.op->entry = nullptr;
    finish(std::move(entry.op), error, {});
  }
}

/// One timer for the earliest deadline among a connection's pending operations (each with a
/// `deadline` time point). Left armed when the queue empties, it fires, finds nothing due and
/// stays off; disarm() cancels it (a failed connection, or one whose idle state must hold no
/// work on its io_context).
class QueueDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit QueueDeadline(const asio::any_io_executor& executor) : timer_(executor) {}

  /// Arms for `deadline` unless an earlier one is armed. When it passes,
  /// `owner->on_deadline(deadline)` runs (the timer keeps `owner` alive meanwhile); it is
  /// expected to call expired().
  template <typename Owner>
  void arm(Clock::time_point deadline, std::shared_ptr<Owner> owner) {
    if (deadline >= armed_for_) return;
    armed_for_ = deadline;
    timer_.expires_at(deadline);
    timer_.async_wait([owner = std::move(owner), deadline](std::error_code error) {
      if (!error) owner->on_deadline(deadline);
    });
  }

  /// With the deadline on_deadline() was called for: the first entry of `queue` whose deadline
  /// has passed, or nullptr after re-arming (for `owner`) for the earliest remaining one. Also
  /// nullptr when `deadline` is no longer the armed one (re-armed or disarmed since).
  template <typename Queue, typename Owner>
  const typename Queue::value_type* expired(Clock::time_point deadline, const Queue& queue,
                                            std::shared_ptr<Owner> owner) {
    if (deadline != armed_for_) return nullptr;
    armed_for_ = Clock::time_point::max();
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    for (const auto& entry : queue) {
      if (entry.deadline <= now) return &entry;
      if (entry.deadline < next) next = entry.deadline;
    }
    if (next != Clock::time_point::max()) arm(next, std::move(owner));
    return nullptr;
  }

  /// Cancels the timer.
  void disarm() {
    if (armed_for_ == Clock::time_point::max()) return;
    armed_for_ = Clock::time_point::max();
    timer_.cancel();
  }

 private:
  asio::steady_timer timer_;
  Clock::time_point armed_for_ = Clock::time_point::max();
};

}  // namespace idem::detail
