// The agent-run demo (`scripts/dev demo --agent`): N agent runs of 3 to 5 steps, each run a
// chain of LLM calls (a deterministic fake that counts calls and tokens) ending in a tool that
// books a ledger row in PostgreSQL. Deliveries fail the way a queue and a platform make them
// fail: a tool that errors (the run is redelivered at once), a process that dies between two
// steps (its claim is kept until the lease ends, then the run is redelivered), and a finished
// run delivered again. The same runs and the same faults go through three handlers:
//   none   the handler as written, every delivery runs it;
//   whole  the handler inside Deduplicator::run(): a finished run is not run again, but a retry
//          runs every step again;
//   steps  the same, with each step in Context::step(): a retry replays the finished steps.
// The table counts, per run: LLM calls, tokens, tool effects (ledger rows), and the steps that
// ran again after they had finished.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <pqxx/pqxx>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  examples::ServiceFlags services;
  int runs = 200;
  std::uint64_t seed = 1;
  int lease_ms = 200;
};

// What goes wrong in one delivery of a run: nothing, a tool error before step `at`, or the
// process dying before step `at` (at = steps + 1: after the last step, before the ack).
struct Fault {
  enum Kind { kNone, kError, kCrash } kind = kNone;
  int at = 0;
};

// One run's plan: its step count, the fault of each delivery, whether it is delivered again
// after it finished. Drawn from the seed alone, so every mode sees the same.
struct RunPlan {
  int steps = 3;
  std::vector<Fault> faults;  // by delivery, from the first; none past the end
  bool redelivered = false;
};

std::vector<RunPlan> plan_runs(const Flags& flags) {
  std::mt19937_64 rng(flags.seed);
  std::uniform_real_distribution<double> p(0.0, 1.0);
  std::vector<RunPlan> plans(static_cast<std::size_t>(flags.runs));
  for (RunPlan& plan : plans) {
    plan.steps = 3 + static_cast<int>(rng() % 3);
    for (int delivery = 0; delivery < 3; ++delivery) {
      const double draw = p(rng);
      const double crash = delivery == 0 ? 0.25 : 0.10;
      const double error = delivery == 0 ? 0.20 : 0.05;
      Fault fault;
      if (draw < crash) {
        fault = {Fault::kCrash, 2 + static_cast<int>(rng() % static_cast<unsigned>(plan.steps))};
      } else if (draw < crash + error) {
        fault = {Fault::kError,
                 2 + static_cast<int>(rng() % static_cast<unsigned>(plan.steps - 1))};
      }
      plan.faults.push_back(fault);
    }
    plan.redelivered = p(rng) < 0.3;
  }
  return plans;
}

struct Counts {
  std::int64_t llm_calls = 0;
  std::int64_t tokens = 0;
  std::int64_t deliveries = 0;
  std::int64_t rerun_steps = 0;  // a step that ran again after it had finished
  std::int64_t effects = 0;      // ledger rows
  std::int64_t max_effects = 0;  // of one run
  double seconds = 0;
};

class Demo {
 public:
  Demo(const Flags& flags, std::vector<RunPlan> plans)
      : flags_(flags), plans_(std::move(plans)), db_(flags.services.pg_url) {
    pqxx::work tx(db_);
    tx.exec0("CREATE SCHEMA IF NOT EXISTS " + schema());
    tx.exec0("CREATE TABLE IF NOT EXISTS " + schema() +
             ".ledger (mode text NOT NULL, run integer NOT NULL)");
    tx.exec0("DELETE FROM " + schema() + ".ledger");
    tx.commit();
  }

