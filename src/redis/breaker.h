// The guard's circuit breaker (see idem::CircuitBreakerOptions). Thread-safe. Time is passed
// in, so the logic is unit-tested without sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

#include "idem/redis_guard.h"

namespace idem::detail {

class CircuitBreaker {
 public:
  using Clock = std::chrono::steady_clock;

  explicit CircuitBreaker(CircuitBreakerOptions options) : options_(options) {}

  /// Whether a call may go to Redis now. In kOpen after the cool-down, the first caller becomes
  /// the half-open probe (true) and everyone else gets false until it reports.
  [[nodiscard]] bool allow(Clock::time_point now);
  /// The call went through (Redis answered, even with a non-retryable error reply).
  void on_success();
  /// The call failed with a retryable error.
  void on_failure(Clock::time_point now);

  [[nodiscard]] BreakerState state(Clock::time_point now) const;

 private:
  const CircuitBreakerOptions options_;
  mutable std::mutex mutex_;
  BreakerState state_ = BreakerState::kClosed;
  std::uint32_t failures_ = 0;
  Clock::time_point open_until_{};
};

}  // namespace idem::detail
