// idem-bench-pg: throughput of the Postgres sink, the counterpart of the pgbench scripts that
// bench/pg.sh writes (the same SQL). Usage:
//   idem-bench-pg --url URL --schema S --setup
//   idem-bench-pg --url URL --schema S --mode claim|claim_plus_update --clients N --seconds T
//                 [--pooling session|transaction]
// --setup migrates the records table and creates `accounts` (1000 rows). A run prints the
// transactions per second on stdout; every client first does one untimed warm-up transaction
// (its connection is opened then, as pgbench excludes connection time).
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <pqxx/pqxx>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "clients.h"
#include "idem/errors.h"
#include "idem/pg_sink.h"

namespace {

constexpr int kAccounts = 1000;

struct Args {
  std::string url;
  std::string schema = "idem_bench";
  std::string mode = "claim";
  int clients = 1;
  double seconds = 5;
  bool setup = false;
  bool transaction_pooling = false;  // --pooling transaction: PgPooling::kTransaction
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + std::string(flag));
      return argv[++i];
    };
    if (flag == "--url")
      args.url = value();
    else if (flag == "--schema")
      args.schema = value();
    else if (flag == "--mode")
      args.mode = value();
    else if (flag == "--clients")
      args.clients = std::stoi(value());
    else if (flag == "--seconds")
      args.seconds = std::stod(value());
    else if (flag == "--setup")
      args.setup = true;
    else if (flag == "--pooling")
      args.transaction_pooling = value() == "transaction";
    else
      throw std::invalid_argument("unknown argument " + std::string(flag));
  }
  if (args.url.empty()) throw std::invalid_argument("--url is required");
  if (args.mode != "claim" && args.mode != "claim_plus_update") {
    throw std::invalid_argument("--mode must be claim or claim_plus_update");
  }
  if (args.clients < 1 || args.seconds <= 0) throw std::invalid_argument("bad --clients/--seconds");
  return args;
}

idem::PgSinkOptions sink_options(const Args& args) {
  idem::PgSinkOptions options;
  options.conninfo = args.url;
  options.schema = args.schema;
  options.ns = "bench";
  options.pool_size = static_cast<std::size_t>(args.clients);
  if (args.transaction_pooling) options.pooling = idem::PgPooling::kTransaction;
  return options;
}

void setup(const Args& args) {
  idem::PgSink sink(sink_options(args));
  sink.migrate();
  sink.transact([&](pqxx::transaction_base& tx) {
    const std::string accounts = tx.quote_name(args.schema) + ".accounts";
    tx.exec("DROP TABLE IF EXISTS " + accounts);
    tx.exec("CREATE TABLE " + accounts + " (id integer PRIMARY KEY, balance bigint NOT NULL)");
    tx.exec("INSERT INTO " + accounts + " SELECT g, 0 FROM generate_series(1, " +
            std::to_string(kAccounts) + ") g");
  });
}

double run(const Args& args) {
  idem::PgSink sink(sink_options(args));
  const bool with_update = args.mode == "claim_plus_update";
  const std::string update_sql =
      "UPDATE \"" + args.schema + "\".accounts SET balance = balance + 1 WHERE id = $1";
  return bench::calls_per_second(args.clients, args.seconds, [&](int c, const auto& measure) {
    std::mt19937 rng(static_cast<unsigned>(c) + 1);
    std::uniform_int_distribution<int> account(1, kAccounts);
    const std::string prefix =
        "idem:" + std::to_string(c) + ":" +
        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ":";
    long n = 0;
    const auto once = [&] {
      const std::string key = prefix + std::to_string(n++);
      if (!with_update) {
        if (sink.claim(key, "req", "fp").status != idem::SinkStatus::kClaimed) {
          throw std::runtime_error("unexpected duplicate");
        }
        return;
      }
      sink.transact([&](pqxx::transaction_base& tx) {
        if (sink.claim(tx, key, "req", "fp").status != idem::SinkStatus::kClaimed) {
          throw std::runtime_error("unexpected duplicate");
        }
        // Prepared once per connection (a repeat with the same text is a no-op), as pgbench -M
        // prepared does; unprepared behind a transaction pooler, as the sink's own statements.
        if (args.transaction_pooling) {
          tx.exec_params(update_sql, account(rng));
        } else {
          tx.conn().prepare("bench_update", update_sql);
          tx.exec_prepared("bench_update", account(rng));
        }
      });
    };
    measure(once);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "idem-bench-pg: %s\n", error.what());
    return 1;
  }
  return bench::setup_or_run(
      "idem-bench-pg", args.setup, [&] { setup(args); }, [&] { return run(args); });
}