  Counts run(const std::string& mode) {
    mode_ = mode;
    counts_ = Counts{};
    finished_steps_.clear();
    std::unique_ptr<idem::Deduplicator> dedup;
    if (mode != "none") {
      idem::RedisGuardOptions guard;
      guard.redis.url = flags_.services.redis_url;
      guard.ns = schema() + "-" + mode + "-" + std::to_string(flags_.seed) + "-" +
                 std::to_string(Clock::now().time_since_epoch().count());
      guard.lease = std::chrono::milliseconds(flags_.lease_ms);
      idem::DeduplicatorOptions options;
      options.guard = std::make_shared<idem::RedisGuard>(guard);
      options.local_cache_capacity = 0;  // every delivery asks Redis, as separate processes would
      dedup = std::make_unique<idem::Deduplicator>(std::move(options));
    }
    // The queue: (not before, run, delivery).
    std::multimap<Clock::time_point, std::pair<int, int>> queue;
    const auto start = Clock::now();
    for (int r = 0; r < flags_.runs; ++r) queue.emplace(start, std::pair{r, 0});
    std::vector<char> delivered_again(plans_.size(), 0);  // a finished run is delivered once more
    // kUnavailable (Redis down, the guard failing closed): nothing ran, the run is delivered
    // again later; after this many in a row the demo stops with an error instead.
    constexpr int kMaxUnavailableInARow = 50;
    int unavailable_in_a_row = 0;
    std::string unreachable;
    while (!queue.empty()) {
      auto next = queue.begin();
      std::this_thread::sleep_until(next->first);
      const auto [r, delivery] = next->second;
      queue.erase(next);
      ++counts_.deliveries;
      const RunPlan& plan = plans_[static_cast<std::size_t>(r)];
      const Fault fault = delivery < static_cast<int>(plan.faults.size())
                              ? plan.faults[static_cast<std::size_t>(delivery)]
                              : Fault{};
      const auto later = [&](std::chrono::milliseconds delay) {
        queue.emplace(Clock::now() + delay, std::pair{r, delivery + 1});
      };
      try {
        if (!dedup) {
          (void)handler(r, fault, nullptr);
        } else {
          idem::Request request;
          request.request_id = "run-" + std::to_string(r);
          request.user = "agent";
          request.intent = "trip";
          request.biz_key = "run-" + std::to_string(r);
          const idem::Outcome outcome = dedup->run(
              request, [&](idem::Context& context) { return handler(r, fault, &context); });
          if (outcome.kind == idem::Outcome::Kind::kUnavailable &&
              ++unavailable_in_a_row >= kMaxUnavailableInARow) {
            unreachable = outcome.error;  // Redis stays away: give up rather than loop
            break;
          }
          if (outcome.kind == idem::Outcome::Kind::kInProgress ||
              outcome.kind == idem::Outcome::Kind::kUnavailable) {
            later(std::chrono::milliseconds(flags_.lease_ms / 2));  // nack: try again later
            continue;
          }
          unavailable_in_a_row = 0;
        }
        if (plan.redelivered && delivered_again[static_cast<std::size_t>(r)] == 0) {
          delivered_again[static_cast<std::size_t>(r)] = 1;
          later(std::chrono::milliseconds(0));
        }
      } catch (const idem::Cancelled&) {
        // The process died: the queue redelivers after its visibility timeout (one lease).
        later(std::chrono::milliseconds(flags_.lease_ms + 20));
      } catch (const std::runtime_error&) {
        later(std::chrono::milliseconds(0));  // the tool failed: nack, redelivered at once
      }
    }
    if (!unreachable.empty()) {
      throw std::runtime_error("idem's guard stayed unavailable (" + unreachable +
                               "): the runs were not done");
    }
    counts_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    pqxx::work tx(db_);
    const pqxx::row row = tx.exec_params1(
        "SELECT coalesce(sum(n), 0), coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM " +
            schema() + ".ledger WHERE mode = $1 GROUP BY run) per_run",
        mode);
    counts_.effects = row[0].as<std::int64_t>();
    counts_.max_effects = row[1].as<std::int64_t>();
    tx.commit();
    return counts_;
  }

 private:
  std::string schema() const { return flags_.services.schema; }

