// The blocking Redis guard over TLS (`rediss://`, src/redis/tls_transport.h) against a private
// `redis-server --tls-port` with a throwaway CA: claims, pipelined batches, verification
// failures, and a stopped server that ends at the command timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis_server.h"
#include "tls_certs.h"
#include "tls_front.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

class RedisTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = std::make_unique<test::TestCertificates>();
    tls_port_ = test::free_port();
    server_ = std::make_unique<test::RedisServer>(
        false, std::vector<std::string>{"--tls-port", std::to_string(tls_port_), "--tls-cert-file",
                                        certs_->server_cert(), "--tls-key-file",
                                        certs_->server_key(), "--tls-ca-cert-file",
                                        certs_->ca_file(), "--tls-auth-clients", "no"});
  }
  static void TearDownTestSuite() {
    server_.reset();
    certs_.reset();
  }
  static std::string url(const std::string& query) {
    return "rediss://127.0.0.1:" + std::to_string(tls_port_) + "/0?" + query;
  }
  static RedisGuardOptions options(const std::string& query) {
    RedisGuardOptions options;
    options.redis.url = url(query);
    options.redis.command_timeout = 300ms;
    options.breaker.failure_threshold = 0;
    options.prefix = "tls";
    return options;
  }

  static inline std::unique_ptr<test::TestCertificates> certs_;
  static inline std::unique_ptr<test::RedisServer> server_;
  static inline int tls_port_ = 0;
};

TEST_F(RedisTlsTest, ClaimCompleteAndReplayOverTls) {
  RedisGuard guard(options("ca_file=" + certs_->ca_file()));
  const ClaimResult first = guard.claim("u1:refund:o1", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard.complete("u1:refund:o1", first.owner_token, "done"));
  const ClaimResult again = guard.claim("u1:refund:o1", "req-2", "fp");
  EXPECT_EQ(again.status, ClaimStatus::kRepeatOther);
  EXPECT_EQ(again.response, "done");
  // The record is on the server (read through its plain port).
  EXPECT_NE(server_->cli({"KEYS", "tls:*"}), "");
}

