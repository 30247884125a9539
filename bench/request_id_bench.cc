// One run of the request-ID benchmarks; bench/request_id.sh repeats it and takes medians.
// Prints "name value" lines: operations per second of wall time, and, as `<name>_cpu`, per
// second of the worker threads' CPU time (steadier on a loaded machine):
//   snowflake_ids_per_s           one thread, one SnowflakeGenerator (capped at 4 096 IDs/ms)
//   snowflake_2threads_ids_per_s  two threads sharing one generator
//   snowflake_4096_ids_best_us    fastest of 200 batches of 4 096 IDs (one millisecond's
//                                 budget), in µs: how much of a millisecond the generator
//                                 needs when it is not descheduled (no _cpu line)
//   uuid7_ids_per_s               one thread, one Uuid7Generator, text form
//   local_cache_lookups_per_s     one thread, get() hits on a full 10 000-entry LocalCache
//   local_cache_2threads_lookups_per_s
//   map_mutex_lookups_per_s       the reference: the same lookups in a std::unordered_map under
//                                 one std::mutex (no TTL, no LRU, no bound)
// usage: idem-bench-request-id [--seconds S]   (S per measurement, default 1)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "idem/local_cache.h"
#include "idem/request_id.h"
#include "idem/snowflake.h"

namespace {

using Clock = std::chrono::steady_clock;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Rate {
  double per_wall_s;
  double per_cpu_s;
};

// Runs `op(thread_index)` in `threads` threads for `seconds`; returns operations per second.
// `op` performs a batch of `batch` operations and returns a value folded into a sink.
template <class Op>
Rate per_second(int threads, double seconds, std::uint64_t batch, Op op) {
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> total{0};
  std::atomic<std::uint64_t> sink{0};
  std::atomic<std::uint64_t> cpu_ns{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      const double cpu_start = thread_cpu_seconds();
      std::uint64_t done = 0;
      std::uint64_t local_sink = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        local_sink += op(t);
        done += batch;
      }
      total += done;
      sink += local_sink;
      cpu_ns += static_cast<std::uint64_t>((thread_cpu_seconds() - cpu_start) * 1e9);
    });
  }
  const auto start = Clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& worker : workers) worker.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  if (sink.load() == 42) std::fputs("", stdout);  // keep the results observable
  const auto ops = static_cast<double>(total.load());
  return Rate{ops / elapsed, ops / (static_cast<double>(cpu_ns.load()) * 1e-9)};
}

Rate snowflake(int threads, double seconds) {
  idem::SnowflakeOptions options;
  options.worker_id = 1;
  idem::SnowflakeGenerator gen(options);
  return per_second(threads, seconds, 256, [&gen](int) {
    std::uint64_t x = 0;
    for (int i = 0; i < 256; ++i) x ^= gen.next();
    return x;
  });
}

double snowflake_4096_best_us() {
  idem::SnowflakeOptions options;
  options.worker_id = 1;
  idem::SnowflakeGenerator gen(options);
  double best = 1e9;
  std::uint64_t x = 0;
  for (int batch = 0; batch < 200; ++batch) {
    const auto start = Clock::now();
    for (std::uint32_t i = 0; i < idem::kSnowflakeIdsPerMs; ++i) x ^= gen.next();
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  if (x == 42) std::fputs("", stdout);
  return best;
}

Rate uuid7(double seconds) {
  idem::Uuid7Generator gen;
  return per_second(1, seconds, 64, [&gen](int) {
    std::uint64_t x = 0;
    for (int i = 0; i < 64; ++i) x += static_cast<unsigned char>(gen.next()[35]);
    return x;
  });
}

std::vector<std::string> uuid_keys(std::size_t n) {
  idem::Uuid7Generator ids;
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < n; ++i) keys.push_back(ids.next());
  return keys;
}

// 64 lookups of keys in a stride walk through `lookup`, summing what it returns.
template <class Lookup>
std::uint64_t lookups(const std::vector<std::string>& keys, int thread, Lookup lookup) {
  thread_local std::size_t next = static_cast<std::size_t>(thread) * 7919;
  std::uint64_t x = 0;
  for (int i = 0; i < 64; ++i) {
    next = (next + 104729) % keys.size();  // a stride over the keys: no cache-friendly order
    x += lookup(keys[next]);
  }
  return x;
}

Rate local_cache(int threads, double seconds) {
  const std::vector<std::string> keys = uuid_keys(10000);
  idem::LocalCache cache;  // defaults: 10 000 entries, 16 shards, 60 s TTL
  for (const auto& key : keys) cache.put(key, std::string(100, 'r'));  // a small JSON response
  return per_second(threads, seconds, 64, [&](int t) {
    return lookups(keys, t, [&](const std::string& key) -> std::uint64_t {
      const auto hit = cache.get(key);
      return hit ? hit->size() : 0;
    });
  });
}

Rate map_mutex(int threads, double seconds) {
  const std::vector<std::string> keys = uuid_keys(10000);
  std::unordered_map<std::string, std::string> map;
  std::mutex mu;
  for (const auto& key : keys) map.emplace(key, std::string(100, 'r'));
  return per_second(threads, seconds, 64, [&](int t) {
    return lookups(keys, t, [&](const std::string& key) -> std::uint64_t {
      std::string copy;
      {
        const std::lock_guard lock(mu);
        const auto it = map.find(key);
        if (it == map.end()) return 0;
        copy = it->second;
      }
      return copy.size();
    });
  });
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S]\n", argv[0]);
      return 2;
    }
  }
  const auto print = [](const char* name, Rate rate) {
    std::printf("%s %.0f\n%s_cpu %.0f\n", name, rate.per_wall_s, name, rate.per_cpu_s);
  };
  print("snowflake_ids_per_s", snowflake(1, seconds));
  print("snowflake_2threads_ids_per_s", snowflake(2, seconds));
  std::printf("snowflake_4096_ids_best_us %.1f\n", snowflake_4096_best_us());
  print("uuid7_ids_per_s", uuid7(seconds));
  print("local_cache_lookups_per_s", local_cache(1, seconds));
  print("local_cache_2threads_lookups_per_s", local_cache(2, seconds));
  print("map_mutex_lookups_per_s", map_mutex(1, seconds));
  print("map_mutex_2threads_lookups_per_s", map_mutex(2, seconds));
  return 0;
}