  // The agent's handler: steps 1..n-1 are LLM calls, step n books the trip with a tool.
  std::string handler(int r, const Fault& fault, idem::Context* context) {
    const int steps = plans_[static_cast<std::size_t>(r)].steps;
    std::string memory = "user: plan my trip #" + std::to_string(r);
    for (int s = 1; s <= steps; ++s) {
      if (fault.at == s && fault.kind == Fault::kCrash) throw idem::Cancelled();
      if (fault.at == s && fault.kind == Fault::kError) {
        throw std::runtime_error("tool unavailable");
      }
      const std::string name = s < steps ? "llm-" + std::to_string(s) : "book";
      const auto body = [&, s, name] {
        if (finished_steps_.contains({r, name})) ++counts_.rerun_steps;
        std::string result = s < steps ? llm(memory) : book(r);
        finished_steps_.insert({r, name});
        return result;
      };
      const bool with_steps = context != nullptr && mode_ == "steps";
      memory += "\n" + (with_steps ? context->step(name, memory, body) : body());
    }
    if (fault.at == steps + 1 && fault.kind == Fault::kCrash) throw idem::Cancelled();
    return memory.substr(memory.rfind('\n') + 1);
  }

  // The fake LLM: deterministic, its tokens the prompt's and the answer's, by length.
  std::string llm(const std::string& prompt) {
    ++counts_.llm_calls;
    const std::string answer = "assistant: next, step " + std::to_string(prompt.size() % 97);
    counts_.tokens += static_cast<std::int64_t>((prompt.size() + answer.size()) / 4);
    return answer;
  }

  // The tool: books one ledger row.
  std::string book(int r) {
    pqxx::work tx(db_);
    tx.exec_params0("INSERT INTO " + schema() + ".ledger (mode, run) VALUES ($1, $2)", mode_, r);
    tx.commit();
    return "tool: booked trip #" + std::to_string(r);
  }

  const Flags& flags_;
  std::vector<RunPlan> plans_;
  pqxx::connection db_;
  std::string mode_;
  Counts counts_;
  std::set<std::pair<int, std::string>> finished_steps_;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  flags.services.schema = "idem_agent_demo";
  CLI::App app{"idem-agent-runs: agent runs with redeliveries and crashes, run three ways",
               "idem-agent-runs"};
  examples::add_redis_url(app, flags.services.redis_url);
  examples::add_pg_url(app, flags.services.pg_url);
  app.add_option("--schema", flags.services.schema, "PostgreSQL schema of the ledger")
      ->capture_default_str();
  app.add_option("--runs", flags.runs, "Agent runs")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--seed", flags.seed, "Seed of the runs and their faults")->capture_default_str();
  app.add_option("--lease-ms", flags.lease_ms,
                 "The guard's lease, ms (a dead run's claim lives this long)")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  examples::parse_or_exit(app, argc, argv);
  try {
    Demo demo(flags, plan_runs(flags));
    std::cout << "idem-agent-runs: " << flags.runs << " agent runs of 3-5 steps (LLM calls, then a "
              << "tool booking a ledger row), seed " << flags.seed << "\n\n"
              << "| handler | LLM calls / run | tokens / run | tool effects / run | most effects "
                 "in one run | finished steps run again | deliveries | s |\n"
              << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
    const double runs = flags.runs;
    std::vector<std::string> results;  // one line per handler, for scripts
    for (const std::string mode : {"none", "whole", "steps"}) {
      const Counts c = demo.run(mode);
      std::cout << std::fixed << std::setprecision(2) << "| " << mode << " | "
                << static_cast<double>(c.llm_calls) / runs << " | "
                << static_cast<double>(c.tokens) / runs << " | "
                << static_cast<double>(c.effects) / runs << " | " << c.max_effects << " | "
                << c.rerun_steps << " | " << c.deliveries << " | " << std::setprecision(1)
                << c.seconds << " |\n";
      results.push_back("result mode=" + mode + " runs=" + std::to_string(flags.runs) +
                        " llm_calls=" + std::to_string(c.llm_calls) + " tokens=" +
                        std::to_string(c.tokens) + " effects=" + std::to_string(c.effects) +
                        " max_effects=" + std::to_string(c.max_effects) +
                        " rerun_steps=" + std::to_string(c.rerun_steps));
    }
    std::cout << "\nnone: every delivery runs every step. whole: idem around the call, so a "
                 "finished run is not run again,\nbut a retry runs its steps again. steps: each "
                 "step in Context::step(), so a retry replays the finished ones.\n\n";
    for (const std::string& line : results) std::cout << line << "\n";
  } catch (const std::exception& error) {
    std::cerr << "idem-agent-runs: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
