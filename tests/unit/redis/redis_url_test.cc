// RedisOptions::url parsing (src/redis/url.h).
#include <gtest/gtest.h>

#include "idem/errors.h"
#include "redis/url.h"

namespace idem::detail {
namespace {

TEST(RedisUrl, HostPortAndDatabase) {
  const RedisEndpoint endpoint = parse_redis_url("redis://10.0.0.5:6380/4");
  EXPECT_EQ(endpoint.host, "10.0.0.5");
  EXPECT_EQ(endpoint.port, 6380);
  EXPECT_EQ(endpoint.db, 4);
  EXPECT_TRUE(endpoint.socket_path.empty());
  EXPECT_TRUE(endpoint.password.empty());
}

TEST(RedisUrl, DefaultsArePort6379AndDatabase0) {
  const RedisEndpoint endpoint = parse_redis_url("redis://cache.local");
  EXPECT_EQ(endpoint.host, "cache.local");
  EXPECT_EQ(endpoint.port, 6379);
  EXPECT_EQ(endpoint.db, 0);
  EXPECT_EQ(parse_redis_url("redis://cache.local/").db, 0);
}

TEST(RedisUrl, UserAndPercentDecodedPassword) {
  const RedisEndpoint endpoint = parse_redis_url("redis://app:p%40ss%3Aw@localhost:7000/1");
  EXPECT_EQ(endpoint.user, "app");
  EXPECT_EQ(endpoint.password, "p@ss:w");
  EXPECT_EQ(endpoint.host, "localhost");
  EXPECT_EQ(endpoint.port, 7000);
}

TEST(RedisUrl, ErrorMessagesNeverCarryThePassword) {
  try {
    (void)parse_redis_url("redis://app:S3CRETPW@127.0.0.1:99999/0");
    FAIL() << "a port over 65535 must be rejected";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("S3CRETPW"), std::string::npos) << what;
    EXPECT_NE(what.find("redis://***@127.0.0.1:99999/0"), std::string::npos) << what;
  }
}

TEST(RedisUrl, PasswordOnly) {
  const RedisEndpoint endpoint = parse_redis_url("redis://:secret@localhost");
  EXPECT_TRUE(endpoint.user.empty());
  EXPECT_EQ(endpoint.password, "secret");
  EXPECT_EQ(parse_redis_url("redis://secret@localhost").password, "secret");
}

TEST(RedisUrl, BracketedIpv6Host) {
  const RedisEndpoint endpoint = parse_redis_url("redis://[::1]:6390/2");
  EXPECT_EQ(endpoint.host, "::1");
  EXPECT_EQ(endpoint.port, 6390);
  EXPECT_EQ(endpoint.db, 2);
}

TEST(RedisUrl, UnixSocketWithDatabase) {
  const RedisEndpoint endpoint = parse_redis_url("unix:///run/redis/redis.sock?db=5");
  EXPECT_EQ(endpoint.socket_path, "/run/redis/redis.sock");
  EXPECT_EQ(endpoint.db, 5);
  EXPECT_TRUE(endpoint.host.empty());
}

TEST(RedisUrl, MalformedUrlsAreConfigErrors) {
  for (const char* bad :
       {"http://localhost", "redis://", "redis://:6379", "redis://host:port", "redis://host:0",
        "redis://host:70000", "redis://host/db", "redis://host/-1", "redis://[::1",
        "redis://p%4@host", "unix://", "unix:///s.sock?timeout=1", "localhost:6379"}) {
    EXPECT_THROW((void)parse_redis_url(bad), ConfigError) << bad;
  }
}

}  // namespace
}  // namespace idem::detail
