// Claims through the async Redis client from ONE loop thread with N calls in flight (bench/async.sh
// compares it with redis-benchmark in the same run).
//
//   idem-bench-async --url redis://127.0.0.1:6379/0 --method lua|set --in-flight 1000
//                    --requests 400000 [--min-replicas R]
//
// Each of --in-flight coroutines claims fresh keys one after the other (`EVALSHA claim.lua 1 key
// record 30000`, or `SET key record NX PX 30000 GET`) until --requests claims are done. Prints
// "<claims per second> <p99 µs> <heap bytes per in-flight call>": the last is glibc's count of
// allocated heap bytes (mallinfo2) with every call in flight (coroutine frame, pending operation,
// queued command bytes) minus the count before, over N. With --min-replicas R each claim is a
// durable command (AsyncConnectionSettings::wait_replicas = R, wait_timeout 1 s: one WAIT
// after each write's claims, as the async guard sends them with RedisGuardOptions::min_replicas)
// and a claim with fewer than R acknowledgements counts as failed.
#include <malloc.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/lua_scripts.h"
#include "redis/async_client.h"
#include "redis/url.h"

namespace {

long long heap_in_use() {
  const struct mallinfo2 info = ::mallinfo2();
  return static_cast<long long>(info.uordblks + info.hblkhd);
}

using idem::detail::ReplyPtr;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string url = "redis://127.0.0.1:6379/0";
  std::string method = "set";
  int in_flight = 1000;
  long long requests = 400000;
  int min_replicas = 0;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const std::string value = argv[i + 1];
    if (name == "--url") {
      options.url = value;
    } else if (name == "--method" && (value == "set" || value == "lua")) {
      options.method = value;
    } else if (name == "--in-flight") {
      options.in_flight = std::max(1, std::atoi(value.c_str()));
    } else if (name == "--requests") {
      options.requests = std::max(1LL, std::atoll(value.c_str()));
    } else if (name == "--min-replicas") {
      options.min_replicas = std::max(0, std::atoi(value.c_str()));
    } else {
      std::cerr << "idem-bench-async: bad argument " << name << " " << value << "\n";
      std::exit(2);
    }
  }
  return options;
}

// A record of idem's size (as bench/guard.sh's): "1I" + owner + request ID + fingerprint.
const std::string kRecord =
    "1I" + std::string(32, 'a') + "14:req-00000000011" + "64:" + std::string(64, '0') + "-";

struct Run {
  const Options& options;
  std::shared_ptr<idem::detail::AsyncClient> client;
  std::string sha;
  long long issued = 0;
  long long done = 0;
  long long failed = 0;
  std::vector<std::uint32_t> latencies_us;

  asio::awaitable<void> claimer(int id) {
    std::string key;
    const idem::detail::LuaScript script{idem::detail::kClaimScript, sha};
    while (issued < options.requests) {
      const long long n = issued++;
      key = "bench:async:" + std::to_string(id) + ":" + std::to_string(n);
      const auto started = Clock::now();
      try {
        const bool durable = options.min_replicas > 0;
        ReplyPtr reply;
        if (options.method == "lua") {
          const std::string_view keys[] = {key};
          const std::string_view args[] = {kRecord, "30000"};
          reply = co_await client->evalsha(script, keys, args, durable, asio::use_awaitable);
        } else {
          const std::string_view args[] = {"SET", key, kRecord, "NX", "PX", "30000", "GET"};
          reply = co_await client->exec(key, args, durable, asio::use_awaitable);
        }
        // [the claim's reply, WAIT's count]: fewer replicas than asked is a failed claim here.
        if (durable && (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
                        reply->element[1]->type != REDIS_REPLY_INTEGER ||
                        reply->element[1]->integer < options.min_replicas)) {
          throw std::runtime_error("a claim not acknowledged by the replicas");
        }
      } catch (const std::exception& error) {
        if (failed++ == 0) std::cerr << "idem-bench-async: " << error.what() << "\n";
      }
      latencies_us.push_back(static_cast<std::uint32_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count()));
      if (++done == options.requests) client->close();
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  asio::io_context io(1);
  idem::detail::AsyncClientSettings settings;
  settings.connection.endpoint = idem::detail::parse_redis_url(options.url);
  settings.connection.command_timeout = std::chrono::seconds(10);
  settings.connection.connect_timeout = std::chrono::seconds(2);
  settings.connection.wait_replicas = options.min_replicas;
  settings.connection.wait_timeout = std::chrono::seconds(1);
  Run run{options, idem::detail::AsyncClient::create(io.get_executor(), settings), {}, 0, 0, 0, {}};
  run.latencies_us.reserve(static_cast<std::size_t>(options.requests));

  // Load the script (and connect) first.
  const std::string_view load[] = {"SCRIPT", "LOAD", idem::detail::kClaimScript};
  run.client->exec(load, [&](std::exception_ptr error, ReplyPtr reply) {
    if (error) std::rethrow_exception(error);
    run.sha.assign(reply->str, reply->len);
  });
  while (run.sha.empty()) io.run_one();

  // Memory: start every claimer up to its first co_await, with the server's replies not yet
  // read (they come in a later turn), and count the live heap.
  const auto connection = run.client->connection_for_slot(-1);
  const long long before = heap_in_use();
  for (int i = 0; i < options.in_flight; ++i) asio::co_spawn(io, run.claimer(i), asio::detached);
  while (connection->in_flight() < static_cast<std::size_t>(options.in_flight) &&
         io.poll_one() > 0) {
  }
  const long long during = heap_in_use();
  const double bytes_per_call =
      static_cast<double>(during - before) / static_cast<double>(options.in_flight);

  const auto started = Clock::now();
  io.run();
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (run.failed > 0) {
    std::cerr << "idem-bench-async: " << run.failed << " claims failed\n";
    return 1;
  }
  std::sort(run.latencies_us.begin(), run.latencies_us.end());
  const double p99 = run.latencies_us[run.latencies_us.size() * 99 / 100];
  std::printf("%.0f %.1f %.0f\n", static_cast<double>(run.done) / seconds, p99, bytes_per_call);
  return 0;
}
