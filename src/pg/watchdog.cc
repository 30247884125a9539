#include "pg/watchdog.h"

#include <sys/socket.h>

#include <algorithm>
#include <limits>
#include <string>

namespace idem::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

PgWatchdog::PgWatchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {
  if (timeout_.count() == 0) return;
  chunks_ = std::make_unique<std::atomic<Chunk*>[]>(kChunks);
  thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
}

PgWatchdog::~PgWatchdog() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  if (chunks_ == nullptr) return;
  for (std::size_t i = 0; i < kChunks; ++i) delete chunks_[i].load(std::memory_order_relaxed);
}

PgWatchdog::Slot& PgWatchdog::slot_for(int socket) {
  const auto index = static_cast<std::size_t>(socket);
  const std::size_t chunk = index >> kSlotBits;
  if (chunk >= kChunks) {
    throw PostgresError("idem: postgres: socket number " + std::to_string(socket) +
                            " is beyond what the response watchdog tracks (2^22)",
                        false);
  }
  Chunk* slots = chunks_[chunk].load(std::memory_order_acquire);
  if (slots == nullptr) {
    const std::lock_guard lock(mutex_);
    slots = chunks_[chunk].load(std::memory_order_relaxed);
    if (slots == nullptr) {
      slots = new Chunk();
      chunks_[chunk].store(slots, std::memory_order_release);
    }
  }
  return (*slots)[index & (kChunkSlots - 1)];
}

PgWatchdog::Slot& PgWatchdog::watch(int socket) {
  Slot& slot = slot_for(socket);
  const int depth = slot.depth.load(std::memory_order_relaxed);
  slot.depth.store(depth + 1, std::memory_order_relaxed);
  if (depth > 0) return slot;  // nested: the outer call's deadline bounds the socket
  slot.state.store(deadline_from_now(), std::memory_order_seq_cst);
  // The helper found no call to watch and waits: wake it. Either it sees this deadline when it
  // looks once more after raising idle_, or this sees idle_ raised (both are seq_cst).
  if (idle_.load(std::memory_order_seq_cst) && idle_.exchange(false)) {
    const std::lock_guard lock(mutex_);
    woken_ = true;
    wake_.notify_one();
  }
  return slot;
}

bool PgWatchdog::unwatch(Slot& slot) noexcept {
  const int depth = slot.depth.load(std::memory_order_relaxed) - 1;
  slot.depth.store(depth, std::memory_order_relaxed);
  const bool outermost = depth == 0;
  for (;;) {
    std::int64_t state = slot.state.load(std::memory_order_acquire);
    if (state == kFiring) {  // a shutdown in progress: wait it out, it is one system call
      std::this_thread::yield();
      continue;
    }
    if (!outermost) return state == kFired;
    // Only the helper changes a deadline meanwhile (to kFiring): then wait and look again.
    if (slot.state.compare_exchange_weak(state, kIdle, std::memory_order_acq_rel)) {
      return state == kFired;
    }
  }
}

std::int64_t PgWatchdog::deadline_from_now() const {
  const std::int64_t now = now_ns();
  // A timeout past the clock's range (milliseconds::max() meant as "never") saturates instead
  // of overflowing into the past, to a deadline the helper can sleep until.
  const std::int64_t room = kNever - 1 - now;
  if (timeout_ >=
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(room))) {
    return now + room;
  }
  return now + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count();
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

std::int64_t PgWatchdog::sweep(std::int64_t now) {
  std::int64_t next = kNever;
  for (std::size_t chunk = 0; chunk < kChunks; ++chunk) {
    Chunk* slots = chunks_[chunk].load(std::memory_order_acquire);
    if (slots == nullptr) continue;
    for (std::size_t i = 0; i < kChunkSlots; ++i) {
      std::int64_t deadline = (*slots)[i].state.load(std::memory_order_seq_cst);
      if (deadline <= kIdle) continue;
      if (deadline > now) {
        next = std::min(next, deadline);
        continue;
      }
      // Still the same call (its deadline, to the nanosecond): then it cannot end before the
      // shutdown is done, so the socket is still its connection's.
      if ((*slots)[i].state.compare_exchange_strong(deadline, kFiring)) {
        ::shutdown(static_cast<int>((chunk << kSlotBits) | i), SHUT_RDWR);  // recv() returns
        (*slots)[i].state.store(kFired, std::memory_order_release);
      }
    }
  }
  return next;
}

void PgWatchdog::loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::int64_t next = sweep(now_ns());
    if (next == kNever) {
      idle_.store(true, std::memory_order_seq_cst);
      next = sweep(now_ns());  // a call that started before idle_ was raised
      if (next == kNever) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, stop, [&] { return woken_; });
        woken_ = false;
        continue;
      }
      idle_.store(false, std::memory_order_relaxed);
    }
    // Every call has the same timeout, so one that starts meanwhile ends after `next`.
    std::unique_lock lock(mutex_);
    wake_.wait_until(lock, stop, Clock::time_point(std::chrono::nanoseconds(next)),
                     [] { return false; });
  }
}

}  // namespace idem::detail
