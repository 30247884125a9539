// idem-bench-guard: RedisGuard::claim (or claim_batch) throughput and latency, the idem side of
// bench/guard.sh. Every claim takes a fresh key (all answers are kFirst, as redis-benchmark's
// random keys), with a realistic request ID and a SHA-256-sized fingerprint.
//
//   idem-bench-guard --url URL --method lua|set --clients C --requests N [--batch B]
//                    [--min-replicas R]
//
// C threads share one RedisGuard (pool size C) and issue N claims in total (N/B claim_batch
// calls of B keys when --batch is given), after one untimed warm-up call each (connect, script
// load). With --min-replicas R, RedisGuardOptions::min_replicas = R (a WAIT after each claim or
// batch; replication_timeout 1 s, command_timeout 2 s, so that a replica slowed by a busy
// machine still answers in time); the claims the replicas did not acknowledge are counted on
// stderr. Prints one line: `<claims per second> <p99 latency of one call in µs>`.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/redis_guard.h"

namespace {

struct Args {
  std::string url;
  idem::ClaimMethod method = idem::ClaimMethod::kLuaScript;
  int clients = 1;
  long requests = 10000;
  int batch = 0;  // 0: claim(); otherwise claim_batch() of this many keys
  std::uint32_t min_replicas = 0;
};

[[noreturn]] void usage() {
  std::fprintf(
      stderr,
      "usage: idem-bench-guard --url URL --method lua|set --clients C --requests N [--batch B] "
      "[--min-replicas R]\n");
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view name = argv[i];
    const std::string value = argv[i + 1];
    if (name == "--url") {
      args.url = value;
    } else if (name == "--method") {
      if (value != "lua" && value != "set") usage();
      args.method = value == "lua" ? idem::ClaimMethod::kLuaScript : idem::ClaimMethod::kSetNxGet;
    } else if (name == "--clients") {
      args.clients = std::stoi(value);
    } else if (name == "--requests") {
      args.requests = std::stol(value);
    } else if (name == "--batch") {
      args.batch = std::stoi(value);
    } else if (name == "--min-replicas") {
      args.min_replicas = static_cast<std::uint32_t>(std::stoul(value));
    } else {
      usage();
    }
  }
  if (args.url.empty() || args.clients < 1 || args.requests < 1 || args.batch < 0 || argc % 2 == 0)
    usage();
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  idem::RedisGuardOptions options;
  options.redis.url = args.url;
  options.redis.pool_size = static_cast<std::size_t>(args.clients);
  options.prefix = "bench";
  options.ns = std::to_string(std::random_device{}());  // fresh keys on every run
  options.claim_method = args.method;
  options.min_replicas = args.min_replicas;
  options.replication_timeout = std::chrono::seconds(1);
  options.redis.command_timeout = std::chrono::seconds(2);
  idem::RedisGuard guard(options);

  const int per_call = std::max(args.batch, 1);
  const long calls_per_client = std::max(1L, args.requests / per_call / args.clients);
  const std::string fingerprint(64, 'f');
  std::vector<std::vector<std::chrono::nanoseconds>> latencies(
      static_cast<std::size_t>(args.clients));
  std::atomic<long> not_acknowledged{0};  // calls whose claims the replicas did not acknowledge
  std::latch ready(args.clients + 1);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (int c = 0; c < args.clients; ++c) {
    threads.emplace_back([&, c] {
      const std::string base = "u-" + std::to_string(c) + ":refund:order-";
      auto& mine = latencies[static_cast<std::size_t>(c)];
      mine.reserve(static_cast<std::size_t>(calls_per_client));
      std::vector<std::string> keys(static_cast<std::size_t>(per_call));
      std::vector<std::string> ids(static_cast<std::size_t>(per_call));
      std::vector<idem::ClaimRequest> batch(static_cast<std::size_t>(per_call));
      long next = 0;
      const auto one_call = [&] {
        for (int b = 0; b < per_call; ++b, ++next) {
          keys[b] = base + std::to_string(next);
          ids[b] = "req-" + std::to_string(c) + "-" + std::to_string(next);
          batch[b] = {.key = keys[b], .request_id = ids[b], .fingerprint = fingerprint};
        }
        const idem::ClaimResult result = args.batch == 0 ? guard.claim(keys[0], ids[0], fingerprint)
                                                         : guard.claim_batch(batch).front();
        if (!result.replicated) ++not_acknowledged;
        return result.status;
      };
      if (one_call() != idem::ClaimStatus::kFirst) std::abort();  // warm-up: connect, load script
      ready.count_down();
      go.wait();
      for (long i = 0; i < calls_per_client; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const idem::ClaimStatus status = one_call();
        mine.push_back(std::chrono::steady_clock::now() - start);
        if (status != idem::ClaimStatus::kFirst) std::abort();
      }
    });
  }
  ready.arrive_and_wait();
  const auto start = std::chrono::steady_clock::now();
  go.count_down();
  for (std::thread& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<std::chrono::nanoseconds> all;
  for (const auto& mine : latencies) all.insert(all.end(), mine.begin(), mine.end());
  const std::size_t p99 = std::min(all.size() - 1, all.size() * 99 / 100);
  std::nth_element(all.begin(), all.begin() + static_cast<long>(p99), all.end());
  const double claims = static_cast<double>(all.size()) * per_call;
  if (not_acknowledged > 0) {
    std::fprintf(stderr, "idem-bench-guard: %ld calls not acknowledged by the replicas\n",
                 not_acknowledged.load());
  }
  std::printf("%.1f %.1f\n", claims / seconds, static_cast<double>(all[p99].count()) / 1000.0);
  return 0;
}
