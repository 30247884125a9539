// WorkerIdLease against a real redis-server (IDEM_TEST_REDIS_URL), each test with its own key
// prefix.
#include <gtest/gtest.h>

#include <array>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "idem/clock.h"
#include "idem/errors.h"
#include "idem/snowflake.h"
#include "idem/worker_lease.h"
#include "redis/connection.h"
#include "redis/url.h"
#include "redis_server.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem {
namespace {

constexpr std::chrono::milliseconds kTtl{60000};

class WorkerLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
    url_ = url;
    prefix_ = test::unique_name("worker") + ":";
    redis_ = std::make_unique<detail::Connection>(
        detail::ConnectionSettings{.endpoint = detail::parse_redis_url(url_),
                                   .connect_timeout = std::chrono::milliseconds(1000),
                                   .command_timeout = std::chrono::milliseconds(1000),
                                   .keepalive = true});
  }

  WorkerIdLeaseOptions options(std::int32_t worker_id, std::shared_ptr<Clock> clock = nullptr) {
    WorkerIdLeaseOptions o;
    o.redis.url = url_;
    o.worker_id = worker_id;
    o.key_prefix = prefix_;
    o.ttl = kTtl;
    o.renew_interval = kTtl / 2;  // the background renewal never fires during a test
    o.clock = std::move(clock);
    return o;
  }

  // The key's value, or "(nil)".
  std::string get(std::int32_t worker_id) {
    const std::string key = prefix_ + std::to_string(worker_id);
    const auto reply = redis_->command(std::array<std::string_view, 2>{"GET", key});
    return reply->type == REDIS_REPLY_STRING ? std::string(reply->str, reply->len) : "(nil)";
  }

  // Another owner's SET; it expires by itself, so the shared server keeps no garbage.
  void set(std::int32_t worker_id, std::string_view value) {
    const std::string key = prefix_ + std::to_string(worker_id);
    const std::string ttl = std::to_string(kTtl.count());
    (void)redis_->command(std::array<std::string_view, 5>{"SET", key, value, "PX", ttl});
  }

  void del(std::int32_t worker_id) {
    const std::string key = prefix_ + std::to_string(worker_id);
    (void)redis_->command(std::array<std::string_view, 2>{"DEL", key});
  }

  long long pttl(std::int32_t worker_id) {
    const std::string key = prefix_ + std::to_string(worker_id);
    return redis_->command(std::array<std::string_view, 2>{"PTTL", key})->integer;
  }

  std::string url_;
  std::string prefix_;
  std::unique_ptr<detail::Connection> redis_;
};

TEST_F(WorkerLeaseTest, AcquiresAndRefusesASecondOwner) {
  const WorkerIdLease first(options(5));
  EXPECT_TRUE(first.held());
  EXPECT_EQ(first.worker_id(), 5);
  EXPECT_EQ(get(5), first.owner());
  EXPECT_GT(pttl(5), 0);
  EXPECT_LE(pttl(5), kTtl.count());
  EXPECT_THROW(WorkerIdLease(options(5)), ConfigError);
  EXPECT_EQ(get(5), first.owner());
  const WorkerIdLease other_id(options(6));
  EXPECT_TRUE(other_id.held());
}

TEST_F(WorkerLeaseTest, ReleasedOnDestructionAfterTheHandoverMarginSoAnotherProcessCanStart) {
  auto first_options = options(7);
  first_options.handover_margin = std::chrono::milliseconds(200);
  std::string first_owner;
  {
    const WorkerIdLease first(first_options);
    first_owner = first.owner();
  }
  EXPECT_EQ(get(7), first_owner);  // kept for the margin, not deleted
  EXPECT_GT(pttl(7), 0);
  EXPECT_LE(pttl(7), 200);
  auto second_options = options(7);
  second_options.owner = "process-b";
  EXPECT_THROW(WorkerIdLease{second_options}, ConfigError);
  ASSERT_TRUE(test::wait_until(std::chrono::seconds(10), [&] { return get(7) == "(nil)"; }));
  const WorkerIdLease second(second_options);
  EXPECT_EQ(get(7), "process-b");
}

