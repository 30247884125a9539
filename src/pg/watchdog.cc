#include "pg/watchdog.h"

#include <sys/socket.h>

#include <string>

namespace idem::detail {

PgWatchdog::PgWatchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {
  if (timeout_.count() > 0) thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
}

PgWatchdog::~PgWatchdog() = default;  // thread_ is requested to stop and joined first

std::uint64_t PgWatchdog::watch(int socket) {
  bool wake = false;
  std::uint64_t id = 0;
  {
    const std::lock_guard lock(mutex_);
    wake = waiting_for_work_;
    id = next_id_++;
    watches_.emplace(id, Watch{deadline_from_now(), socket, false});
  }
  // Every watch has the same timeout, so a new one never ends before those the thread already
  // waits for: only a thread waiting with no deadline needs waking.
  if (wake) added_.notify_one();
  return id;
}

std::chrono::steady_clock::time_point PgWatchdog::deadline_from_now() const {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  // A timeout past the clock's range (milliseconds::max() meant as "never") saturates instead
  // of overflowing into the past.
  if (timeout_ >= std::chrono::floor<std::chrono::milliseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout_;
}

bool PgWatchdog::unwatch(std::uint64_t id) {
  const std::lock_guard lock(mutex_);
  const auto found = watches_.find(id);
  const bool fired = found->second.fired;
  watches_.erase(found);
  return fired;
}

void PgWatchdog::throw_timed_out(const pqxx::failure& error) const {
  try {
    throw_translated(error);
  } catch (const PostgresError& translated) {
    const std::string what = "idem: postgres: no answer within response_timeout (" +
                             std::to_string(timeout_.count()) + " ms), connection closed; " +
                             translated.what();
    if (translated.commit_outcome_unknown()) throw CommitOutcomeUnknown(what);
    throw PostgresError(what, translated.retryable(), kConnectionLostSqlstate);
  }
}

void PgWatchdog::loop(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    for (auto& entry : watches_) {
      Watch& watch = entry.second;
      if (watch.fired) continue;
      if (watch.deadline > now) {
        next = watch.deadline;  // the earliest: ids rise with deadlines
        break;
      }
      ::shutdown(watch.socket, SHUT_RDWR);  // the blocked recv() returns; the fd stays open
      watch.fired = true;
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      const std::uint64_t seen = next_id_;
      waiting_for_work_ = true;
      added_.wait(lock, stop, [&] { return next_id_ != seen; });
      waiting_for_work_ = false;
    } else {
      added_.wait_until(lock, stop, next, [] { return false; });
    }
  }
}

}  // namespace idem::detail
