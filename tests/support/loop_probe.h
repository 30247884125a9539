// Helpers of the async tests: a probe that shows an event loop never blocks (a 1 ms timer on
// the loop records the longest gap between its firings, less the time the loop's thread waited
// for a core), a tally of calls that must fail, a coroutine runner and a coroutine sleep.
// Header-only (the async tests link Asio; the support library does not).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace idem::test {

#if defined(__SANITIZE_THREAD__)
#define IDEM_TEST_TSAN 1
#elif defined(__SANITIZE_ADDRESS__)
#define IDEM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IDEM_TEST_TSAN 1
#elif __has_feature(address_sanitizer)
#define IDEM_TEST_ASAN 1
#endif
#endif

/// The longest gap the async tests allow between two firings of a 1 ms timer while calls wait
/// on a stopped server, run-queue waits left out (LoopProbe). A loop that blocked on that server
/// would stall until it resumed, 700 ms after the probe began; the bound only has to stay well
/// under that, and above what the machine takes from a thread that neither blocks nor waits on a
/// run queue. An optimized build idles at 1-4 ms gaps with a tail to 9 ms, but a shared CI
/// virtual machine has stretched single gaps to 21 ms and to 103 ms with no run-queue wait (time
/// the hypervisor takes from the vCPU counts nowhere in the thread's schedstat, and these guests
/// report no steal time). So 150 ms, which also holds a turn of 1 000 replies at once in an
/// unoptimized (12-16 ms) or ASan build. Under TSan 1 000 calls ending together can take 70 to
/// 140 ms of the loop's own CPU in one turn on a 2-core machine, so TSan gets 250 ms.
#if defined(IDEM_TEST_TSAN)
inline constexpr std::chrono::milliseconds kMaxLoopGap{250};
#else
inline constexpr std::chrono::milliseconds kMaxLoopGap{150};
#endif

/// What a sanitizer or unoptimized build adds to a bound on when calls that wait on a stopped
/// server end (0 in an optimized build): the same handlers, run slower.
#if defined(IDEM_TEST_TSAN)
inline constexpr std::chrono::milliseconds kSanitizerSlack{240};
#elif defined(IDEM_TEST_ASAN) || !defined(__OPTIMIZE__)
inline constexpr std::chrono::milliseconds kSanitizerSlack{40};
#else
inline constexpr std::chrono::milliseconds kSanitizerSlack{0};
#endif

/// The longest the loop may spend in the turn where 1 000 calls end together at one deadline:
/// their completions run back to back, CPU work that grows with the calls (2-5.5 ms in the
/// RelWithDebInfo build on a 2-core VM, 13 ms at -O0, 53-61 ms under ASan on an idle machine
/// and up to 82 ms beside CI's other tests, 70-140 ms under TSan), plus what the hypervisor may
/// take (kMaxLoopGap). A loop blocked on the stopped server instead would stall until it
/// resumed, 400 ms after the deadline, so the bound stays well under that.
inline constexpr std::chrono::milliseconds kMaxDeadlineTurn =
    std::max(std::chrono::milliseconds(150), kMaxLoopGap);

/// Waits `duration` on the calling coroutine's executor.
inline asio::awaitable<void> sleep_for(std::chrono::steady_clock::duration duration) {
  asio::steady_timer timer(co_await asio::this_coro::executor, duration);
  co_await timer.async_wait(asio::use_awaitable);
}

/// Runs `body(executor)` (returning an asio::awaitable<void>) as a coroutine on a fresh
/// io_context until the loop has nothing left to do; rethrows what the coroutine threw.
template <typename Body>
void run_coroutine(Body body) {
  asio::io_context io;
  std::exception_ptr failure;
  asio::co_spawn(io, body(io.get_executor()), [&](std::exception_ptr error) { failure = error; });
  io.run();
  if (failure) std::rethrow_exception(failure);
}

/// Time the calling thread has waited on a run queue, runnable, for a core (the 2nd field of its
/// /proc/thread-self/schedstat); 0 where the kernel keeps none.
inline std::chrono::steady_clock::duration run_queue_wait() {
  std::ifstream in("/proc/thread-self/schedstat");
  long long on_cpu_ns = 0, waited_ns = 0;
  if (!(in >> on_cpu_ns >> waited_ns)) return {};
  return std::chrono::nanoseconds(waited_ns);
}

/// The time since construction that the constructing thread did not spend waiting for a core:
/// wall time less run-queue waits, for bounds on when calls end that a busy machine must not
/// stretch (a blocked thread is off its run queue, so blocking still counts in full). Use it on
/// the thread that made it.
class OwnTime {
 public:
  using Clock = std::chrono::steady_clock;
  [[nodiscard]] Clock::duration elapsed() const {
    return wall_elapsed() - (run_queue_wait() - waited_);
  }
  /// The wall time since construction.
  [[nodiscard]] Clock::duration wall_elapsed() const { return Clock::now() - started_; }

