// The async driver's call deadlines: the calls by deadline (a doubly linked list through the
// calls, oldest first: every call has the same deadline length, so start order is deadline
// order) and one timer armed for the first. Expired calls are interrupted kBatch per turn of the
// loop, so a burst of deadlines (1 000 calls stuck on a stopped server) never holds the loop.
// Not thread-safe: on the deduplicator's executor.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>
#include <memory>

namespace idem::detail {

class AsyncCall;

class DeadlineQueue {
 public:
  explicit DeadlineQueue(const asio::any_io_executor& executor) : timer_(executor) {}
  DeadlineQueue(const DeadlineQueue&) = delete;
  DeadlineQueue& operator=(const DeadlineQueue&) = delete;

  /// Adds `call`, whose deadline is no earlier than any queued call's.
  void enqueue(AsyncCall& call);
  /// Removes `call` (nothing when it is not queued); an empty queue holds no timer.
  void dequeue(AsyncCall& call);

 private:
  static constexpr int kBatch = 32;
  void arm();
  void expire();

  asio::steady_timer timer_;
  AsyncCall* head_ = nullptr;
  AsyncCall* tail_ = nullptr;
  bool armed_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // expires with this queue
};

}  // namespace idem::detail
