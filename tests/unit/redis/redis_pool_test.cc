// The blocking connection pool (src/redis/pool.h) without a server: what it throws while no
// connection can be made.
#include <gtest/gtest.h>

#include <chrono>

#include "idem/errors.h"
#include "redis/pool.h"
#include "redis/url.h"

namespace idem::detail {
namespace {

// Regression: during the reconnect backoff the pool threw copies of its last connect error, and
// a copied std::runtime_error shares its message buffer with the original (libstdc++'s
// reference-counted string). Threads that never shared an exception object shared that buffer,
// and when a Sentinel failover replaced the master's Node (and its pool) on the helper thread
// while a caller's thread read what(), ThreadSanitizer reported a data race (the count lives in
// the uninstrumented libstdc++). Each error thrown now has a message of its own.
TEST(RedisPool, ErrorsThrownDuringTheReconnectBackoffShareNoMessageBuffer) {
  PoolSettings settings;
  settings.connection.endpoint = parse_redis_url("redis://127.0.0.1:1/0");  // refused
  settings.reconnect_backoff = std::chrono::seconds(10);
  settings.reconnect_backoff_max = std::chrono::seconds(10);
  Pool pool(settings);
  EXPECT_THROW((void)pool.borrow(), RedisError);  // connects, fails, keeps the error
  try {
    (void)pool.borrow();
    FAIL() << "the backoff must throw the last connect error";
  } catch (const RedisError& first) {
    try {
      (void)pool.borrow();
      FAIL() << "the backoff must throw the last connect error";
    } catch (const RedisError& second) {
      EXPECT_STREQ(first.what(), second.what());
      EXPECT_NE(first.what(), second.what()) << "two errors thrown share one message buffer";
      EXPECT_TRUE(second.retryable());
    }
  }
}

}  // namespace
}  // namespace idem::detail
