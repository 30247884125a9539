// The client-side response bound of the Postgres sink, on a socket pair: no server needed.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <pqxx/except>
#include <string>
#include <thread>
#include <vector>

#include "pg/watchdog.h"

namespace idem::detail {
namespace {

using std::chrono::milliseconds;

// A connected pair of stream sockets, closed on destruction.
struct SocketPair {
  std::array<int, 2> fds{-1, -1};
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds.data()), 0); }
  ~SocketPair() {
    for (const int fd : fds) ::close(fd);
  }
};

// What libpq does while it waits for an answer: a blocking read, which fails when the peer
// never answers but the socket is shut down.
int wait_for_answer(int fd) {
  char byte = 0;
  if (::recv(fd, &byte, 1, 0) != 1) throw pqxx::broken_connection("server closed the connection");
  return byte;
}

TEST(PgWatchdog, ASilentPeerEndsTheCallWithARetryableTimeoutError) {
  PgWatchdog watchdog(milliseconds(100));
  SocketPair pair;
  try {
    (void)watchdog.run(pair.fds[0], [&] { return wait_for_answer(pair.fds[0]); });
    ADD_FAILURE() << "the call returned without an answer";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable());
    EXPECT_EQ(error.sqlstate(), kConnectionLostSqlstate);
    EXPECT_NE(std::string(error.what()).find("no answer within response_timeout (100 ms)"),
              std::string::npos)
        << error.what();
  }
}

TEST(PgWatchdog, ACommitWhoseAnswerNeverCameStaysNotRetryable) {
  PgWatchdog watchdog(milliseconds(50));
  SocketPair pair;
  try {
    watchdog.run(pair.fds[0], [&] {
      try {
        (void)wait_for_answer(pair.fds[0]);
      } catch (const pqxx::broken_connection&) {
        throw pqxx::in_doubt_error("connection lost during COMMIT");
      }
    });
    ADD_FAILURE() << "the commit returned without an answer";
  } catch (const PostgresError& error) {
    EXPECT_FALSE(error.retryable());
    EXPECT_NE(std::string(error.what()).find("commit outcome unknown"), std::string::npos);
    // Its own type, with a query method: the facade needs no SQLSTATE or message to tell it.
    EXPECT_TRUE(error.commit_outcome_unknown());
    EXPECT_NE(dynamic_cast<const CommitOutcomeUnknown*>(&error), nullptr);
  }
}

TEST(PgWatchdog, AnAnswerInTimeLeavesTheSocketUsableAndOtherErrorsPassThrough) {
  PgWatchdog watchdog(milliseconds(5000));
  SocketPair pair;
  for (int i = 0; i < 100; ++i) {  // many short calls: each watch ends before its deadline
    ASSERT_EQ(::send(pair.fds[1], "x", 1, 0), 1);
    EXPECT_EQ(watchdog.run(pair.fds[0], [&] { return wait_for_answer(pair.fds[0]); }), 'x');
  }
  EXPECT_THROW(watchdog.run(pair.fds[0], [] { throw pqxx::sql_error("boom", "SELECT", "42P01"); }),
               pqxx::sql_error);
  ASSERT_EQ(::send(pair.fds[1], "y", 1, 0), 1);  // the socket was never shut down
  EXPECT_EQ(wait_for_answer(pair.fds[0]), 'y');
}

// milliseconds::max() means no deadline: computed naively it overflows into the past and cuts
// every call off at once.
TEST(PgWatchdog, ATimeoutBeyondTheClocksRangeNeverFires) {
  PgWatchdog watchdog(milliseconds::max());
  SocketPair pair;
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(milliseconds(20));  // time for a wrongly early deadline to fire
    ASSERT_EQ(::send(pair.fds[1], "m", 1, 0), 1);
    EXPECT_EQ(watchdog.run(pair.fds[0],
                           [&] {
                             std::this_thread::sleep_for(milliseconds(20));
                             return wait_for_answer(pair.fds[0]);
                           }),
              'm');
  }
}

