// The blocking connection pool (src/redis/pool.h) without a server: what it throws while no
// connection can be made.
#include <gtest/gtest.h>

#include <chrono>

#include "idem/errors.h"
#include "redis/pool.h"
#include "redis/url.h"

namespace idem::detail {
namespace {

// During the reconnect backoff the pool throws its last connect error again, each time with a
// message buffer of its own: a copied std::runtime_error would share the original's
// (libstdc++'s reference-counted string), so threads that share no exception object would share
// that buffer, and when a Sentinel failover replaces the master's Node (and its pool) on the
// helper thread while a caller reads what(), ThreadSanitizer sees a data race (the count lives
// in the uninstrumented libstdc++).
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
