// idem-sim: runs seeds of the deterministic simulation (docs/simulation.md) and reports runs,
// steps, faults injected and violations; a failing seed is minimized and its trace printed.
// Exit status: 0 when no seed broke an invariant (with --expect-violation: when one did), 1
// otherwise, 2 for a usage error.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "simulation.h"

namespace {

using idem::sim::Bug;

constexpr std::string_view kUsage =
    "usage: idem-sim [--seeds N] [--from S] [--seed S] [--bug NAME] [--trace] "
    "[--expect-violation]\n"
    "  --seeds N           run N seeds (default 1000), from --from (default 1)\n"
    "  --seed S            run seed S alone; a failing one is minimized, --trace prints its\n"
    "                      whole trace even when it passes\n"
    "  --bug NAME          plant a bug (docs/simulation.md, \"Planted bugs\"), e.g.\n"
    "                      release-on-cancel, stop-ignored-before-handler\n"
    "  --expect-violation  succeed only when a seed breaks an invariant (a planted bug)\n";

[[noreturn]] void usage(const std::string& error) {
  std::cerr << "idem-sim: " << error << "\n" << kUsage;
  std::exit(2);
}

std::uint64_t number(const char* text, const char* flag) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || value == 0 || text[0] == '-' || errno == ERANGE) {
    usage(std::string(flag) + " takes a positive integer, not '" + text + "'");
  }
  return value;
}

void print_trace(const idem::sim::RunResult& r) {
  for (const idem::sim::TraceLine& line : r.trace) {
    std::cout << "  " << line.at << " ms  " << line.text << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seeds = 1000;
  std::uint64_t from = 1;
  bool single = false;
  bool trace = false;
  bool expect_violation = false;
  Bug bug = Bug::kNone;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "--seeds") {
      seeds = number(value(), "--seeds");
    } else if (arg == "--from") {
      from = number(value(), "--from");
    } else if (arg == "--seed") {
      from = number(value(), "--seed");
      seeds = 1;
      single = true;
    } else if (arg == "--bug") {
      const char* name = value();
      const auto parsed = idem::sim::parse_bug(name);
      if (!parsed) usage(std::string("unknown bug '") + name + "'");
      bug = *parsed;
    } else if (arg == "--trace") {
      trace = true;
    } else if (arg == "--expect-violation") {
      expect_violation = true;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else {
      usage("unknown argument '" + std::string(arg) + "'");
    }
  }

  // The last seed, from + seeds - 1, must be a seed: past the largest the loop wrapped around and
  // ran none, reporting success.
  if (seeds - 1 > std::numeric_limits<std::uint64_t>::max() - from) {
    usage("--from " + std::to_string(from) + " with --seeds " + std::to_string(seeds) +
          " runs past the largest seed, " +
          std::to_string(std::numeric_limits<std::uint64_t>::max()));
  }
  if (trace && !single) usage("--trace goes with --seed (one seed's trace)");

  const auto started = std::chrono::steady_clock::now();
  const std::clock_t started_cpu = std::clock();
  std::size_t steps = 0;
  std::size_t calls = 0;
  std::size_t messages = 0;
  std::array<std::size_t, idem::sim::kFaultKinds> faults{};
  std::array<std::size_t, idem::detail::kStepKinds> plan_steps{};
  std::array<std::size_t, 6> endings{};
  std::array<std::size_t, idem::sim::kTallies> tallies{};
  std::vector<std::uint64_t> failing;
  for (std::uint64_t k = 0; k < seeds; ++k) {
    const std::uint64_t seed = from + k;
    const idem::sim::RunResult r = idem::sim::run({.seed = seed, .bug = bug, .trace = trace});
    steps += r.steps;
    calls += r.calls;
    messages += r.messages;
    for (std::size_t k = 0; k < faults.size(); ++k) faults[k] += r.faults[k];
    for (std::size_t k = 0; k < plan_steps.size(); ++k) plan_steps[k] += r.plan_steps[k];
    for (std::size_t k = 0; k < endings.size(); ++k) endings[k] += r.endings[k];
    for (std::size_t k = 0; k < tallies.size(); ++k) tallies[k] += r.tallies[k];
    if (single && trace) {
      std::cout << "seed " << seed << ": " << r.config << "\n";
      print_trace(r);
    }
    if (r.violation) {
      if (failing.size() < 10) {
        std::cout << "seed " << seed << ": VIOLATION " << r.violation->invariant << ": "
                  << r.violation->detail << "\n";
      }
      failing.push_back(seed);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double cpu_seconds = static_cast<double>(std::clock() - started_cpu) / CLOCKS_PER_SEC;
  std::size_t total_faults = 0;
  for (const std::size_t n : faults) total_faults += n;

  std::cout << "idem-sim: " << seeds << " runs (seeds " << from << "-" << from + seeds - 1
            << (bug == Bug::kNone ? "" : ", planted bug " + std::string(to_string(bug))) << "), "
            << steps << " steps, " << calls << " calls, " << messages << " messages, "
            << total_faults << " faults injected, " << failing.size() << " violations; ";
  // CPU time as well: on a shared machine wall time grows with the others' work.
  char rate[96];
  std::snprintf(rate, sizeof rate, "%.2f s (cpu %.2f s), %.0f seeds per cpu second", seconds,
                cpu_seconds, static_cast<double>(seeds) / std::max(cpu_seconds, 1e-9));
  std::cout << rate << "\nfaults:";
  for (std::size_t k = 0; k < faults.size(); ++k) {
    std::cout << (k == 0 ? " " : ", ") << to_string(static_cast<idem::sim::Fault>(k)) << " "
              << faults[k];
  }
  std::cout << "\nplan steps:";
  for (std::size_t k = 0; k < plan_steps.size(); ++k) {
    std::cout << (k == 0 ? " " : ", ") << idem::sim::step_name(k) << " " << plan_steps[k];
  }
  static constexpr std::array<std::string_view, 6> kEndings = {
      "executed", "duplicate", "in_progress", "mismatch", "unavailable", "exception"};
  std::cout << "\ncalls ended:";
  for (std::size_t k = 0; k < endings.size(); ++k) {
    std::cout << (k == 0 ? " " : ", ") << kEndings[k] << " " << endings[k];
  }
  // Coverage: how calls ran and were keyed, where stops and deadlines found them, what failed.
  using idem::sim::Tally;
  const auto print = [&](std::string_view label, Tally first, Tally last) {
    std::cout << "\n" << label << ":";
    for (auto k = static_cast<std::size_t>(first); k <= static_cast<std::size_t>(last); ++k) {
      std::cout << (k == static_cast<std::size_t>(first) ? " " : ", ")
                << to_string(static_cast<Tally>(k)) << " " << tallies[k];
    }
  };
  print("calls", Tally::kTransactional, Tally::kOverCapReplay);
  print("interruptions", Tally::kStoppedBeforeStart, Tally::kCutShort);
  print("saves", Tally::kFailedCompletion, Tally::kFailedRelease);
  print("steps", Tally::kStepRun, Tally::kStepRerun);
  std::cout << "\n";

  if (!failing.empty()) {
    const std::uint64_t first = failing.front();
    std::cout << "first violation at seed " << first;
    if (!single) std::cout << " (the " << first - from + 1 << ". seed run)";
    std::cout << "; minimized:\n"
              << idem::sim::minimize({.seed = first, .bug = bug}).text
              << "replay: scripts/dev sim --seed " << first
              << (bug == Bug::kNone ? "" : " --bug " + std::string(to_string(bug))) << "\n";
  }
  const bool violated = !failing.empty();
  return violated == expect_violation ? 0 : 1;
}
