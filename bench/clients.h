// Closed-loop clients of the throughput benchmarks (bench/pg_bench.cc, bench/e2e_bench.cc): the
// measured part of a run, as pgbench measures its own.
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace bench {

/// Runs `clients` threads; thread `c` runs `client(c, once)`, which sets up what the thread
/// needs and calls `once(call)`: `call` is made once untimed (a warm-up that opens the thread's
/// connections, as pgbench excludes connection time), then as often as it can for `seconds`.
/// Returns the calls per second over all threads. An exception in a thread ends the program.
inline double calls_per_second(
    int clients, double seconds,
    const std::function<void(int, const std::function<void(const std::function<void()>&)>&)>&
        client) {
  std::atomic<long> done{0};
  std::atomic<bool> stop{false};
  std::barrier ready(clients + 1);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      client(c, [&](const std::function<void()>& call) {
        call();  // warm-up
        ready.arrive_and_wait();
        long mine = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          call();
          ++mine;
        }
        done += mine;
      });
    });
  }
  ready.arrive_and_wait();
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& thread : threads) thread.join();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return static_cast<double>(done.load()) / elapsed.count();
}

/// The end of a benchmark's main(): with `setup_only` runs `setup`, otherwise prints `run()`'s
/// calls per second. Returns the exit status: 1, with `name: what` on stderr, when either throws.
inline int setup_or_run(const char* name, bool setup_only, const std::function<void()>& setup,
                        const std::function<double()>& run) {
  try {
    if (setup_only) {
      setup();
    } else {
      std::printf("%.1f\n", run());
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", name, error.what());
    return 1;
  }
}

}  // namespace bench
