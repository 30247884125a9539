#include "redis/breaker.h"

#include "idem/errors.h"
#include "redis/cluster.h"

namespace idem::detail {

void CircuitBreaker::record(const std::exception_ptr& error, Clock::time_point now) {
  if (!error) return on_success();
  try {
    std::rethrow_exception(error);
  } catch (const RedirectError&) {
    on_success();
  } catch (const Cancelled&) {
    if (state(now) == BreakerState::kHalfOpen) on_failure(now);
  } catch (const RedisError& redis_error) {
    if (redis_error.retryable()) {
      on_failure(now);
    } else {
      on_success();
    }
  } catch (...) {
    on_failure(now);
  }
}

bool CircuitBreaker::allow(Clock::time_point now) {
  if (options_.failure_threshold == 0) return true;
  std::lock_guard lock(mutex_);
  switch (state_) {
    case BreakerState::kClosed:
      return true;
    case BreakerState::kHalfOpen:
      return false;
    case BreakerState::kOpen:
      if (now < open_until_) return false;
      state_ = BreakerState::kHalfOpen;
      return true;
  }
  return false;
}

void CircuitBreaker::on_success() {
  if (options_.failure_threshold == 0) return;
  std::lock_guard lock(mutex_);
  state_ = BreakerState::kClosed;
  failures_ = 0;
}

void CircuitBreaker::on_failure(Clock::time_point now) {
  if (options_.failure_threshold == 0) return;
  std::lock_guard lock(mutex_);
  ++failures_;
  if (state_ == BreakerState::kHalfOpen || failures_ >= options_.failure_threshold) {
    state_ = BreakerState::kOpen;
    open_until_ = now + options_.open_for;
  }
}

BreakerState CircuitBreaker::state(Clock::time_point now) const {
  std::lock_guard lock(mutex_);
  if (state_ == BreakerState::kOpen && now >= open_until_) return BreakerState::kHalfOpen;
  return state_;
}

}  // namespace idem::detail