// The lease was deleted on release, so the next holder of the worker ID could start issuing
// IDs within the millisecond of the last one's last ID: the same IDs again (about two
// handovers in three, in one process). Released, the key now stays for handover_margin.
TEST_F(WorkerLeaseTest, AHandoverNeverIssuesAnIdTheLastHolderIssued) {
  std::set<std::uint64_t> issued;
  std::size_t count = 0;
  for (int round = 0; round < 10; ++round) {
    auto lease_options = options(15);
    lease_options.handover_margin = std::chrono::milliseconds(2);
    std::shared_ptr<WorkerIdLease> lease;
    ASSERT_TRUE(test::wait_until(std::chrono::seconds(10), [&] {
      try {
        lease = std::make_shared<WorkerIdLease>(lease_options);
        return true;
      } catch (const ConfigError&) {
        return false;  // the last holder's margin has not passed
      }
    }));
    SnowflakeOptions gen_options;
    gen_options.lease = lease;
    SnowflakeGenerator gen(gen_options);
    for (int i = 0; i < 500; ++i, ++count) issued.insert(gen.next());
  }
  EXPECT_EQ(issued.size(), count);
}

// Two generators on one lease issued the same IDs (half of them).
TEST_F(WorkerLeaseTest, ALeaseServesOneGeneratorASecondIsAConfigError) {
  auto lease = std::make_shared<WorkerIdLease>(options(16));
  SnowflakeOptions gen_options;
  gen_options.lease = lease;
  const SnowflakeGenerator first(gen_options);
  EXPECT_THROW(SnowflakeGenerator{gen_options}, ConfigError);
  gen_options.worker_id = 17;  // refused for its worker ID: the lease stays with the first
  EXPECT_THROW(SnowflakeGenerator{gen_options}, ConfigError);
  EXPECT_EQ(first.worker_id(), 16);
}

TEST_F(WorkerLeaseTest, DestructionNeverDeletesAnotherOwnersKey) {
  {
    const WorkerIdLease lease(options(8));
    set(8, "intruder");
  }
  EXPECT_EQ(get(8), "intruder");
}

TEST_F(WorkerLeaseTest, RenewExtendsAndReacquiresAnExpiredKey) {
  auto clock = std::make_shared<ManualClock>(1000);
  WorkerIdLease lease(options(9, clock));
  EXPECT_EQ(lease.valid_until_ms(), 1000 + kTtl.count());
  clock->advance_ms(500);
  lease.renew();
  EXPECT_EQ(lease.valid_until_ms(), 1500 + kTtl.count());
  del(9);  // as if the key had expired
  lease.renew();
  EXPECT_EQ(get(9), lease.owner());
  EXPECT_TRUE(lease.held());
}

TEST_F(WorkerLeaseTest, LostLeaseStopsTheGeneratorForGood) {
  auto clock = std::make_shared<ManualClock>(1000);
  auto lease = std::make_shared<WorkerIdLease>(options(10, clock));
  SnowflakeOptions gen_options;
  gen_options.epoch = std::chrono::milliseconds(0);
  gen_options.clock = clock;
  gen_options.lease = lease;
  SnowflakeGenerator gen(gen_options);
  EXPECT_EQ(gen.worker_id(), 10);
  EXPECT_EQ(SnowflakeGenerator::decompose(gen.next(), std::chrono::milliseconds(0)).worker_id, 10);
  set(10, "another-process");
  try {
    lease->renew();
    FAIL() << "renewed a lease another owner holds";
  } catch (const RedisError& e) {
    EXPECT_FALSE(e.retryable());
  }
  EXPECT_FALSE(lease->held());
  try {
    (void)gen.next();
    FAIL() << "issued an ID without the lease";
  } catch (const RedisError& e) {
    EXPECT_FALSE(e.retryable());
  }
  EXPECT_THROW(lease->renew(), RedisError);
  EXPECT_EQ(get(10), "another-process");
}

TEST_F(WorkerLeaseTest, UnrenewedLeaseStopsTheGeneratorUntilRenewed) {
  auto clock = std::make_shared<ManualClock>(1000);
  auto lease = std::make_shared<WorkerIdLease>(options(11, clock));
  SnowflakeOptions gen_options;
  gen_options.worker_id = 11;
  gen_options.epoch = std::chrono::milliseconds(0);
  gen_options.clock = clock;
  gen_options.lease = lease;
  SnowflakeGenerator gen(gen_options);
  const std::uint64_t before = gen.next();
  clock->set_ms(1000 + kTtl.count());  // the renewals did not happen
  try {
    (void)gen.next();
    FAIL() << "issued an ID on an expired lease";
  } catch (const RedisError& e) {
    EXPECT_TRUE(e.retryable());
  }
  lease->renew();
  EXPECT_GT(gen.next(), before);
}

TEST_F(WorkerLeaseTest, BackgroundThreadRenews) {
  auto clock = std::make_shared<ManualClock>(1000);
  auto fast = options(14, clock);
  fast.renew_interval = std::chrono::milliseconds(10);
  const WorkerIdLease lease(fast);
  clock->set_ms(2000);
  // Wait (generously bounded, no timing assertion) for a renewal made at clock time 2000.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (lease.valid_until_ms() != 2000 + kTtl.count() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(lease.valid_until_ms(), 2000 + kTtl.count());
  EXPECT_EQ(get(14), lease.owner());
  EXPECT_GT(pttl(14), 0);
}

