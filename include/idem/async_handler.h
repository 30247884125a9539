// A completion handler held until it is called, for idem's asynchronous operations.
//
// Not part of idem's API: AsyncDeduplicator's completions and the async clients' queued
// operations both hold their caller's handler this way.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <type_traits>
#include <utility>

namespace idem::detail {

/// An Asio completion handler and outstanding work on its associated executor (which defaults to
/// the owner's, `owner` below), until it is called once.
///
/// Not thread-safe: held and called on the owner's executor.
template <typename Handler>
class HeldHandler {
 public:
  using Executor = asio::associated_executor_t<Handler, asio::any_io_executor>;

  HeldHandler(Handler handler, const asio::any_io_executor& owner)
      : handler_(std::move(handler)),
        work_(asio::make_work_guard(asio::get_associated_executor(handler_, owner))) {
    if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
      same_executor_ = work_.get_executor() == owner;
    }
  }

  /// The handler, for its associated cancellation slot.
  Handler& handler() { return handler_; }
  /// The handler's associated executor.
  Executor executor() const { return work_.get_executor(); }

  /// Calls the handler with `args`, once, dispatched to its executor. `in_owner_handler`: called
  /// from a handler the owner's executor runs, so a handler on that executor is called directly,
  /// as dispatch() would call it, without wrapping it in a type-erased function (an allocation
  /// per call). Leaves this object empty; the work is released after the handler returns.
  template <typename... Args>
  void call(bool in_owner_handler, Args... args) {
    auto work = std::move(work_);
    Handler handler = std::move(handler_);
    if (in_owner_handler && same_executor_) {
      std::move(handler)(std::move(args)...);
      return;
    }
    asio::dispatch(work.get_executor(),
                   [h = std::move(handler), ... a = std::move(args)]() mutable {
                     std::move(h)(std::move(a)...);
                   });
  }

 private:
  Handler handler_;
  asio::executor_work_guard<Executor> work_;
  bool same_executor_ = false;  // the handler's executor is the owner's
};

}  // namespace idem::detail
