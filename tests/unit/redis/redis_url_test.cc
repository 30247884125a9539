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

// Lettuce's Sentinel URI: redis-sentinel://[[user:]password@]host1[:port1][,host2[:port2]]
// [/database][?sentinelMasterId=name] or ...#name; Sentinels default to port 26379.
TEST(RedisUrl, SentinelListMasterNameAndMasterCredentials) {
  const RedisEndpoint endpoint =
      parse_redis_url("redis-sentinel://app:pw@10.0.0.1,10.0.0.2:26380,[::1]:5000/3#orders");
  ASSERT_EQ(endpoint.sentinels.size(), 3U);
  EXPECT_EQ(endpoint.sentinels[0], (HostPort{"10.0.0.1", 26379}));
  EXPECT_EQ(endpoint.sentinels[1], (HostPort{"10.0.0.2", 26380}));
  EXPECT_EQ(endpoint.sentinels[2], (HostPort{"::1", 5000}));
  EXPECT_EQ(endpoint.sentinel_master, "orders");
  EXPECT_EQ(endpoint.user, "app");
  EXPECT_EQ(endpoint.password, "pw");
  EXPECT_EQ(endpoint.db, 3);
  EXPECT_TRUE(endpoint.host.empty());  // the master is discovered
}

TEST(RedisUrl, SentinelMasterIdAsQueryParameter) {
  const RedisEndpoint endpoint =
      parse_redis_url("redis-sentinel://s1:26379?sentinelMasterId=my%20master");
  ASSERT_EQ(endpoint.sentinels.size(), 1U);
  EXPECT_EQ(endpoint.sentinel_master, "my master");
  EXPECT_EQ(endpoint.db, 0);
  // A '#' or '?' inside the (escaped or not) password does not end the authority.
  EXPECT_EQ(parse_redis_url("redis-sentinel://:p#w?x@s1#m").password, "p#w?x");
}

TEST(RedisUrl, PlainUrlsHaveNoSentinels) {
  EXPECT_TRUE(parse_redis_url("redis://h:1/0").sentinels.empty());
  EXPECT_TRUE(parse_redis_url("unix:///s.sock").sentinels.empty());
}

TEST(RedisUrl, MalformedSentinelUrlsAreConfigErrors) {
  for (const char* bad :
       {"redis-sentinel://s1:26379", "redis-sentinel://s1#", "redis-sentinel://#m",
        "redis-sentinel://s1,#m", "redis-sentinel://s1:0#m", "redis-sentinel://s1?timeout=5#m",
        "redis-sentinel://s1?sentinelMasterId=a#b", "redis-sentinel://s1?sentinelMasterId=a&x=1",
        "redis-sentinel://s1/x#m", "redis+sentinel://s1#m"}) {
    EXPECT_THROW((void)parse_redis_url(bad), ConfigError) << bad;
  }
}

TEST(RedisUrl, MalformedUrlsAreConfigErrors) {
  for (const char* bad :
       {"http://localhost", "redis://", "redis://:6379", "redis://host:port", "redis://host:0",
        "redis://host:70000", "redis://host/db", "redis://host/-1", "redis://[::1",
        "redis://p%4@host", "unix://", "unix:///s.sock?timeout=1", "localhost:6379"}) {
    EXPECT_THROW((void)parse_redis_url(bad), ConfigError) << bad;
  }
}

// A query or fragment on a redis:// URL was read as part of the database number ("db must be a
// number"), which pointed at the wrong part of the URL.
TEST(RedisUrl, AQueryOrFragmentIsNamedNotReadAsTheDatabase) {
  for (const char* bad : {"redis://h:6379/0?foo=bar", "redis://h:6379/0#frag", "redis://h?x=1",
                          "rediss://h/0#frag"}) {
    try {
      (void)parse_redis_url(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).find("db must be"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("fragment"), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(parse_redis_url("redis://:p%3Fw@h/1").password, "p?w");
}

TEST(RedisUrl, RedissIsTlsWithItsFilesAndServerName) {
  const RedisEndpoint endpoint = parse_redis_url(
      "rediss://app:pw@cache.example:6380/2?ca_file=%2Fetc%2Fca.pem&cert_file=/c.pem"
      "&key_file=/k.pem&server_name=redis.internal");
  EXPECT_TRUE(endpoint.tls);
  EXPECT_EQ(endpoint.host, "cache.example");
  EXPECT_EQ(endpoint.port, 6380);
  EXPECT_EQ(endpoint.db, 2);
  EXPECT_EQ(endpoint.password, "pw");
  EXPECT_EQ(endpoint.tls_ca_file, "/etc/ca.pem");
  EXPECT_EQ(endpoint.tls_cert_file, "/c.pem");
  EXPECT_EQ(endpoint.tls_key_file, "/k.pem");
  EXPECT_EQ(endpoint.tls_server_name, "redis.internal");
  EXPECT_TRUE(endpoint.tls_verify);
  EXPECT_FALSE(parse_redis_url("redis://h/0").tls);
  EXPECT_FALSE(parse_redis_url("rediss://h?verify=none").tls_verify);
  EXPECT_TRUE(parse_redis_url("rediss://h").tls_ca_file.empty());
}

TEST(RedisUrl, BadTlsParametersAreConfigErrors) {
  EXPECT_THROW((void)parse_redis_url("rediss://h?cafile=/x"), ConfigError);
  EXPECT_THROW((void)parse_redis_url("rediss://h?verify=maybe"), ConfigError);
  EXPECT_THROW((void)parse_redis_url("rediss://h?ca_file"), ConfigError);
  EXPECT_THROW((void)parse_redis_url("rediss://h?cert_file=/c.pem"), ConfigError);  // no key
  EXPECT_THROW((void)parse_redis_url("redis://h:6379?ca_file=/x"), ConfigError);    // not TLS
}

}  // namespace
}  // namespace idem::detail
