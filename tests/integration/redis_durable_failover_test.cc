// Claims that survive a failover. Guard only (no sink), both drivers, traffic on fresh keys
// through a failover: with RedisGuardOptions::min_replicas = 1 no call answered Executed has its
// record missing from the new master afterwards, for SENTINEL FAILOVER with the old master left
// running, for SIGKILL of the Sentinel master, and for SIGKILL of a Redis Cluster master. The
// same traffic with the setting off runs beside it, through the same failover, and its losses
// are printed (asynchronous replication loses those writes by design). Before each SIGKILL the
// replica is cut off from its master for 300 ms, a slow link (on loopback it lags by
// microseconds): the streams without the setting must then lose claims, or the scenario proved
// nothing.
//
// Each scenario runs four streams at once: {blocking Deduplicator, AsyncDeduplicator} x {durable,
// plain}. A stream delivers fresh keys, each again after Unavailable (as a consumer redelivers),
// the next after Executed; it records the key of every Executed call. After the failover, the
// records of every master are read (SCAN and GET on each) and each executed key looked up.
#include <gtest/gtest.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gcc_coroutine_frames.h"
#include "guard/record.h"
#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/url.h"
#include "redis_cluster.h"
#include "redis_sentinel.h"
#include "refund_request.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The records under `pattern` on the server at `url` (a master): key -> state.
std::map<std::string, RecordState> records_on(const std::string& url, const std::string& pattern) {
  detail::ConnectionSettings settings;
  settings.endpoint = detail::parse_redis_url(url);
  settings.command_timeout = 5s;
  detail::Connection connection(settings);
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    const detail::ReplyPtr page = connection.command(
        std::array<std::string_view, 6>{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    cursor.assign(page->element[0]->str, page->element[0]->len);
    const redisReply& found = *page->element[1];
    for (std::size_t i = 0; i < found.elements; ++i)
      keys.emplace_back(found.element[i]->str, found.element[i]->len);
  } while (cursor != "0");
  for (const std::string& key : keys)
    connection.append(std::array<std::string_view, 2>{"GET", key});
  std::map<std::string, RecordState> records;
  for (const std::string& key : keys) {
    const detail::ReplyPtr value = connection.read_reply();
    if (value->type != REDIS_REPLY_STRING) continue;  // expired meanwhile
    records[key] = detail::decode_record(std::string_view(value->str, value->len)).state;
  }
  return records;
}

// One stream of traffic and what came of it.
struct Stream {
  std::string name;
  RedisGuardOptions guard;
  // Filled while it runs (under `mutex`):
  std::mutex mutex;
  std::vector<std::string> executed;  // the Redis keys of the calls answered Executed, saved
  // Answered Executed with a save_error: the completion failed, so the record is kept only
  // until its lease ends, and may be gone when the new master is read.
  std::vector<std::string> unsaved;
  int unavailable = 0;
  int held_back = 0;                   // of them: the Sentinels were failing the master over
  int not_replicated = 0;              // of them: the claim was not acknowledged by the replica
  int in_progress = 0;                 // given up: the key was found claimed
  int errors = 0;                      // exceptions out of run()
  std::map<std::string, int> reasons;  // Unavailable by error text

  void count(const Outcome& outcome) {
    std::lock_guard lock(mutex);
    if (outcome.kind == Outcome::Kind::kInProgress) ++in_progress;
    if (outcome.kind != Outcome::Kind::kUnavailable) return;
    ++unavailable;
    ++reasons[outcome.error.substr(0, 120)];
    if (outcome.error.find("failing the master") != std::string::npos) ++held_back;
    if (outcome.error.find("not acknowledged") != std::string::npos) ++not_replicated;
  }
  void executed_key(const std::string& key, const Outcome& outcome) {
    std::lock_guard lock(mutex);
    (outcome.saved() ? executed : unsaved).push_back(key);
  }
  [[nodiscard]] std::size_t executed_count() {
    std::lock_guard lock(mutex);
    return executed.size();
  }
};

Request request_for(const std::string& order) {
  return test::refund_request("req-" + order, order);
}

// Runs a blocking Deduplicator (kThreads threads) and an AsyncDeduplicator (kInFlight calls on
// one loop) per stream until stop().
class Traffic {
 public:
  static constexpr int kThreads = 3;
  static constexpr int kInFlight = 16;

  void start_blocking(Stream& stream) {
    DeduplicatorOptions options;
    options.guard = std::make_shared<RedisGuard>(stream.guard);
    options.local_cache_capacity = 0;
    auto dedup = std::make_shared<Deduplicator>(options);
    const auto naming = std::make_shared<RedisGuard>(stream.guard);
    for (int t = 0; t < kThreads; ++t) {
      threads_.emplace_back([this, &stream, dedup, naming, t] {
        for (int n = 0; !stopping_;) {
          const std::string order =
              stream.name + "-t" + std::to_string(t) + "-" + std::to_string(n);
          std::string key;
          try {
            const Outcome outcome = dedup->run(request_for(order), [&](Context& context) {
              key = naming->redis_key(context.key());
              return std::string("done");
            });
            stream.count(outcome);
            if (outcome.kind == Outcome::Kind::kUnavailable) {
              std::this_thread::sleep_for(10ms);
              continue;  // redelivered
            }
            if (outcome.kind == Outcome::Kind::kExecuted) stream.executed_key(key, outcome);
          } catch (const std::exception&) {
            std::lock_guard lock(stream.mutex);
            ++stream.errors;
          }
          ++n;
          std::this_thread::sleep_for(3ms);
        }
      });
    }
  }

  void start_async(Stream& stream) {
    threads_.emplace_back([this, &stream] {
      asio::io_context io;
      AsyncDeduplicatorOptions options;
      options.base.local_cache_capacity = 0;
      options.redis = stream.guard;
      AsyncDeduplicator dedup(io.get_executor(), options);
      const RedisGuard naming(stream.guard);
      int running = kInFlight;
      for (int w = 0; w < kInFlight; ++w) {
        asio::co_spawn(
            io,
            [&, w]() -> asio::awaitable<void> {
              asio::steady_timer pause(io);
              for (int n = 0; !stopping_;) {
                const std::string order =
                    stream.name + "-w" + std::to_string(w) + "-" + std::to_string(n);
                std::string key;
                try {
                  const Outcome outcome = co_await dedup.run(
                      request_for(order),
                      [&](AsyncContext& context) -> asio::awaitable<std::string> {
                        key = naming.redis_key(context.key());
                        co_return "done";
                      },
                      asio::use_awaitable);
                  stream.count(outcome);
                  if (outcome.kind == Outcome::Kind::kUnavailable) {
                    pause.expires_after(10ms);
                    co_await pause.async_wait(asio::use_awaitable);
                    continue;
                  }
                  if (outcome.kind == Outcome::Kind::kExecuted) stream.executed_key(key, outcome);
                } catch (const std::exception&) {
                  std::lock_guard lock(stream.mutex);
                  ++stream.errors;
                }
                ++n;
                pause.expires_after(20ms);
                co_await pause.async_wait(asio::use_awaitable);
              }
              if (--running == 0) dedup.close();
            },
            asio::detached);
      }
      io.run();
    });
  }

  void stop() {
    stopping_ = true;
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }
  ~Traffic() {
    if (!threads_.empty()) stop();
  }

 private:
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

// The four streams of a scenario, on `url` (cluster: a seed node).
std::vector<std::unique_ptr<Stream>> streams_for(const std::string& url, bool cluster) {
  std::vector<std::unique_ptr<Stream>> streams;
  for (const char* driver : {"blocking", "async"}) {
    for (const bool durable : {true, false}) {
      auto stream = std::make_unique<Stream>();
      stream->name = std::string(driver) + (durable ? "-durable" : "-plain");
      stream->guard.redis.url = url;
      stream->guard.redis.cluster = cluster;
      stream->guard.redis.connect_timeout = 200ms;
      stream->guard.redis.command_timeout = 500ms;
      stream->guard.prefix = test::unique_name(durable ? "durable" : "plain");
      stream->guard.lease = 5s;
      stream->guard.min_replicas = durable ? 1 : 0;
      stream->guard.replication_timeout = 100ms;
      streams.push_back(std::move(stream));
    }
  }
  return streams;
}

// On loopback a replica is microseconds behind its master, so a SIGKILL loses almost nothing
// even without the setting: a slow link is made by cutting `replica` off from `master` for
// kLag before the kill (stopped, and its replication connection closed by the master, so the
// writes meanwhile never reach it). Without the setting the streams lose what they executed in
// that time; with it, nothing executes then (no replica acknowledges).
constexpr auto kLag = 300ms;
void cut_off(test::RedisServer& replica, const test::RedisServer& master) {
  replica.pause();
  (void)master.cli({"CLIENT", "KILL", "TYPE", "replica"});
  std::this_thread::sleep_for(kLag);
}

// Runs the streams through `fail_over` (which returns once the new master serves), keeps them
// going for a while after, then checks every executed key against the records of `masters()`.
// `lagged`: the replica was cut off before the failover, so the streams without the setting
// must have lost claims (else the scenario proved nothing).
void run_through_failover(const std::string& what, const std::string& url, bool cluster,
                          bool lagged, const std::function<void()>& fail_over,
                          const std::function<std::vector<std::string>()>& masters) {
  std::vector<std::unique_ptr<Stream>> streams = streams_for(url, cluster);
  Traffic traffic;
  for (const auto& stream : streams) {
    if (stream->name.starts_with("blocking")) {
      traffic.start_blocking(*stream);
    } else {
      traffic.start_async(*stream);
    }
  }
  ASSERT_TRUE(test::wait_until(20s, [&] {
    for (const auto& stream : streams)
      if (stream->executed_count() < 20) return false;
    return true;
  })) << "the streams never got going";
  std::this_thread::sleep_for(300ms);  // the Sentinel subscriptions are set up meanwhile
  const auto began = Clock::now();
  fail_over();
  const auto served = Clock::now();
  std::this_thread::sleep_for(1500ms);
  traffic.stop();

  std::map<std::string, RecordState> records;
  for (const std::string& master : masters()) {
    for (const auto& stream : streams)
      records.merge(records_on(master, stream->guard.prefix + ":*"));
  }
  std::cerr << "[" << what << "] new master(s) serving "
            << std::chrono::duration_cast<std::chrono::milliseconds>(served - began).count()
            << " ms after the failover began\n";
  int lost_without = 0;
  for (const auto& stream : streams) {
    int missing = 0;
    int in_progress = 0;
    for (const std::string& key : stream->executed) {
      const auto found = records.find(key);
      if (found == records.end()) {
        ++missing;
      } else if (found->second == RecordState::kInProgress) {
        ++in_progress;
      }
    }
    const auto unsaved_gone =
        std::count_if(stream->unsaved.begin(), stream->unsaved.end(),
                      [&](const std::string& key) { return records.find(key) == records.end(); });
    std::cerr << "[" << what << "] " << stream->name << ": " << stream->executed.size()
              << " executed, " << missing << " missing from the new master, " << in_progress
              << " still in progress there (completion not replicated); " << stream->unsaved.size()
              << " executed unsaved (" << unsaved_gone << " gone: their leases ended); "
              << stream->unavailable << " Unavailable (" << stream->held_back
              << " held back by the failover, " << stream->not_replicated << " not acknowledged), "
              << stream->in_progress << " found in progress, " << stream->errors << " errors\n";
    for (const auto& [reason, n] : stream->reasons)
      std::cerr << "    " << n << " x " << reason << "\n";
    EXPECT_EQ(stream->errors, 0) << stream->name;
    if (stream->guard.min_replicas > 0) {
      EXPECT_GT(stream->executed.size(), 20U) << stream->name;
      EXPECT_EQ(missing, 0) << stream->name
                            << ": claims answered Executed are missing from the new master";
    } else {
      lost_without += missing;
    }
  }
  if (lagged) {
    EXPECT_GT(lost_without, 0) << "the replica's lag lost nothing without the setting either";
  }
}

std::vector<std::string> sentinel_master(const test::SentinelGroup& group) {
  return {"redis://" + group.master_address() + "/0"};
}

TEST(DurableFailover, NoExecutedClaimIsLostWhenSentinelFailsOverWithTheOldMasterRunning) {
  test::SentinelGroup group(1000ms);
  const std::string old_master = group.master_address();
  run_through_failover(
      "SENTINEL FAILOVER", group.url(), false, false,
      [&] {
        EXPECT_EQ(
            group.sentinels()[0]->cli({"SENTINEL", "FAILOVER", test::SentinelGroup::kMasterName}),
            "OK");
        EXPECT_TRUE(group.wait_for_new_master(old_master, 30s));
      },
      [&] { return sentinel_master(group); });
  ASSERT_NE(group.master_address(), old_master);
}

TEST(DurableFailover, NoExecutedClaimIsLostWhenTheSentinelMasterIsKilled) {
  test::SentinelGroup group(1000ms);
  std::string old_master;
  run_through_failover(
      "Sentinel master SIGKILL", group.url(), false, true,
      [&] {
        test::RedisServer* replica = group.server_at(group.replica_address());
        ASSERT_NE(replica, nullptr);
        cut_off(*replica, group.master());
        old_master = group.kill_master();
        replica->resume();
        EXPECT_TRUE(group.wait_for_new_master(old_master, 30s));
      },
      [&] { return sentinel_master(group); });
  ASSERT_NE(group.master_address(), old_master);
}

TEST(DurableFailover, NoExecutedClaimIsLostWhenAClusterMasterIsKilled) {
  test::ClusterGroup cluster(3, 1, 2000ms);
  // Not the seed node (the first master, slots from 0): the last master.
  constexpr int kSlot = detail::kClusterSlots - 1;
  test::RedisServer* victim = cluster.owner_of(kSlot);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(victim, cluster.nodes().front().get());
  // The victim's replica, by the victim's INFO replication ("slave0:ip=...,port=N,...").
  const std::string info = victim->cli({"INFO", "replication"});
  const auto at = info.find("port=", info.find("slave0:"));
  ASSERT_NE(at, std::string::npos) << info;
  const int replica_port = std::stoi(info.substr(at + 5));
  test::RedisServer* replica = nullptr;
  for (const auto& node : cluster.nodes())
    if (node->port() == replica_port) replica = node.get();
  ASSERT_NE(replica, nullptr);
  run_through_failover(
      "Cluster master SIGKILL", cluster.seed_url(), true, true,
      [&] {
        cut_off(*replica, *victim);
        victim->kill();
        replica->resume();
        EXPECT_TRUE(cluster.wait_for_new_owner(kSlot, victim, 30s));
      },
      [&] {
        std::vector<std::string> masters;
        for (const auto& node : cluster.nodes()) {
          if (node->running() && node->cli({"ROLE"}).starts_with("master")) {
            masters.push_back(node->url());
          }
        }
        return masters;
      });
}

}  // namespace
}  // namespace idem
