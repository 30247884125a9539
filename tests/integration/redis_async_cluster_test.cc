// The async Redis client in cluster mode (src/redis/async_client.h) against a private 3-master
// Redis Cluster: slot routing with MOVED before the slot map is known, EVALSHA routed by its key,
// ASK during a slot migration and MOVED after it.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <memory>
#include <string>
#include <vector>

#include "redis/async_client.h"
#include "redis/cluster.h"
#include "redis/url.h"
#include "redis_cluster.h"

namespace idem::detail {
namespace {

using Args = std::vector<std::string_view>;

std::string text(const ReplyPtr& reply) { return std::string(reply->str, reply->len); }

// Runs `body(client)` as a coroutine on a fresh loop with a cluster client of the cluster that
// `seed_url` names; closes it after.
template <typename Body>
void with_client(const std::string& seed_url, Body body) {
  asio::io_context io;
  AsyncClientSettings settings;
  settings.connection.endpoint = parse_redis_url(seed_url);
  settings.cluster = true;
  auto client = AsyncClient::create(io.get_executor(), settings);
  std::exception_ptr failure;
  asio::co_spawn(io, body(client), [&](std::exception_ptr error) {
    failure = error;
    client->close();
  });
  io.run();
  if (failure) std::rethrow_exception(failure);
}

// Sets 60 keys through a client of the cluster that `seed_url` names, issued before the slot
// map has loaded (the seed redirects with MOVED), reads them back through it, and checks that
// each sits on the master that owns its slot (asked directly, not through the client).
void keys_reach_their_masters(const test::ClusterGroup& cluster, const std::string& seed_url) {
  with_client(seed_url, [](std::shared_ptr<AsyncClient> client) -> asio::awaitable<void> {
    for (int i = 0; i < 60; ++i) {
      const std::string key = "async-route:" + std::to_string(i);
      const std::string value = "v" + std::to_string(i);
      const Args set{"SET", key, value};
      ReplyPtr reply = co_await client->exec(key, set, asio::use_awaitable);
      EXPECT_EQ(reply->type, REDIS_REPLY_STATUS) << key << ": " << text(reply);
    }
    for (int i = 0; i < 60; ++i) {
      const std::string key = "async-route:" + std::to_string(i);
      const Args get{"GET", key};
      ReplyPtr reply = co_await client->exec(key, get, asio::use_awaitable);
      EXPECT_EQ(text(reply), "v" + std::to_string(i));
    }
  });
  for (int i = 0; i < 60; i += 7) {
    const std::string key = "async-route:" + std::to_string(i);
    test::RedisServer* owner = cluster.owner_of(key_slot(key));
    ASSERT_NE(owner, nullptr);
    EXPECT_EQ(owner->cli({"GET", key}), "v" + std::to_string(i));
  }
}

class RedisAsyncClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = std::make_unique<test::ClusterGroup>(3, 0); }
  static void TearDownTestSuite() { cluster_.reset(); }

  template <typename Body>
  static void with_client(Body body) {
    detail::with_client(cluster_->seed_url(), std::move(body));
  }

  static inline std::unique_ptr<test::ClusterGroup> cluster_;
};

TEST_F(RedisAsyncClusterTest, KeysOfEverySlotRangeReachTheirMaster) {
  keys_reach_their_masters(*cluster_, cluster_->seed_url());
}

// A rediss:// seed: every node is reached over TLS with the seed's settings (CA, server name),
// at the TLS port the cluster tells a TLS client.
TEST(RedisAsyncClusterTls, KeysOfEverySlotRangeReachTheirMasterOverTls) {
  const test::TestCertificates certs;
  const test::ClusterGroup cluster(3, 0, std::chrono::milliseconds(5000), &certs);
  keys_reach_their_masters(cluster, cluster.tls_seed_url());
}

