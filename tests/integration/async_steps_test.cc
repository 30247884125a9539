// AsyncContext::step() on the async driver against a real redis-server (IDEM_TEST_REDIS_URL):
// which steps a retry replays, a crash's steps after its lease, a stale attempt fenced out of
// the journal, and a step reached with another input.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "gcc_coroutine_frames.h"
#include "idem/async_deduplicator.h"
#include "idem/errors.h"
#include "loop_probe.h"
#include "test_env.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using test::sleep_for;

Request agent_run(const std::string& id) {
  Request request;
  request.request_id = id;
  request.user = "u1";
  request.intent = "agent";
  request.biz_key = "run-" + id;
  return request;
}

class AsyncSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    redis_url_ = redis_url;
  }

  AsyncDeduplicatorOptions options(std::chrono::milliseconds lease = 30s) const {
    AsyncDeduplicatorOptions o;
    o.base.local_cache_capacity = 0;
    o.redis.emplace();
    o.redis->redis.url = redis_url_;
    o.redis->prefix = prefix_;
    o.redis->lease = lease;
    return o;
  }

  // Steps 1..4, each counting its runs and returning "<name>#<runs>"; `before(i)` is awaited
  // before step i.
  asio::awaitable<std::string> four_steps(AsyncContext& context,
                                          std::function<asio::awaitable<void>(int)> before = {}) {
    std::string out;
    for (int i = 1; i <= 4; ++i) {
      if (before) co_await before(i);
      const std::string name = "step" + std::to_string(i);
      out += co_await context.step(name, [&]() -> asio::awaitable<std::string> {
        co_return name + "#" + std::to_string(++runs_[name]);
      });
      out += ' ';
    }
    co_return out;
  }

  // One delivery of run "r1" whose handler is four_steps(context, before).
  asio::awaitable<Outcome> deliver(AsyncDeduplicator& dedup,
                                   std::function<asio::awaitable<void>(int)> before = {}) {
    co_return co_await dedup.run(
        agent_run("r1"),
        [this, before](AsyncContext& context) { return four_steps(context, before); },
        asio::use_awaitable);
  }

  // Runs `body` on a fresh loop until it returns.
  static void on_loop(asio::io_context& io, std::function<asio::awaitable<void>()> body) {
    asio::co_spawn(io, std::move(body), [](std::exception_ptr error) {
      if (error) std::rethrow_exception(error);
    });
    io.run();
  }

  std::string redis_url_;
  std::string prefix_ = test::unique_name("steps");
  std::map<std::string, int> runs_;
};

TEST_F(AsyncSteps, AFailureAtStepThreeOfFourAndARetryRunOnlyTheUnfinishedSteps) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options());
  std::exception_ptr failed;
  std::optional<Outcome> retry;
  on_loop(io, [&]() -> asio::awaitable<void> {
    try {
      (void)co_await deliver(dedup, [](int next) -> asio::awaitable<void> {
        if (next == 3) throw std::runtime_error("tool failed");
        co_return;
      });
    } catch (...) {
      failed = std::current_exception();
    }
    retry = co_await deliver(dedup);
    dedup.close();
  });
  ASSERT_TRUE(failed);
  EXPECT_THROW(std::rethrow_exception(failed), std::runtime_error);
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry->response, "step1#1 step2#1 step3#1 step4#1 ");
}

TEST_F(AsyncSteps, ACrashAfterStepTwoReplaysStepsOneAndTwoOnceTheLeaseEnds) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(300ms));
  std::optional<Outcome> early;
  std::optional<Outcome> retry;
  on_loop(io, [&]() -> asio::awaitable<void> {
    try {
      // A process that dies after step 2: its claim stays until the lease ends, as a cancelled
      // handler's does.
      (void)co_await deliver(dedup, [](int next) -> asio::awaitable<void> {
        if (next == 3) throw Cancelled();
        co_return;
      });
    } catch (const Cancelled&) {
    }
    early = co_await deliver(dedup);
    co_await sleep_for(400ms);
    retry = co_await deliver(dedup);
    dedup.close();
  });
  ASSERT_TRUE(early && retry);
  EXPECT_EQ(early->kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(retry->kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry->response, "step1#1 step2#1 step3#1 step4#1 ");
}

TEST_F(AsyncSteps, AStaleAttemptThatJournalsAfterItsLeaseWasTakenOverIsRejected) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(300ms));
  std::exception_ptr stale;
  std::optional<Outcome> taker;
  int done = 0;
  const auto finish = [&] {
    if (++done == 2) dedup.close();
  };
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        try {
          (void)co_await dedup.run(
              agent_run("r1"),
              [&](AsyncContext& context) -> asio::awaitable<std::string> {
                (void)co_await context.step(
                    "step1", []() -> asio::awaitable<std::string> { co_return "step1#stale"; });
                co_return co_await context.step("step2", []() -> asio::awaitable<std::string> {
                  co_await sleep_for(800ms);  // paused past its lease; another attempt took over
                  co_return "step2#stale";
                });
              },
              asio::use_awaitable);
        } catch (...) {
          stale = std::current_exception();
        }
        finish();
      },
      asio::detached);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await sleep_for(450ms);
        taker = co_await deliver(dedup);
        finish();
      },
      asio::detached);
  io.run();
  ASSERT_TRUE(stale);
  EXPECT_THROW(std::rethrow_exception(stale), ClaimLost);
  ASSERT_TRUE(taker);
  EXPECT_EQ(taker->kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(taker->response, "step1#stale step2#1 step3#1 step4#1 ")
      << "step 1 was journaled in time and is replayed; step 2 was not";
}

TEST_F(AsyncSteps, AStepNameReusedWithAnotherInputIsAnErrorAndRunsNothing) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options());
  std::exception_ptr mismatch;
  int llm_calls = 0;
  const auto llm = [&](std::string prompt) {
    return [&, prompt](AsyncContext& context) -> asio::awaitable<std::string> {
      std::string answer =
          co_await context.step("llm", prompt, [&]() -> asio::awaitable<std::string> {
            ++llm_calls;
            co_return "answer";
          });
      if (prompt == "refund order 1") throw std::runtime_error("later step failed");
      co_return answer;
    };
  };
  on_loop(io, [&]() -> asio::awaitable<void> {
    try {
      (void)co_await dedup.run(agent_run("r1"), llm("refund order 1"), asio::use_awaitable);
    } catch (const std::runtime_error&) {
    }
    try {
      (void)co_await dedup.run(agent_run("r1"), llm("refund order 2"), asio::use_awaitable);
    } catch (...) {
      mismatch = std::current_exception();
    }
    dedup.close();
  });
  ASSERT_TRUE(mismatch);
  EXPECT_THROW(std::rethrow_exception(mismatch), StepInputMismatch);
  EXPECT_EQ(llm_calls, 1);
}

}  // namespace
}  // namespace idem
