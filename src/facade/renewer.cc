#include "facade/renewer.h"

#include <chrono>

namespace idem::detail {

Renewer::~Renewer() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void Renewer::add(Renewable& call) {
  std::lock_guard lock(mutex_);
  if (!thread_.joinable()) thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
  calls_.insert(&call);
  ++added_;
  changed_.notify_all();
}

void Renewer::remove(Renewable& call) {
  std::unique_lock lock(mutex_);
  calls_.erase(&call);
  changed_.wait(lock, [&] { return renewing_ != &call; });
}

void Renewer::loop(const std::stop_token& stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    Renewable* due_call = nullptr;
    auto due = PlanTime::max();
    for (Renewable* call : calls_) {
      if (const auto at = call->renewal_due(); at && *at < due) {
        due = *at;
        due_call = call;
      }
    }
    if (due_call == nullptr || due > std::chrono::steady_clock::now()) {
      // Ends with a new call (it may be due first), the due time, or stop. The predicate is what
      // lets a notify end it: the stop_token overload waits again on a wake-up whose predicate is
      // false, so an always-false one would sleep through every add() until the due time,
      // forever when none was due.
      const unsigned long seen = added_;
      changed_.wait_until(lock, stop, due, [&] { return added_ != seen; });
      continue;
    }
    renewing_ = due_call;
    lock.unlock();
    due_call->renew_now();
    lock.lock();
    renewing_ = nullptr;
    changed_.notify_all();
  }
}

}  // namespace idem::detail
