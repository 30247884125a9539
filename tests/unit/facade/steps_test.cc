// Context::step() on the blocking driver with the in-memory guard: which steps an attempt
// replays, which it runs, which writes the journal refuses, and how the metrics count them.
#include "facade/steps.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/clock.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/metrics.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

Request agent_run(const std::string& id) {
  Request r;
  r.request_id = id;
  r.user = "u1";
  r.intent = "agent";
  r.biz_key = "run-" + id;
  return r;
}

class Steps : public ::testing::Test {
 protected:
  Steps() {
    InMemoryGuardOptions guard_options;
    guard_options.lease = 1s;
    guard_options.clock = clock_;
    guard_ = std::make_shared<InMemoryGuard>(guard_options);
    DeduplicatorOptions options;
    options.guard = guard_;
    options.local_cache_capacity = 0;
    options.metrics = metrics_;
    dedup_ = std::make_unique<Deduplicator>(std::move(options));
  }

  // One step: counts its runs, returns "<name>#<runs>".
  std::string step(Context& context, const std::string& name, const std::string& input = "") {
    return context.step(name, input, [&] { return name + "#" + std::to_string(++runs_[name]); });
  }

  // Four steps; `before_step` (1-based) is called before each.
  Outcome four_steps(const std::string& id, const std::function<void(int)>& before_step = {}) {
    return dedup_->run(agent_run(id), [&](Context& context) {
      std::string out;
      for (int i = 1; i <= 4; ++i) {
        if (before_step) before_step(i);
        out += step(context, "step" + std::to_string(i)) + " ";
      }
      return out;
    });
  }

  // How many steps ended as `ending` (InProcessMetrics::steps()).
  [[nodiscard]] std::uint64_t steps(StepEnding ending) const { return metrics_->steps(ending); }

  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(1000);
  std::shared_ptr<InProcessMetrics> metrics_ = std::make_shared<InProcessMetrics>();
  std::shared_ptr<InMemoryGuard> guard_;
  std::unique_ptr<Deduplicator> dedup_;
  std::map<std::string, int> runs_;
};

TEST_F(Steps, AFailureAtStepThreeOfFourAndARetryRunOnlyTheUnfinishedSteps) {
  bool fail = true;
  EXPECT_THROW((void)dedup_->run(agent_run("r1"),
                                 [&](Context& context) {
                                   (void)step(context, "step1");
                                   (void)step(context, "step2");
                                   return context.step("step3", [&]() -> std::string {
                                     ++runs_["step3"];
                                     if (fail) throw std::runtime_error("tool failed");
                                     return "unreachable";
                                   });
                                 }),
               std::runtime_error);
  fail = false;
  const Outcome retry = four_steps("r1");
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry.response, "step1#1 step2#1 step3#2 step4#1 ");
  EXPECT_EQ(runs_,
            (std::map<std::string, int>{{"step1", 1}, {"step2", 1}, {"step3", 2}, {"step4", 1}}));
  EXPECT_EQ(steps(StepEnding::kJournaled), 4U);
  EXPECT_EQ(steps(StepEnding::kReplayed), 2U);
  EXPECT_EQ(steps(StepEnding::kClaimLost), 0U);
}

TEST_F(Steps, ACrashAfterStepTwoReplaysStepsOneAndTwoOnceTheLeaseEnds) {
  // A process that dies after step 2: its claim stays until the lease ends, as a cancelled
  // handler's does.
  EXPECT_THROW((void)four_steps("r1",
                                [](int next) {
                                  if (next == 3) throw Cancelled();
                                }),
               Cancelled);
  EXPECT_EQ(four_steps("r1").kind, Outcome::Kind::kInProgress);
  clock_->advance_ms(1001);
  const Outcome retry = four_steps("r1");
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry.response, "step1#1 step2#1 step3#1 step4#1 ");
}

