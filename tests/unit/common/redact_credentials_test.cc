// idem::redact_credentials and the messages that pass through it: no password of a Redis URL or
// a PostgreSQL connection string reaches an error message, also for malformed ones.
#include <gtest/gtest.h>

#include <string>

#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem {
namespace {

TEST(RedactCredentials, HidesTheUserinfoOfUrls) {
  EXPECT_EQ(redact_credentials("redis://:S3cret@127.0.0.1:6379/0"), "redis://***@127.0.0.1:6379/0");
  EXPECT_EQ(redact_credentials("rediss://user:S3cret@h:6380"), "rediss://***@h:6380");
  EXPECT_EQ(redact_credentials("postgresql://u:pw@h/db?password=x&sslmode=require"),
            "postgresql://***@h/db?password=***&sslmode=require");
}

// A malformed URL ("redis:/", no "//") or a password holding '/' loses its password too: a
// redaction that looks for "://" and stops at the first '/' would keep it.
TEST(RedactCredentials, MalformedUrlsAndPasswordsWithSlashesAreHiddenToo) {
  EXPECT_EQ(redact_credentials("redis:/:S3cretPW@127.0.0.1:1/0"), "redis:***@127.0.0.1:1/0");
  EXPECT_EQ(redact_credentials("redis://:pa/ssS3cret@127.0.0.1:1/0"), "redis://***@127.0.0.1:1/0");
  EXPECT_EQ(redact_credentials("user:S3cret@host"), "user:***@host");
  EXPECT_EQ(redact_credentials(R"(missing "=" after "postgres:/postgres:S3cretPW@127.0.0.1/idem")"),
            R"(missing "=" after "postgres:***@127.0.0.1/idem")");
}

TEST(RedactCredentials, HidesPasswordKeywordValues) {
  EXPECT_EQ(redact_credentials("host=h password=S3cret dbname=d"), "host=h password=*** dbname=d");
  EXPECT_EQ(redact_credentials("password='a b\\' c' host=h"), "password=*** host=h");
  EXPECT_EQ(redact_credentials("password="), "password=***");
}

// libpq accepts blanks around the '=' of a keyword: `password = S3cret` reached messages as is.
TEST(RedactCredentials, HidesAPasswordWithBlanksAroundTheEqualsSign) {
  EXPECT_EQ(redact_credentials("host=h password = S3cret bogus=1"),
            "host=h password = *** bogus=1");
  EXPECT_EQ(redact_credentials("host=h\tpassword\t=\tS3cret x"), "host=h\tpassword\t=\t*** x");
  EXPECT_EQ(redact_credentials("sslpassword =  'k e y' host=h"), "sslpassword =  *** host=h");
  EXPECT_EQ(redact_credentials("the password is fine"), "the password is fine");
}

TEST(RedactCredentials, LeavesTextWithoutCredentialsAlone) {
  for (const char* text : {"redis://127.0.0.1:6379/0", "unix:///tmp/redis.sock", "host=h port=5",
                           "connection refused", ""}) {
    EXPECT_EQ(redact_credentials(text), text);
  }
}

TEST(RedactCredentials, BadRedisUrlMessagesCarryNoPassword) {
  for (const char* url : {"redis:/:S3cretPW@127.0.0.1:1/0", "redis://:S3cretPW@127.0.0.1:99999/0",
                          "redis://:pa/S3cretPW@127.0.0.1:1/x", "http://u:S3cretPW@h/0"}) {
    RedisGuardOptions options;
    options.redis.url = url;
    try {
      RedisGuard guard(options);
      ADD_FAILURE() << "no ConfigError for " << url;
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).find("S3cretPW"), std::string::npos) << error.what();
    }
  }
}

// libpq refuses `PASSWORD=` (its keywords are lower case), and the message quoting the string
// showed the value in clear.
TEST(RedactCredentials, HidesAPasswordKeywordInAnyCase) {
  EXPECT_EQ(redact_credentials("PASSWORD=LeakMe9 host=db user=u"), "PASSWORD=*** host=db user=u");
  EXPECT_EQ(redact_credentials("host=db Password = 'a b' user=u"), "host=db Password = *** user=u");
}

TEST(RedactCredentials, MalformedPostgresConnectionStringsCarryNoPassword) {
  for (const char* conninfo : {"postgres:/postgres:S3cretPW@127.0.0.1/idem",
                               "host=127.0.0.1 port=1 password=S3cretPW connect_timeout=1 x"}) {
    PgSinkOptions options;
    options.conninfo = conninfo;
    try {
      PgSink sink(options);  // libpq cannot parse either: a ConfigError before any connection
      ADD_FAILURE() << "no ConfigError for " << conninfo;
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).find("S3cretPW"), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace idem
