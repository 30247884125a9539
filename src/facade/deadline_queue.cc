#include "facade/deadline_queue.h"

#include <asio/post.hpp>
#include <chrono>
#include <system_error>

#include "facade/async_call.h"

namespace idem::detail {

void DeadlineQueue::enqueue(AsyncCall& call) {
  call.in_deadline_queue_ = true;
  call.deadline_prev_ = tail_;
  call.deadline_next_ = nullptr;
  (tail_ != nullptr ? tail_->deadline_next_ : head_) = &call;
  tail_ = &call;
  if (!armed_) arm();
}

void DeadlineQueue::dequeue(AsyncCall& call) {
  if (!call.in_deadline_queue_) return;
  call.in_deadline_queue_ = false;
  (call.deadline_prev_ != nullptr ? call.deadline_prev_->deadline_next_ : head_) =
      call.deadline_next_;
  (call.deadline_next_ != nullptr ? call.deadline_next_->deadline_prev_ : tail_) =
      call.deadline_prev_;
  call.deadline_prev_ = call.deadline_next_ = nullptr;
  if (head_ == nullptr && armed_) {
    armed_ = false;  // an idle deduplicator holds no timer
    timer_.cancel();
  }
}

void DeadlineQueue::arm() {
  if (head_ == nullptr) {
    armed_ = false;
    return;
  }
  armed_ = true;
  timer_.expires_at(head_->deadline());
  timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](std::error_code error) {
    if (error || alive.expired()) return;
    expire();
  });
}

void DeadlineQueue::expire() {
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < kBatch; ++i) {
    AsyncCall* call = head_;
    if (call == nullptr || call->deadline() > now) return arm();
    dequeue(*call);
    call->interrupt(true);
  }
  // More have expired: go on in a later turn, after what is ready now (timers included).
  asio::post(timer_.get_executor(), [this, alive = std::weak_ptr<bool>(alive_)] {
    if (!alive.expired()) expire();
  });
}

}  // namespace idem::detail