TEST_F(Steps, AStaleAttemptThatJournalsAfterItsLeaseWasTakenOverIsRejected) {
  std::optional<Outcome> taker;
  std::string key;
  EXPECT_THROW((void)dedup_->run(agent_run("r1"),
                                 [&](Context& context) {
                                   key = context.key();
                                   (void)step(context, "step1");
                                   return context.step("step2", [&] {
                                     // This attempt pauses past its lease; another takes over
                                     // and finishes the run.
                                     clock_->advance_ms(1001);
                                     taker = four_steps("r1");
                                     return std::string("stale");
                                   });
                                 }),
               ClaimLost);
  ASSERT_TRUE(taker.has_value());
  EXPECT_EQ(taker->kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(taker->response, "step1#1 step2#1 step3#1 step4#1 ");
  EXPECT_EQ(guard_->steps(key).at("step2").result, "step2#1");
  EXPECT_EQ(steps(StepEnding::kClaimLost), 1U) << "the stale attempt's step 2";
  EXPECT_EQ(steps(StepEnding::kJournaled), 4U);
  EXPECT_EQ(steps(StepEnding::kReplayed), 1U);
}

TEST_F(Steps, AStepNameReusedWithAnotherInputIsAnErrorAndRunsNothing) {
  EXPECT_THROW((void)dedup_->run(agent_run("r1"),
                                 [&](Context& context) -> std::string {
                                   (void)step(context, "llm", "prompt: refund order 1");
                                   throw std::runtime_error("later step failed");
                                 }),
               std::runtime_error);
  EXPECT_THROW((void)dedup_->run(agent_run("r1"),
                                 [&](Context& context) {
                                   return step(context, "llm", "prompt: refund order 2");
                                 }),
               StepInputMismatch);
  EXPECT_EQ(runs_["llm"], 1);
  const Outcome same = dedup_->run(agent_run("r1"), [&](Context& context) {
    return step(context, "llm", "prompt: refund order 1");
  });
  EXPECT_EQ(same.response, "llm#1");
}

TEST_F(Steps, AResultOverTheSizeCapIsReturnedButNotJournaledSoARetryRunsItAgain) {
  DeduplicatorOptions options;
  options.guard = guard_;
  options.local_cache_capacity = 0;
  options.metrics = metrics_;
  options.max_step_result_bytes = 4;  // "s#1" fits, "large#1" does not
  Deduplicator capped(std::move(options));
  bool fail = true;
  const auto handler = [&](Context& context) {
    std::string out =
        context.step("small", [&] { return "s#" + std::to_string(++runs_["small"]); });
    out += context.step("large", [&] { return "large#" + std::to_string(++runs_["large"]); });
    out += context.step("large", [&]() -> std::string { throw std::logic_error("ran twice"); });
    if (fail) throw std::runtime_error("a later step failed");
    return out;
  };
  EXPECT_THROW((void)capped.run(agent_run("r1"), handler), std::runtime_error);
  fail = false;
  const Outcome retry = capped.run(agent_run("r1"), handler);
  EXPECT_EQ(retry.response, "s#1large#2large#2") << "the same name in one attempt replays";
  EXPECT_EQ(runs_, (std::map<std::string, int>{{"small", 1}, {"large", 2}}));
  EXPECT_EQ(steps(StepEnding::kTooLarge), 2U);
  EXPECT_EQ(steps(StepEnding::kJournaled), 1U);

  DeduplicatorOptions zero;
  zero.guard = guard_;
  zero.max_step_result_bytes = 0;
  EXPECT_THROW(Deduplicator{std::move(zero)}, ConfigError);
}

TEST_F(Steps, AStepOfAGuardlessDeduplicatorIsAConfigError) {
  DeduplicatorOptions options;
  options.sink = std::make_shared<InMemorySink>();
  Deduplicator sink_only(std::move(options));
  EXPECT_THROW((void)sink_only.run(agent_run("r1"),
                                   [&](Context& context) { return step(context, "step1"); }),
               ConfigError);
  EXPECT_EQ(runs_["step1"], 0);
}

TEST(StepBook, NamesAreOneToTwoHundredBytesWithoutControlBytes) {
  EXPECT_NO_THROW(detail::StepBook::validate_name("search flights: LHR→NRT"));
  EXPECT_NO_THROW(detail::StepBook::validate_name(std::string(200, 'a')));
  EXPECT_THROW(detail::StepBook::validate_name(""), InvalidKey);
  EXPECT_THROW(detail::StepBook::validate_name(std::string(201, 'a')), InvalidKey);
  EXPECT_THROW(detail::StepBook::validate_name("a\nb"), InvalidKey);
}

TEST(StepBook, AnInputIsJournaledByItsSha256AndNoInputByNothing) {
  EXPECT_EQ(detail::StepBook::input_fingerprint(""), "");
  EXPECT_EQ(detail::StepBook::input_fingerprint("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace idem
