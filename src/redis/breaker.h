// The guard's circuit breaker (see idem::CircuitBreakerOptions). Thread-safe. Time is passed
// in, so the logic is unit-tested without sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
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
  /// How a call sent to Redis ended, counted by the one rule both drivers follow: null (it
  /// succeeded), any answer from the server (a non-retryable RedisError such as an error reply,
  /// a MOVED/ASK redirection) a success; idem::Cancelled nothing (Redis was not heard), but a
  /// half-open probe cancelled counts as failed, so that the breaker does not wait for it; any
  /// other error (a retryable RedisError: connection lost, timeout) a failure.
  void record(const std::exception_ptr& error, Clock::time_point now);

  [[nodiscard]] BreakerState state(Clock::time_point now) const;

 private:
  const CircuitBreakerOptions options_;
  mutable std::mutex mutex_;
  BreakerState state_ = BreakerState::kClosed;
  std::uint32_t failures_ = 0;
  Clock::time_point open_until_{};
};

}  // namespace idem::detail