TEST(PgWatchdog, ZeroNeverBoundsACall) {
  PgWatchdog watchdog(milliseconds(0));
  SocketPair pair;
  ASSERT_EQ(::send(pair.fds[1], "z", 1, 0), 1);
  EXPECT_EQ(watchdog.run(pair.fds[0], [&] { return wait_for_answer(pair.fds[0]); }), 'z');
}

// Expects `call` to end with the watchdog's timeout error.
template <typename F>
void expect_timed_out(F&& call) {
  try {
    call();
    ADD_FAILURE() << "the call returned without an answer";
  } catch (const PostgresError& error) {
    EXPECT_NE(std::string(error.what()).find("no answer within response_timeout"),
              std::string::npos)
        << error.what();
  }
}

// The helper thread sleeps while no call is watched; the first call after such a spell must
// wake it, or a silent server would hold that call for ever.
TEST(PgWatchdog, ACallAfterAnIdleSpellIsStillBounded) {
  PgWatchdog watchdog(milliseconds(50));
  for (int spell = 0; spell < 3; ++spell) {
    std::this_thread::sleep_for(milliseconds(100));  // nothing watched: the helper idles
    SocketPair pair;
    // A missed wake-up would hold the call for ever: after 3 s the peer answers instead, and the
    // call returning with an answer fails the test rather than hanging it.
    const std::jthread rescue([&](const std::stop_token& stop) {
      for (int i = 0; i < 300 && !stop.stop_requested(); ++i) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      if (!stop.stop_requested()) (void)::send(pair.fds[1], "r", 1, 0);
    });
    expect_timed_out(
        [&] { watchdog.run(pair.fds[0], [&] { return wait_for_answer(pair.fds[0]); }); });
  }
}

// run() inside run() on one socket (a statement inside a watched transaction step): the outer
// call's deadline bounds both, and the inner call's failure is the timeout.
TEST(PgWatchdog, ANestedCallOnTheSameSocketIsBoundByTheOutermostDeadline) {
  PgWatchdog watchdog(milliseconds(100));
  SocketPair pair;
  expect_timed_out([&] {
    watchdog.run(pair.fds[0], [&] {
      return watchdog.run(pair.fds[0], [&] { return wait_for_answer(pair.fds[0]); });
    });
  });
  // The socket's slot is free again: an answered call on a fresh pair at the same number passes.
  SocketPair next;
  ASSERT_EQ(::send(next.fds[1], "n", 1, 0), 1);
  EXPECT_EQ(watchdog.run(next.fds[0], [&] { return wait_for_answer(next.fds[0]); }), 'n');
}

// Socket numbers are tracked in blocks of 1 024: one far from the first block is watched too.
TEST(PgWatchdog, ASocketNumberBeyondTheFirstThousandIsWatched) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  constexpr int kFar = 3000;
  if (limit.rlim_cur <= kFar) GTEST_SKIP() << "RLIMIT_NOFILE " << limit.rlim_cur;
  PgWatchdog watchdog(milliseconds(50));
  SocketPair pair;
  ASSERT_EQ(::dup2(pair.fds[0], kFar), kFar);
  expect_timed_out([&] { watchdog.run(kFar, [&] { return wait_for_answer(kFar); }); });
  ::close(kFar);
}

// Calls on many sockets at once, from many threads: only the silent one is cut off.
TEST(PgWatchdog, OnlyTheSilentSocketOfManyIsShutDown) {
  PgWatchdog watchdog(milliseconds(200));
  constexpr int kThreads = 6;
  constexpr int kCalls = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> answered{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      SocketPair pair;
      for (int i = 0; i < kCalls; ++i) {
        if (::send(pair.fds[1], "a", 1, 0) != 1) return;
        if (watchdog.run(pair.fds[0], [&] { return wait_for_answer(pair.fds[0]); }) == 'a') {
          ++answered;
        }
      }
    });
  }
  SocketPair silent;
  expect_timed_out(
      [&] { watchdog.run(silent.fds[0], [&] { return wait_for_answer(silent.fds[0]); }); });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(answered.load(), kThreads * kCalls);
}

}  // namespace
}  // namespace idem::detail
