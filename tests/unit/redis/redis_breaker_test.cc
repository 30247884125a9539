// The guard's circuit breaker (src/redis/breaker.h), with explicit time points.
#include <gtest/gtest.h>

#include <exception>
#include <stdexcept>

#include "idem/errors.h"
#include "redis/breaker.h"
#include "redis/cluster.h"

namespace idem::detail {
namespace {

using std::chrono::milliseconds;
const CircuitBreaker::Clock::time_point kStart{};

TEST(CircuitBreaker, OpensAfterThresholdConsecutiveFailures) {
  CircuitBreaker breaker({.failure_threshold = 3, .open_for = milliseconds(100)});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(breaker.allow(kStart));
    breaker.on_failure(kStart);
  }
  EXPECT_EQ(breaker.state(kStart), BreakerState::kClosed);
  breaker.on_failure(kStart);
  EXPECT_EQ(breaker.state(kStart), BreakerState::kOpen);
  EXPECT_FALSE(breaker.allow(kStart + milliseconds(99)));
}

TEST(CircuitBreaker, ASuccessResetsTheCount) {
  CircuitBreaker breaker({.failure_threshold = 2, .open_for = milliseconds(100)});
  breaker.on_failure(kStart);
  breaker.on_success();
  breaker.on_failure(kStart);
  EXPECT_EQ(breaker.state(kStart), BreakerState::kClosed);
}

TEST(CircuitBreaker, AfterTheCoolDownExactlyOneProbeGoes) {
  CircuitBreaker breaker({.failure_threshold = 1, .open_for = milliseconds(100)});
  breaker.on_failure(kStart);
  const auto later = kStart + milliseconds(100);
  EXPECT_EQ(breaker.state(later), BreakerState::kHalfOpen);
  EXPECT_TRUE(breaker.allow(later));
  EXPECT_FALSE(breaker.allow(later));
  EXPECT_EQ(breaker.state(later), BreakerState::kHalfOpen);
}

TEST(CircuitBreaker, ProbeSuccessClosesProbeFailureReopens) {
  CircuitBreaker breaker({.failure_threshold = 5, .open_for = milliseconds(100)});
  for (int i = 0; i < 5; ++i) breaker.on_failure(kStart);
  auto now = kStart + milliseconds(100);
  ASSERT_TRUE(breaker.allow(now));
  breaker.on_failure(now);  // one failure in half-open is enough
  EXPECT_EQ(breaker.state(now), BreakerState::kOpen);
  EXPECT_FALSE(breaker.allow(now + milliseconds(99)));
  now += milliseconds(100);
  ASSERT_TRUE(breaker.allow(now));
  breaker.on_success();
  EXPECT_EQ(breaker.state(now), BreakerState::kClosed);
  EXPECT_TRUE(breaker.allow(now));
}

TEST(CircuitBreaker, ThresholdZeroNeverOpens) {
  CircuitBreaker breaker({.failure_threshold = 0, .open_for = milliseconds(100)});
  for (int i = 0; i < 100; ++i) breaker.on_failure(kStart);
  EXPECT_TRUE(breaker.allow(kStart));
  EXPECT_EQ(breaker.state(kStart), BreakerState::kClosed);
}

// The one rule both drivers count a call's end by: any answer from Redis (an error reply, a
// redirection) is a success, a retryable error a failure, and a cancellation (the async
// driver's) nothing unless it ended the half-open probe.
TEST(CircuitBreaker, RecordCountsAnswersAsSuccessesRetryableErrorsAsFailuresAndCancelsAsNothing) {
  const auto of = [](auto error) { return std::make_exception_ptr(error); };
  CircuitBreaker breaker({.failure_threshold = 2, .open_for = milliseconds(100)});
  breaker.record(of(RedisError("connection lost", true)), kStart);
  breaker.record(of(Cancelled("stopped")), kStart);
  breaker.record(of(Cancelled("stopped")), kStart);
  EXPECT_EQ(breaker.state(kStart), BreakerState::kClosed) << "a cancellation counted";
  breaker.record(of(RedisError("WRONGTYPE", false)), kStart);  // an answer: the count restarts
  breaker.record(of(RedisError("timeout", true)), kStart);
  EXPECT_EQ(breaker.state(kStart), BreakerState::kClosed);
  breaker.record(of(RedirectError("MOVED", Redirect{})), kStart);  // retryable, but an answer
  breaker.record(of(std::runtime_error("anything else")), kStart);
  EXPECT_EQ(breaker.state(kStart), BreakerState::kClosed);
  breaker.record(of(RedisError("timeout", true)), kStart);
  EXPECT_EQ(breaker.state(kStart), BreakerState::kOpen);

  const auto later = kStart + milliseconds(100);
  ASSERT_TRUE(breaker.allow(later));  // the half-open probe, then cancelled
  breaker.record(of(Cancelled("stopped")), later);
  EXPECT_EQ(breaker.state(later), BreakerState::kOpen) << "a cancelled probe left it waiting";
  breaker.record(nullptr, later);
  EXPECT_EQ(breaker.state(later), BreakerState::kClosed);
}

}  // namespace
}  // namespace idem::detail
