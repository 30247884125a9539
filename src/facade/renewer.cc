#include "facade/renewer.h"

#include <chrono>

namespace idem::detail {

Renewer::~Renewer() {
  std::vector<std::jthread> threads;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::jthread& thread : threads) thread.request_stop();
  for (std::jthread& thread : threads) thread.join();
}

void Renewer::start_thread() {
  threads_.emplace_back([this](std::stop_token stop) { loop(stop); });
}

void Renewer::add(Renewable& call) {
  std::lock_guard lock(mutex_);
  if (threads_.empty() && !stopping_) start_thread();
  calls_.insert(&call);
  ++changes_;
  changed_.notify_all();
}

void Renewer::remove(Renewable& call) {
  std::unique_lock lock(mutex_);
  calls_.erase(&call);
  changed_.wait(lock, [&] { return !renewing_.contains(&call); });
}

void Renewer::loop(const std::stop_token& stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    Renewable* due_call = nullptr;
    auto due = PlanTime::max();
    for (Renewable* call : calls_) {
      if (renewing_.contains(call)) continue;
      if (const auto at = call->renewal_due(); at && *at < due) {
        due = *at;
        due_call = call;
      }
    }
    if (due_call == nullptr || due > std::chrono::steady_clock::now()) {
      // Ends with a change (a new call may be due first), the due time, or stop. The predicate is
      // what lets a notify end it: the stop_token overload waits again on a wake-up whose
      // predicate is false, so an always-false one would sleep through every add() until the due
      // time, forever when none was due.
      const unsigned long seen = changes_;
      changed_.wait_until(lock, stop, due, [&] { return changes_ != seen; });
      continue;
    }
    renewing_.insert(due_call);
    // No thread free now: the next call due gets one of its own.
    if (renewing_.size() == threads_.size() && threads_.size() < kMaxThreads && !stopping_) {
      start_thread();
    }
    lock.unlock();
    due_call->renew_now();
    lock.lock();
    renewing_.erase(due_call);
    ++changes_;
    changed_.notify_all();
  }
}

}  // namespace idem::detail