TEST_F(RedisAsyncClusterTest, EvalshaIsRoutedByItsKeyAndReloadedOnEachNode) {
  with_client([](std::shared_ptr<AsyncClient> client) -> asio::awaitable<void> {
    constexpr std::string_view kBody = "return redis.call('SET', KEYS[1], ARGV[1])";
    const Args load{"SCRIPT", "LOAD", kBody};
    ReplyPtr sha = co_await client->exec(load, asio::use_awaitable);  // on the seed only
    const std::string sha1 = text(sha);
    const LuaScript script{kBody, sha1};
    for (int i = 0; i < 20; ++i) {
      const std::string key = "async-eval:" + std::to_string(i);
      const Args keys{key};
      const Args args{"x"};
      ReplyPtr reply = co_await client->evalsha(script, keys, args, asio::use_awaitable);
      EXPECT_EQ(reply->type, REDIS_REPLY_STATUS) << text(reply);
    }
  });
  for (const auto& node : cluster_->nodes()) {
    const std::string stats = node->cli({"INFO", "commandstats"});
    EXPECT_NE(stats.find("cmdstat_evalsha"), std::string::npos) << "a node got no EVALSHA";
  }
}

TEST_F(RedisAsyncClusterTest, FollowsAskDuringASlotMigrationAndMovedAfterIt) {
  const std::string held = "async-moving";
  const int slot = key_slot(held);
  test::RedisServer* source = cluster_->owner_of(slot);
  ASSERT_NE(source, nullptr);
  test::RedisServer& from = *source;
  test::RedisServer& to = *cluster_->nodes()[cluster_->nodes()[0].get() == source ? 1 : 0];
  std::string other;
  for (int n = 0; other.empty(); ++n) {
    const std::string candidate = "async-same-slot-" + std::to_string(n);
    if (key_slot(candidate) == slot) other = candidate;
  }
  ASSERT_EQ(from.cli({"SET", held, "on-source"}), "OK");
  const std::string from_id = from.cli({"CLUSTER", "MYID"});
  const std::string to_id = to.cli({"CLUSTER", "MYID"});
  const std::string slot_text = std::to_string(slot);
  ASSERT_EQ(to.cli({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id}), "OK");
  ASSERT_EQ(from.cli({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id}), "OK");

  with_client([&](std::shared_ptr<AsyncClient> client) -> asio::awaitable<void> {
    // Migrating: the source lacks `other` and answers ASK; the client sends ASKING + SET there.
    const Args set{"SET", other, "on-target"};
    ReplyPtr reply = co_await client->exec(other, set, asio::use_awaitable);
    EXPECT_EQ(reply->type, REDIS_REPLY_STATUS) << text(reply);
    const Args get{"GET", held};
    ReplyPtr still = co_await client->exec(held, get, asio::use_awaitable);
    EXPECT_EQ(text(still), "on-source");
  });
  EXPECT_EQ(to.cli({"CLUSTER", "COUNTKEYSINSLOT", slot_text}), "1");

  const std::string to_url = to.url();
  const std::string to_port =
      to_url.substr(to_url.rfind(':') + 1, to_url.rfind('/') - to_url.rfind(':') - 1);
  ASSERT_EQ(from.cli({"MIGRATE", "127.0.0.1", to_port, "", "0", "5000", "KEYS", held}), "OK");
  for (const auto& node : cluster_->nodes())
    (void)node->cli({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});

  with_client([&](std::shared_ptr<AsyncClient> client) -> asio::awaitable<void> {
    // Moved: the map (or the old owner's MOVED) leads to the new owner.
    const Args get{"GET", held};
    ReplyPtr moved = co_await client->exec(held, get, asio::use_awaitable);
    EXPECT_EQ(text(moved), "on-source");
    const Args get_other{"GET", other};
    ReplyPtr target = co_await client->exec(other, get_other, asio::use_awaitable);
    EXPECT_EQ(text(target), "on-target");
  });
}

}  // namespace
}  // namespace idem::detail