 private:
  Clock::time_point started_ = Clock::now();
  Clock::duration waited_ = run_queue_wait();
};

class LoopProbe {
 public:
  using Clock = std::chrono::steady_clock;

  /// Starts ticking on `io` every 1 ms for `span` from now. Not thread-safe (the loop's thread).
  LoopProbe(asio::io_context& io, Clock::duration span)
      : timer_(io), until_(Clock::now() + span), previous_(Clock::now()) {
    tick();
  }

  /// The longest time between two firings (or from the start to the first) that the loop's
  /// thread did not spend waiting for a core: a loop that blocks (in a system call, on a lock)
  /// is off its run queue and counts in full; one the kernel preempted, on a 2-core machine that
  /// runs the servers and other tests beside it, does not (the run-queue wait is the kernel's
  /// schedstat of the thread; 0 where the kernel keeps none).
  [[nodiscard]] Clock::duration worst_gap() const {
    return worst_gap_until(Clock::time_point::max());
  }
  /// worst_gap() among the firings at or before `until`.
  [[nodiscard]] Clock::duration worst_gap_until(Clock::time_point until) const {
    Clock::duration worst{};
    for (const auto& [at, gap] : gaps_) {
      if (at <= until) worst = std::max(worst, gap);
    }
    return worst;
  }
  /// The longest time between two firings, run-queue waits included.
  [[nodiscard]] Clock::duration worst_wall_gap() const { return worst_wall_; }

 private:
  void tick() {
    timer_.expires_after(std::chrono::milliseconds(1));
    timer_.async_wait([this](std::error_code error) {
      if (error) return;
      const Clock::time_point now = Clock::now();
      const Clock::duration waited = run_queue_wait();
      worst_wall_ = std::max(worst_wall_, now - previous_);
      const Clock::duration gap = (now - previous_) - (waited - waited_);
      gaps_.emplace_back(now, gap);
      previous_ = now;
      waited_ = waited;
      if (now < until_) tick();
    });
  }

  asio::steady_timer timer_;
  Clock::time_point until_;
  Clock::time_point previous_;
  Clock::duration waited_ = run_queue_wait();
  Clock::duration worst_wall_{};
  std::vector<std::pair<Clock::time_point, Clock::duration>> gaps_;  // firing, its own gap
};

/// What the "loop never blocks" tests check: while calls wait on a stopped server (the
/// firings before `deadline`, when they are due to end) the loop keeps every gap under
/// kMaxLoopGap, and the turn in which they end together stays under kMaxDeadlineTurn.
inline void expect_loop_never_blocked(const LoopProbe& probe,
                                      std::chrono::steady_clock::time_point deadline) {
  using Ms = std::chrono::duration<double, std::milli>;
  const std::string wall =
      " (wall gap with run-queue waits: " + std::to_string(Ms(probe.worst_wall_gap()).count()) +
      " ms)";
  EXPECT_LT(probe.worst_gap_until(deadline), kMaxLoopGap)
      << "the loop stalled while waiting" << wall;
  EXPECT_LT(probe.worst_gap(), kMaxDeadlineTurn) << "the loop stalled" << wall;
}

/// Tallies calls that must fail with `Error` (each checked by `check`) and when the last ended.
template <typename Error>
class FailureTally {
 public:
  using Clock = std::chrono::steady_clock;

  explicit FailureTally(std::function<void(const Error&)> check) : check_(std::move(check)) {}

  /// A completion handler `void(std::exception_ptr, Result)` for one such call.
  auto handler() {
    return [this](std::exception_ptr error, auto&&) {
      last_end_ = since_.wall_elapsed();
      last_own_end_ = since_.elapsed();
      if (error == nullptr) {
        ADD_FAILURE() << "the call succeeded";
        return;
      }
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        check_(e);
        ++failed_;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "unexpected error: " << e.what();
      }
    };
  }
  [[nodiscard]] int failed() const { return failed_; }
  /// From construction to the end of the last call.
  [[nodiscard]] Clock::duration last_end() const { return last_end_; }
  /// The same, run-queue waits left out (OwnTime).
  [[nodiscard]] Clock::duration last_own_end() const { return last_own_end_; }

 private:
  std::function<void(const Error&)> check_;
  OwnTime since_;
  Clock::duration last_end_{};
  Clock::duration last_own_end_{};
  int failed_ = 0;
};

}  // namespace idem::test