// A redis-sentinel:// URL parses (it has no host of its own: the Sentinels find the master),
// and the lease's one connection would have gone to an empty host instead of the master.
TEST_F(WorkerLeaseTest, ASentinelUrlIsAConfigErrorNotAConnectionToAnEmptyHost) {
  auto bad = options(12);
  bad.redis.url = "redis-sentinel://127.0.0.1:26379#mymaster";
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);
}

TEST_F(WorkerLeaseTest, RejectsBadOptions) {
  auto bad = options(-1);
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);
  bad = options(1024);
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);
  bad = options(12);
  bad.renew_interval = kTtl / 2 + std::chrono::milliseconds(1);
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);
  bad.renew_interval = std::chrono::milliseconds::max() / 2 + std::chrono::milliseconds(1);
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);  // twice it overflowed, and passed
  bad = options(12);
  bad.ttl = std::chrono::milliseconds(std::numeric_limits<std::int64_t>::max());
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);  // Redis' "invalid expire time" before
  bad = options(12);
  bad.handover_margin = std::chrono::milliseconds(0);
  EXPECT_THROW(WorkerIdLease{bad}, ConfigError);
  auto lease = std::make_shared<WorkerIdLease>(options(12));
  SnowflakeOptions gen_options;
  gen_options.worker_id = 13;
  gen_options.lease = lease;
  EXPECT_THROW(SnowflakeGenerator{gen_options}, ConfigError);  // differs from the lease's
}

// A renewal that Redis answered with an error (BUSY under a slow script, LOADING after a restart)
// was taken for another owner's key: the lease was lost for good, every ID refused until the
// process restarted.
TEST(WorkerLeaseErrors, AnErrorReplyDuringRenewalIsRetryableAndTheLeaseStaysHeld) {
  test::RedisServer server(false, {"--busy-reply-threshold", "50"});
  WorkerIdLeaseOptions o;
  o.redis.url = server.url();
  o.worker_id = 1;
  o.ttl = kTtl;
  o.renew_interval = kTtl / 2;
  auto lease = std::make_shared<WorkerIdLease>(o);
  std::thread script([&] {
    std::string output;
    (void)test::run(
        {"redis-cli", "-p", std::to_string(server.port()), "EVAL", "while true do end", "0"},
        &output);
  });
  ASSERT_TRUE(test::wait_until(std::chrono::seconds(10), [&] {
    std::string output;
    (void)test::run({"redis-cli", "-p", std::to_string(server.port()), "PING"}, &output);
    return output.starts_with("BUSY");
  }));
  try {
    lease->renew();
    ADD_FAILURE() << "renewed while Redis answers BUSY";
  } catch (const RedisError& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("BUSY"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(lease->held());
  (void)server.cli({"SCRIPT", "KILL"});
  script.join();
  lease->renew();
  EXPECT_TRUE(lease->held());
  SnowflakeOptions gen_options;
  gen_options.lease = lease;
  SnowflakeGenerator gen(gen_options);
  EXPECT_GT(gen.next(), 0u);
}

// The retry after a failed renewal came a whole renew_interval later, so at renew_interval =
// ttl / 2 one dropped connection let the lease lapse (next() refused IDs for a moment).
TEST(WorkerLeaseErrors, OneFailedRenewalAtHalfTheTtlNeverLetsTheLeaseLapse) {
  test::RedisServer server;
  WorkerIdLeaseOptions o;
  o.redis.url = server.url();
  o.worker_id = 2;
  o.ttl = std::chrono::milliseconds(2000);
  o.renew_interval = o.ttl / 2;
  const WorkerIdLease lease(o);
  const std::int64_t first = lease.valid_until_ms();
  ASSERT_TRUE(
      test::wait_until(std::chrono::seconds(10), [&] { return lease.valid_until_ms() != first; }));
  // Just renewed: valid for ttl; the next renewal, renew_interval from now, fails.
  (void)server.cli({"CLIENT", "KILL", "TYPE", "normal"});
  const std::int64_t renewed = lease.valid_until_ms();
  bool lapsed = false;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (lease.valid_until_ms() == renewed && std::chrono::steady_clock::now() < limit) {
    lapsed = lapsed || !lease.held();  // polled every millisecond: a lapse lasts a few
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_NE(lease.valid_until_ms(), renewed);
  EXPECT_FALSE(lapsed);
}

}  // namespace
}  // namespace idem
