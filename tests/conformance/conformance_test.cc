// Runs every scenario of the table (scenarios.cc) through every driver: ctest names each
// Conformance/Rules.Scenario/<Scenario>_<driver>. A scenario checks each call's ending and the
// handler's runs, then the state of the keys it names in each layer, the decision events and
// the metrics, against the same expectations for every driver.
#include "conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sim_driver.h"

namespace idem::conformance {

const std::vector<DriverSpec>& drivers() {
  static const std::vector<DriverSpec> all = {
      {"blocking", Backends::kInMemory,
       [](World&, test::DriverSetup setup) -> std::unique_ptr<test::TestDriver> {
         return std::make_unique<test::BlockingTestDriver>(std::move(setup));
       }},
      {"async", Backends::kInMemory,
       [](World&, test::DriverSetup setup) -> std::unique_ptr<test::TestDriver> {
         return std::make_unique<test::AsyncTestDriver>(std::move(setup));
       }},
      {"sim", Backends::kSimulated,
       [](World& world, test::DriverSetup setup) -> std::unique_ptr<test::TestDriver> {
         return std::make_unique<SimTestDriver>(world, std::move(setup));
       }},
  };
  return all;
}

namespace {

// What one run of a scenario through one driver gave.
struct Result {
  std::vector<std::string> endings;
  std::vector<int> runs;
  std::vector<std::string> saw;
  std::vector<std::string> held;  // per Held: "guard=... sink=... local=..."
  std::vector<std::string> events;
  std::string metrics;
  std::vector<std::string> unfired;
  bool late = false;
};

std::string held_text(const std::string& guard, const std::string& sink, const std::string& local) {
  std::string text;
  if (!guard.empty()) text += "guard=" + guard;
  if (!sink.empty()) text += std::string(text.empty() ? "" : " ") + "sink=" + sink;
  if (!local.empty()) text += std::string(text.empty() ? "" : " ") + "local=" + local;
  return text;
}

// The local cache's answer for `request`: a repeat of it through the driver, which the cache
// answers (layer request_id) or not.
std::string probe_local(test::TestDriver& driver, Request request) {
  request.stop = {};
  test::Saw saw;
  const test::Ending ending =
      driver.call(request, test::Behaviour{.response = "probe"}, saw, false);
  if (!ending.outcome || ending.outcome->layer != Layer::kRequestId) return "miss";
  return "hit(" + ending.outcome->response.value_or("") + ")";
}

Result run(const Scenario& scenario, const DriverSpec& spec, std::chrono::milliseconds deadline) {
  World world(scenario, spec.backends);
  const std::unique_ptr<test::TestDriver> driver = spec.make(world, world.setup(deadline));
  world.attach(*driver);
  Result run;
  std::vector<std::string> seen_keys;
  std::vector<test::Saw> saws;
  for (std::size_t i = 0; i < scenario.calls.size(); ++i) {
    const Call& call = scenario.calls[i];
    world.begin_call(static_cast<int>(i));
    if (call.before) call.before(world);
    Request request = call.request;
    request.stop = world.stop_token();
    if (call.stopped_before) world.request_stop();
    test::Behaviour behaviour = call.handler;
    behaviour.on_start = [&world, then = call.handler.on_start] {
      world.before(Op::kHandler);
      if (then) then();
    };
    test::Saw saw;
    run.endings.push_back(render_ending(driver->call(request, behaviour, saw, call.transactional)));
    world.end_call();
    run.runs.push_back(saw.runs);
    seen_keys.push_back(saw.key);
    saws.push_back(saw);
  }
  world.quiet();
  for (std::size_t i = 0; i < saws.size(); ++i) {
    run.saw.push_back(render_saw(saws[i], world.key_of_call(static_cast<int>(i), seen_keys[i])));
  }
  run.late = world.late();
  run.unfired = world.unfired();
  run.events = world.events();
  run.metrics = world.metrics();
  for (const Held& held : scenario.held) {
    const std::string key =
        held.key.empty()
            ? world.key_of_call(held.call, seen_keys.at(static_cast<std::size_t>(held.call)))
            : held.key;
    run.held.push_back(held_text(held.guard.empty() ? "" : probe_guard(world.guard(), key),
                                 held.sink.empty() ? "" : probe_sink(world.sink(), key), ""));
  }
  // Last: a probe of the local cache may change the other layers.
  for (std::size_t i = 0; i < scenario.held.size(); ++i) {
    const Held& held = scenario.held[i];
    if (held.local.empty()) continue;
    const std::string local =
        probe_local(*driver, scenario.calls.at(static_cast<std::size_t>(held.call)).request);
    run.held[i] += std::string(run.held[i].empty() ? "" : " ") + "local=" + local;
  }
  return run;
}

// A run of `scenario` through `spec`. A deadline is real time for the async driver: when a step the
// scenario puts the deadline at came after it had already passed (a slow machine), the run says
// nothing, and it is run again with a longer one.
Result run(const Scenario& scenario, const DriverSpec& spec) {
  for (std::chrono::milliseconds deadline{scenario.needs_deadline ? 5 : 0};; deadline *= 4) {
    Result got = run(scenario, spec, deadline);
    if (!got.late || deadline.count() >= 1000) return got;
  }
}

// What a run gave that the scenario does not say; empty when the driver conforms.
std::vector<std::string> differences(const Scenario& scenario, const Result& got) {
  std::vector<std::string> found;
  const auto differ = [&](const std::string& what, const std::string& expected,
                          const std::string& actual) {
    if (expected != actual)
      found.push_back(what + ": expected \"" + expected + "\", got \"" + actual + "\"");
  };
  if (got.late) found.emplace_back("the deadline always passed before the step it was meant for");
  for (const std::string& fault : got.unfired) found.push_back("a fault never fired: " + fault);
  for (std::size_t i = 0; i < scenario.calls.size(); ++i) {
    const Call& call = scenario.calls[i];
    const int runs = call.runs >= 0 ? call.runs : (call.ending.starts_with("executed") ? 1 : 0);
    const std::string which = "call #" + std::to_string(i);
    differ(which + " ending", call.ending, got.endings[i]);
    differ(which + " handler runs", std::to_string(runs), std::to_string(got.runs[i]));
    if (!call.saw.empty()) differ(which + " handler saw", call.saw, got.saw[i]);
  }
  for (std::size_t i = 0; i < scenario.held.size(); ++i) {
    const Held& held = scenario.held[i];
    differ("state of " +
               (held.key.empty() ? "call #" + std::to_string(held.call) + "'s key" : held.key),
           held_text(held.guard, held.sink, held.local), got.held[i]);
  }
  const auto joined = [](const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += (text.empty() ? "" : " | ") + line;
    return text;
  };
  differ("events", joined(scenario.events), joined(got.events));
  differ("metrics", scenario.metrics, got.metrics);
  return found;
}

struct Param {
  const Scenario* scenario;
  const DriverSpec* driver;
};

// How gtest and ctest show a run.
[[maybe_unused]] void PrintTo(const Param& param, std::ostream* os) {
  *os << param.scenario->name << " through the " << param.driver->name << " driver";
}

// Why `scenario` does not run on `spec`; empty when it does.
std::string skipped(const Scenario& scenario, const DriverSpec& spec) {
  if (const auto why = scenario.not_on.find(spec.name); why != scenario.not_on.end()) {
    return "not for the " + spec.name + " driver: " + why->second;
  }
  World probe(scenario, spec.backends);
  const test::Abilities can = spec.make(probe, probe.setup({}))->abilities();
  if (scenario.needs_deadline && !can.deadline) {
    return "the " + spec.name + " driver has no deadline";
  }
  if (scenario.needs_transactions && !can.transactions) {
    return "the " + spec.name + " driver runs no transactions over its backends";
  }
  return {};
}

// Each scenario with each driver it runs on (docs/semantics.md lists them).
std::vector<Param> params() {
  std::vector<Param> all;
  for (const Scenario& scenario : scenarios()) {
    for (const DriverSpec& driver : drivers()) {
      if (skipped(scenario, driver).empty()) all.push_back({&scenario, &driver});
    }
  }
  return all;
}

class Rules : public ::testing::TestWithParam<Param> {};

TEST_P(Rules, Scenario) {
  const Scenario& scenario = *GetParam().scenario;
  const DriverSpec& spec = *GetParam().driver;
  const std::vector<std::string> found = differences(scenario, run(scenario, spec));
  if (const auto why = scenario.known_divergence.find(spec.name);
      why != scenario.known_divergence.end()) {
    // Still there: skipped, saying so. Gone: the entry must go, so the rule is held again.
    ASSERT_FALSE(found.empty()) << scenario.name << " (" << spec.name
                                << ") conforms now: remove its known_divergence";
    GTEST_SKIP() << "KNOWN DIVERGENCE (" << spec.name << "): " << why->second;
  }
  for (const std::string& difference : found) {
    ADD_FAILURE() << scenario.name << " (" << spec.name << "): " << difference;
  }
}

INSTANTIATE_TEST_SUITE_P(Conformance, Rules, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.scenario->name + "_" + info.param.driver->name;
                         });

// ---- the suite itself: it can fail
// ---------------------------------------------------------------

const Scenario& scenario_named(const std::string& name) {
  for (const Scenario& s : scenarios()) {
    if (s.name == name) return s;
  }
  throw std::logic_error("no scenario " + name);
}

// Each part of a scenario's expectation, made wrong, fails it on every driver.
TEST(ConformanceSuite, AWrongExpectationFailsOnEveryDriver) {
  const Scenario& right = scenario_named("FirstTimeExecutes");
  std::vector<std::pair<std::string, Scenario>> wrong(8, {std::string(), right});
  wrong[0].first = "ending";
  wrong[0].second.calls[0].ending = "executed handler response=other";
  wrong[1].first = "runs";
  wrong[1].second.calls[0].runs = 2;
  wrong[2].first = "guard";
  wrong[2].second.held[0].guard = "in_progress";
  wrong[3].first = "local";
  wrong[3].second.held[0].local = "miss";
  wrong[4].first = "events";
  wrong[4].second.events = {"#0 executed redis_guard"};
  wrong[5].first = "metrics";
  wrong[5].second.metrics = "decisions=1 releases=1";
  wrong[6].first = "saw";
  wrong[6].second.calls[0].saw = "key=ok request_id=r2 fingerprint=yes attempt=1";
  wrong[7].first = "fault (at a step the call never takes)";
  wrong[7].second.faults = {Fault{.op = Op::kSinkClaim, .stop = true}};
  for (const DriverSpec& spec : drivers()) {
    EXPECT_TRUE(differences(right, run(right, spec)).empty()) << spec.name;
    for (const auto& [what, scenario] : wrong) {
      EXPECT_FALSE(differences(scenario, run(scenario, spec)).empty())
          << "a wrong " << what << " passed on the " << spec.name << " driver";
    }
  }
}

// A driver that breaks one rule fails the scenarios of that rule: here the sim driver with a
// planted bug.
TEST(ConformanceSuite, ADriverThatBreaksARuleFailsItsScenarios) {
  for (const auto& [plant, area, at_least] :
       {std::tuple{SimTestDriver::Plant::kIgnoresStop, "stops", 5},
        std::tuple{SimTestDriver::Plant::kMissesDeadline, "deadlines", 4}}) {
    const DriverSpec planted{
        "sim", Backends::kSimulated,
        [plant](World& world, test::DriverSetup setup) -> std::unique_ptr<test::TestDriver> {
          return std::make_unique<SimTestDriver>(world, std::move(setup), plant);
        }};
    int failed = 0;
    for (const Scenario& scenario : scenarios()) {
      if (scenario.area != area || !skipped(scenario, planted).empty()) continue;
      if (!differences(scenario, run(scenario, planted)).empty()) ++failed;
    }
    EXPECT_GE(failed, at_least) << "scenarios of " << area << " failed by a planted bug";
  }
}

// Every layer a scenario configures has its state stated, so none is left unchecked by mistake.
TEST(ConformanceTable, EveryScenarioStatesTheStateOfEachLayerItConfigures) {
  for (const Scenario& s : scenarios()) {
    for (const Held& held : s.held) {
      EXPECT_EQ(!held.guard.empty(), s.guard) << s.name << ": the guard's record";
      EXPECT_EQ(!held.sink.empty(), s.sink) << s.name << ": the sink's row";
    }
    EXPECT_FALSE(s.metrics.empty()) << s.name << ": the metrics";
    EXPECT_TRUE(std::any_of(drivers().begin(), drivers().end(),
                            [&](const DriverSpec& d) { return skipped(s, d).empty(); }))
        << s.name << " runs on no driver";
    EXPECT_FALSE(s.area.empty()) << s.name << ": the area";
    for (const Call& call : s.calls) EXPECT_FALSE(call.ending.empty()) << s.name;
  }
}

// docs/semantics.md names each scenario on the line of the row of the outcome table it proves.
TEST(ConformanceTable, DocsSemanticsNamesEachScenarioUnderItsRow) {
  std::ifstream doc(std::string(IDEM_SOURCE_DIR) + "/docs/semantics.md");
  ASSERT_TRUE(doc) << "docs/semantics.md";
  std::map<std::string, std::string> lines;  // a table row's first cell -> its lines
  for (std::string line; std::getline(doc, line);) {
    if (!line.starts_with("| ")) continue;
    lines[line.substr(2, line.find(" |", 2) - 2)] += line;
  }
  for (const Scenario& s : scenarios()) {
    if (s.row.empty()) continue;
    const auto found = lines.find(s.row);
    ASSERT_NE(found, lines.end()) << "docs/semantics.md has no row \"" << s.row << "\"";
    EXPECT_NE(found->second.find("`" + s.name + "`"), std::string::npos)
        << "docs/semantics.md does not name " << s.name << " under \"" << s.row << "\"";
  }
}

}  // namespace
}  // namespace idem::conformance