// A pooled TLS connection the server closed (a restart, an idle timeout, CLIENT KILL) costs the
// next call nothing: the guard retries it once on a new connection. (CLIENT KILL reads as an end
// of stream; that a reset counts as a close too is RedisErrors'
// AsioResetsAndBrokenPipesAreTheServerClosing.)
TEST_F(RedisTlsTest, APooledConnectionTheServerClosedIsRetriedOnANewOne) {
  RedisGuardOptions one = options("ca_file=" + certs_->ca_file());
  one.redis.pool_size = 1;
  RedisGuard guard(one);
  for (int round = 0; round < 20; ++round) {
    const std::string key = "u6:refund:o" + std::to_string(round);
    ASSERT_EQ(guard.claim(key, "req-1", "").status, ClaimStatus::kFirst);
    (void)server_->cli({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
    const ClaimResult again = guard.claim(key, "req-2", "");
    EXPECT_EQ(again.status, ClaimStatus::kRepeatOther) << "round " << round;
  }
}

// The same behind a TLS terminator (stunnel) when the server behind it restarts: the front sends
// a close_notify alert and waits for the client's before it closes, so the pooled connection
// still looks open. The claim written into it ends at that alert, as a close, and runs again on a
// new connection.
TEST_F(RedisTlsTest, APooledConnectionBehindATlsFrontIsRetriedOnANewOneAfterARestart) {
  test::RedisServer plain;
  const test::TlsFront front(*certs_, plain.port());
  RedisGuardOptions one = options("ca_file=" + certs_->ca_file());
  one.redis.url =
      "rediss://127.0.0.1:" + std::to_string(front.port()) + "/0?ca_file=" + certs_->ca_file();
  one.redis.pool_size = 1;
  RedisGuard guard(one);
  for (int round = 0; round < 3; ++round) {
    const std::string key = "u7:refund:o" + std::to_string(round);
    ASSERT_EQ(guard.claim(key, "req-1", "").status, ClaimStatus::kFirst) << "round " << round;
    plain.restart();                     // not persistent: the claim is gone with it
    std::this_thread::sleep_for(100ms);  // the front's alert reaches the pooled connection
    EXPECT_EQ(guard.claim(key, "req-2", "").status, ClaimStatus::kFirst) << "round " << round;
  }
}

TEST_F(RedisTlsTest, PipelinedBatchOverTls) {
  RedisGuard guard(options("ca_file=" + certs_->ca_file()));
  std::vector<std::string> keys;
  std::vector<ClaimRequest> requests;
  for (int i = 0; i < 50; ++i) keys.push_back("u2:batch:" + std::to_string(i));
  for (const std::string& key : keys) requests.push_back({key, "req-b", ""});
  const std::vector<ClaimResult> results = guard.claim_batch(requests);
  ASSERT_EQ(results.size(), 50u);
  for (const ClaimResult& result : results) EXPECT_EQ(result.status, ClaimStatus::kFirst);
}

TEST_F(RedisTlsTest, ServerSignedByAnotherCaIsRefused) {
  RedisGuard guard(options("ca_file=" + certs_->other_ca_file()));
  try {
    (void)guard.claim("u3:x:y", "req-1", "");
    FAIL() << "an untrusted certificate must be refused";
  } catch (const RedisError& error) {
    EXPECT_FALSE(error.retryable()) << error.what();
    EXPECT_NE(std::string(error.what()).find("TLS"), std::string::npos) << error.what();
  }
}

TEST_F(RedisTlsTest, CertificateForAnotherNameIsRefused) {
  RedisGuard guard(options("ca_file=" + certs_->ca_file() + "&server_name=redis.example"));
  EXPECT_THROW((void)guard.claim("u4:x:y", "req-1", ""), RedisError);
  // verify=none skips the check (tests only).
  RedisGuard unchecked(options("verify=none&server_name=redis.example"));
  EXPECT_EQ(unchecked.claim("u4:x:y", "req-1", "").status, ClaimStatus::kFirst);
}

// redis-server closes, unanswered, a connection whose first bytes are not a TLS handshake: the
// error names the likely cause.
TEST_F(RedisTlsTest, PlainRedisUrlOnTheTlsPortFailsSayingToUseRediss) {
  RedisGuardOptions plain = options("");
  plain.redis.url = "redis://127.0.0.1:" + std::to_string(tls_port_) + "/0";
  RedisGuard guard(plain);
  try {
    (void)guard.claim("u5:x:y", "req-1", "");
    ADD_FAILURE() << "a TLS port answered a plaintext claim";
  } catch (const RedisError& error) {
    EXPECT_NE(std::string(error.what()).find("use a rediss:// URL"), std::string::npos)
        << error.what();
  }
}

TEST_F(RedisTlsTest, StoppedServerEndsAtTheCommandTimeout) {
  RedisGuard guard(options("ca_file=" + certs_->ca_file()));
  ASSERT_EQ(guard.claim("u6:x:y", "req-1", "").status, ClaimStatus::kFirst);
  server_->pause();
  const auto started = std::chrono::steady_clock::now();
  try {
    (void)guard.claim("u6:x:z", "req-1", "");
    ADD_FAILURE() << "a stopped server must time out";
  } catch (const RedisError& error) {
    EXPECT_TRUE(error.retryable()) << error.what();
  }
  const auto waited = std::chrono::steady_clock::now() - started;
  server_->resume();
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 2000ms);
  // The timed-out connection was dropped: the next claim gets its own answer.
  EXPECT_EQ(guard.claim("u6:x:y", "req-1", "").status, ClaimStatus::kRepeatSame);
}

}  // namespace
}  // namespace idem
