// Millisecond time sources for the request-ID generators and the local cache, injectable so
// tests can step time forwards and backwards without sleeping.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "idem/export.h"

namespace idem {

/// A source of time in milliseconds. Implementations are thread-safe.
class IDEM_EXPORT Clock {
 public:
  virtual ~Clock() = default;

  /// Current time in ms: since the Unix epoch for system_clock(), since an unspecified
  /// point for steady_clock().
  [[nodiscard]] virtual std::int64_t now_ms() noexcept = 0;

  /// Blocks until now_ms() >= target_ms, or until about `target_ms - now_ms()` + 1 ms of real
  /// time have passed (a clock that steps back while waiting does not hold the caller
  /// forever). Returns now_ms(). The default spins with yields in the last millisecond and
  /// sleeps before that.
  virtual std::int64_t wait_until_ms(std::int64_t target_ms) noexcept;
};

/// The wall clock (std::chrono::system_clock), ms since the Unix epoch. It may step backwards
/// (NTP, manual changes). One shared instance.
[[nodiscard]] IDEM_EXPORT std::shared_ptr<Clock> system_clock();

/// The monotonic clock (std::chrono::steady_clock), in ms. One shared instance.
[[nodiscard]] IDEM_EXPORT std::shared_ptr<Clock> steady_clock();

/// A clock that only moves when told, for tests. wait_until_ms() jumps straight to the
/// target (as if the time had passed) and counts the waits. Thread-safe.
class IDEM_EXPORT ManualClock final : public Clock {
 public:
  /// Starts at `start_ms`.
  explicit ManualClock(std::int64_t start_ms = 0) noexcept : now_(start_ms) {}

  [[nodiscard]] std::int64_t now_ms() noexcept override { return now_.load(); }
  std::int64_t wait_until_ms(std::int64_t target_ms) noexcept override;

  /// Sets the time, forwards or backwards.
  void set_ms(std::int64_t ms) noexcept { now_.store(ms); }
  /// Moves the time by `delta_ms` (negative steps back).
  void advance_ms(std::int64_t delta_ms) noexcept { now_.fetch_add(delta_ms); }
  /// How many times wait_until_ms() was called with a target in the future.
  [[nodiscard]] std::int64_t waits() const noexcept { return waits_.load(); }

 private:
  std::atomic<std::int64_t> now_;
  std::atomic<std::int64_t> waits_{0};
};

}  // namespace idem
