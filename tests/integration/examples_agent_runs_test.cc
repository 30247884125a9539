// examples/agent_runs end to end: the same agent runs and faults through the handler as
// written, idem around the whole call, and idem with each step in Context::step().
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>

#include "examples_child.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem::test {
namespace {

TEST(AgentRunsDemo, WithStepsEachRunHasOneToolEffectAndNoFinishedStepRunsAgain) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  const ScratchSchema schema(pg_url, "agent");
  constexpr int kRuns = 60;
  ChildProcess demo({IDEM_AGENT_RUNS_BIN, "--redis-url", redis_url, "--pg-url", pg_url, "--schema",
                     schema.name(), "--runs", std::to_string(kRuns), "--seed", "7", "--lease-ms",
                     "150"});
  ASSERT_EQ(demo.wait_exit(std::chrono::seconds(60)), 0) << demo.tail();
  std::map<std::string, std::string> results;
  for (const std::string& line : demo.lines()) {
    for (const char* mode : {"none", "whole", "steps"}) {
      if (line.starts_with(std::string("result mode=") + mode + " ")) results[mode] = line;
    }
  }
  ASSERT_EQ(results.size(), 3U) << demo.tail();
  const std::string& none = results["none"];
  const std::string& whole = results["whole"];
  const std::string& steps = results["steps"];
  EXPECT_GT(summary_field(none, "effects"), kRuns) << none;
  EXPECT_GT(summary_field(none, "max_effects"), 1) << none;
  EXPECT_GT(summary_field(whole, "rerun_steps"), 0) << whole;
  EXPECT_EQ(summary_field(steps, "effects"), kRuns) << steps;
  EXPECT_EQ(summary_field(steps, "max_effects"), 1) << steps;
  EXPECT_EQ(summary_field(steps, "rerun_steps"), 0) << steps;
  EXPECT_LT(summary_field(steps, "llm_calls"), summary_field(whole, "llm_calls")) << whole;
  EXPECT_LT(summary_field(steps, "llm_calls"), summary_field(none, "llm_calls")) << none;
}

// With Redis down the guard fails closed: every delivery is kUnavailable and nothing runs. The
// demo redelivers, then stops with an error; it never counts such a run as done.
TEST(AgentRunsDemo, AnUnavailableGuardIsNotARunDone) {
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  const ScratchSchema schema(pg_url, "agent");
  ChildProcess demo({IDEM_AGENT_RUNS_BIN, "--redis-url", "redis://127.0.0.1:1/0", "--pg-url",
                     pg_url, "--schema", schema.name(), "--runs", "10", "--seed", "7", "--lease-ms",
                     "150"});
  EXPECT_EQ(demo.wait_exit(std::chrono::seconds(60)), 1) << demo.tail();
  for (const std::string& line : demo.lines()) {
    EXPECT_FALSE(line.starts_with("result mode=whole") || line.starts_with("result mode=steps"))
        << line;
  }
  EXPECT_NE(demo.tail().find("unavailable"), std::string::npos) << demo.tail();
}

}  // namespace
}  // namespace idem::test
