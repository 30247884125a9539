// idem-bench-e2e: what idem costs a business transaction, the counterpart of the pgbench script
// bench/e2e.sh writes (the same business SQL). Usage:
//   idem-bench-e2e --pg-url URL --schema S --setup
//   idem-bench-e2e --pg-url URL [--redis-url URL] --schema S --mode MODE --clients N --seconds T
// --setup migrates idem's records table and creates the business tables: `accounts` (1000 rows)
// and `ledger` (a refund ledger whose idem_key is UNIQUE, as the seed's second service has it).
// A run prints the calls per second on stdout. MODE:
//   bare            the business transaction alone through libpqxx (BEGIN; INSERT ledger;
//                   UPDATE accounts; COMMIT): the client library's share, no idem
//   sink            Deduplicator::run_transactional() with the Postgres sink only
//   sink_staged     the same, the handler staging its two statements (Context::stage()): they go
//                   with idem's record and COMMIT, two round trips fewer
//   guard_sink      the same with the Redis guard in front
//   guard_sink_staged  guard_sink with the handler staging, as sink_staged
//   key_sink        run_transactional() with TransactionalClaim::kBusinessKey (the ledger's
//                   UNIQUE idem_key is the claim; no record of idem's)
//   key_guard_sink  the same with the Redis guard
//   bare_guard      the bare transaction plus the guard's two calls (RedisGuard::claim() before,
//                   complete() after) without the facade: the floor of the guard's round trips
//   bare_claim      the same without complete(): what the guard's completion costs a call
//   guard_sink_sql  the guard's two calls (as bare_guard) around the statements of a sink call,
//                   sent through libpq's pipeline mode as bench/e2e.sh's floor_claim sends them
//                   (BEGIN, lock and read in one flight; the two business statements; the record
//                   and COMMIT in one flight), no facade: the floor of guard_sink
// Every call is a first execution (a new key). The Deduplicator keeps its defaults (local cache,
// fingerprint of the payload); the business statements are prepared, as pgbench -M prepared
// sends them. Every client first makes one untimed call (its connections open then, as pgbench
// excludes connection time).
#include <libpq-fe.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <memory>
#include <pqxx/pqxx>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "clients.h"
#include "idem/deduplicator.h"
#include "sink/statements.h"

namespace {

constexpr int kAccounts = 1000;

// What each MODE runs (the list at the top of the file).
struct Mode {
  std::string_view name;
  bool facade = false;    // through Deduplicator::run_transactional(), else the bare transaction
  bool guard = false;     // the Redis guard: the facade's, or RedisGuard's own calls around it
  bool complete = false;  // bare: RedisGuard::complete() after the commit
  bool staged = false;    // the handler stages its statements (Context::stage())
  bool business_key = false;  // TransactionalClaim::kBusinessKey
  bool sink_sql = false;      // bare: the sink's statements through libpq (guard_sink_sql)
};
constexpr std::array<Mode, 10> kModes = {{
    {.name = "bare"},
    {.name = "bare_guard", .guard = true, .complete = true},
    {.name = "bare_claim", .guard = true},
    {.name = "guard_sink_sql", .guard = true, .complete = true, .sink_sql = true},
    {.name = "sink", .facade = true},
    {.name = "sink_staged", .facade = true, .staged = true},
    {.name = "guard_sink", .facade = true, .guard = true},
    {.name = "guard_sink_staged", .facade = true, .guard = true, .staged = true},
    {.name = "key_sink", .facade = true, .business_key = true},
    {.name = "key_guard_sink", .facade = true, .guard = true, .business_key = true},
}};

const Mode* find_mode(std::string_view name) {
  for (const Mode& mode : kModes) {
    if (mode.name == name) return &mode;
  }
  return nullptr;
}

struct Args {
  std::string pg_url;
  std::string redis_url;
  std::string schema = "idem_bench_e2e";
  std::string mode = "sink";
  int clients = 1;
  double seconds = 1;
  bool setup = false;
};

// The business transaction's two statements, as bench/e2e.sh gives them to pgbench.
struct BusinessSql {
  std::string ledger;
  std::string account;
};

BusinessSql business_sql(const std::string& schema) {
  return {
      "INSERT INTO \"" + schema + "\".ledger (idem_key, account, amount_cents) VALUES ($1, $2, $3)",
      "UPDATE \"" + schema + "\".accounts SET balance_cents = balance_cents - $1 WHERE id = $2"};
}

void business_write(pqxx::transaction_base& tx, const BusinessSql& sql, const std::string& key,
                    int account) {
  tx.conn().prepare("bench_ledger", sql.ledger);  // prepared once per connection
  tx.conn().prepare("bench_account", sql.account);
  tx.exec_prepared0("bench_ledger", key, account, 500);
  tx.exec_prepared0("bench_account", 500, account);
}

// The statements of a sink call with the business transaction, on one libpq connection in
// pipeline mode, each flight ended by a sync point as the sink sends it (the sink's own texts,
// idem::detail::sink_statements(); bench/e2e.sh's floor_claim.sql). Throws std::runtime_error on
// any error.
class SinkSql {
 public:
  SinkSql(const std::string& url, const std::string& schema,
          const idem::detail::SinkStatements& sink)
      : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_.get()) != CONNECTION_OK) fail("connect");
    const BusinessSql business = business_sql(schema);
    prepare("begin", "BEGIN");
    prepare("lock", sink.lock);
    prepare("lookup", sink.lookup);
    prepare("ledger", business.ledger);
    prepare("account", business.account);
    prepare("record", sink.record);
    prepare("commit", "COMMIT");
    if (PQenterPipelineMode(conn_.get()) != 1) fail("pipeline mode");
  }

  void call(const std::string& key, int account) {
    const std::string idem_key = "u|refund|" + key;
    const std::string request_id = "req-" + key;
    const std::string a = std::to_string(account);
    const char* k = idem_key.c_str();
    flight({{"begin", {}}, {"lock", {"bench", k}}, {"lookup", {"bench", k}}});
    flight({{"ledger", {key.c_str(), a.c_str(), "500"}}});
    flight({{"account", {"500", a.c_str()}}});
    flight(
        {{"record", {"bench", k, request_id.c_str(), kFingerprint, kResponse, nullptr, "86400000"}},
         {"commit", {}}});
  }

 private:
  // A fingerprint's 64 hex digits, and a 40-byte JSON response in bytea's hex form.
  static constexpr const char* kFingerprint =
      "f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f00";
  static constexpr const char* kResponse =
      R"(\x7b22737461747573223a22726566756e646564222c22616d6f756e745f63656e7473223a3530307d)";

  struct Statement {
    const char* name;
    std::vector<const char*> values;  // null: SQL NULL
  };

  void prepare(const char* name, const std::string& sql) {
    const Result result(PQprepare(conn_.get(), name, sql.c_str(), 0, nullptr));
    if (PQresultStatus(result.get()) != PGRES_COMMAND_OK) fail(name);
  }

  // Sends `statements` and a sync point, then reads every result up to the sync's.
  void flight(std::initializer_list<Statement> statements) {
    for (const Statement& statement : statements) {
      if (PQsendQueryPrepared(conn_.get(), statement.name,
                              static_cast<int>(statement.values.size()), statement.values.data(),
                              nullptr, nullptr, 0) != 1) {
        fail(statement.name);
      }
    }
    if (PQpipelineSync(conn_.get()) != 1) fail("sync");
    for (;;) {
      const Result result(PQgetResult(conn_.get()));
      if (result == nullptr) continue;  // the end of one statement's results
      const ExecStatusType status = PQresultStatus(result.get());
      if (status == PGRES_PIPELINE_SYNC) return;
      if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) fail("statement");
    }
  }

  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(std::string("guard_sink_sql: ") + what + ": " +
                             PQerrorMessage(conn_.get()));
  }

  struct Finish {
    void operator()(PGconn* conn) const { PQfinish(conn); }
  };
  struct Clear {
    void operator()(PGresult* result) const { PQclear(result); }
  };
  using Result = std::unique_ptr<PGresult, Clear>;
  std::unique_ptr<PGconn, Finish> conn_;
};

idem::PgSinkOptions sink_options(const Args& args) {
  idem::PgSinkOptions options;
  options.conninfo = args.pg_url;
  options.schema = args.schema;
  options.ns = "bench";
  options.pool_size = static_cast<std::size_t>(args.clients);
  options.business_constraints = {"ledger_idem_key_key"};
  return options;
}

void setup(const Args& args) {
  idem::PgSink sink(sink_options(args));
  sink.migrate();
  sink.transact([&](pqxx::transaction_base& tx) {
    const std::string s = tx.quote_name(args.schema);
    tx.exec0("DROP TABLE IF EXISTS " + s + ".ledger, " + s + ".accounts");
    tx.exec0("CREATE TABLE " + s +
             ".accounts (id integer PRIMARY KEY, balance_cents bigint NOT NULL)");
    tx.exec0("INSERT INTO " + s + ".accounts SELECT g, 100000000 FROM generate_series(1, " +
             std::to_string(kAccounts) + ") g");
    tx.exec0("CREATE TABLE " + s +
             ".ledger (id bigserial PRIMARY KEY, idem_key text NOT NULL UNIQUE,"
             " account integer NOT NULL, amount_cents bigint NOT NULL,"
             " created_at timestamptz NOT NULL DEFAULT now())");
  });
}

// A refund request as a service receives it: request ID, business key, JSON payload.
idem::Request request_for(const std::string& key, int account) {
  idem::Request r;
  r.request_id = "req-" + key;
  r.user = "u-" + std::to_string(account);
  r.intent = "refund";
  r.biz_key = key;
  r.payload = R"({"order_id":")" + key + R"(","user_id":"u-)" + std::to_string(account) +
              R"(","amount":{"value":5.00,"currency":"EUR"},"reason":"damaged"})";
  return r;
}

std::shared_ptr<idem::RedisGuard> redis_guard(const Args& args) {
  if (args.redis_url.empty())
    throw std::invalid_argument("--mode " + args.mode + " needs --redis-url");
  idem::RedisGuardOptions guard;
  guard.redis.url = args.redis_url;
  guard.redis.pool_size = static_cast<std::size_t>(args.clients);
  guard.ns = "e2e-" + std::to_string(::getpid()) + "-" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  guard.retention = std::chrono::seconds(30);  // a run writes ~10^5 keys: let Redis drop them
  return std::make_shared<idem::RedisGuard>(guard);
}

std::unique_ptr<idem::Deduplicator> deduplicator(const Args& args, const Mode& mode) {
  if (!mode.facade) return nullptr;
  idem::DeduplicatorOptions options;
  options.sink = std::make_shared<idem::PgSink>(sink_options(args));
  if (mode.guard) options.guard = redis_guard(args);
  if (mode.business_key) options.transactional_claim = idem::TransactionalClaim::kBusinessKey;
  return std::make_unique<idem::Deduplicator>(std::move(options));
}

double run(const Args& args) {
  const BusinessSql sql = business_sql(args.schema);
  const Mode& mode = *find_mode(args.mode);  // checked by the command line
  const auto dedup = deduplicator(args, mode);
  const auto guard = !mode.facade && mode.guard ? redis_guard(args) : nullptr;
  return bench::calls_per_second(args.clients, args.seconds, [&](int c, const auto& measure) {
    std::mt19937 rng(static_cast<unsigned>(c) + 1);
    std::uniform_int_distribution<int> account(1, kAccounts);
    const std::string prefix =
        "o" + std::to_string(::getpid()) + "-" + std::to_string(c) + "-" +
        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "-";
    std::unique_ptr<pqxx::connection> own;  // bare: one connection per client
    std::unique_ptr<SinkSql> sink_sql;      // guard_sink_sql: the same, through libpq
    if (mode.sink_sql) {
      sink_sql = std::make_unique<SinkSql>(args.pg_url, args.schema,
                                           idem::detail::sink_statements(sink_options(args)));
    } else if (!dedup) {
      own = std::make_unique<pqxx::connection>(args.pg_url);
    }
    long n = 0;
    const auto once = [&] {
      const std::string key = prefix + std::to_string(n++);
      const int a = account(rng);
      if (!dedup) {
        idem::ClaimResult claim;
        if (guard) claim = guard->claim("u:refund:" + key, "req-" + key, "");
        if (sink_sql) {
          sink_sql->call(key, a);
        } else {
          pqxx::work tx(*own);
          business_write(tx, sql, key, a);
          tx.commit();
        }
        if (mode.complete)
          (void)guard->complete("u:refund:" + key, claim.owner_token, R"({"status":"refunded"})");
        return;
      }
      const idem::Outcome outcome = dedup->run_transactional(
          request_for(key, a), [&](pqxx::transaction_base& tx, idem::Context& context) {
            if (mode.staged) {
              context.stage(sql.ledger, {key, std::to_string(a), "500"});
              context.stage(sql.account, {"500", std::to_string(a)});
            } else {
              business_write(tx, sql, key, a);
            }
            return std::string(R"({"status":"refunded","amount_cents":500})");
          });
      if (outcome.kind != idem::Outcome::Kind::kExecuted) {
        throw std::runtime_error("a new key was not executed: " + outcome.error);
      }
    };
    measure(once);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "idem-bench-e2e: calls per second of a business transaction through idem (see "
      "the top of bench/e2e_bench.cc).",
      "idem-bench-e2e"};
  app.add_option("--pg-url", args.pg_url, "PostgreSQL connection string")->required();
  app.add_option("--redis-url", args.redis_url, "Redis URL (the guard modes)");
  app.add_option("--schema", args.schema, "Schema of the business tables and idem's records")
      ->capture_default_str();
  app.add_flag("--setup", args.setup, "Create the tables and exit");
  app.add_option("--mode", args.mode, "What to run")
      ->check([](const std::string& name) {
        return find_mode(name) ? std::string() : "not a mode (see the top of bench/e2e_bench.cc)";
      })
      ->capture_default_str();
  app.add_option("--clients", args.clients, "Client threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--seconds", args.seconds, "Seconds to run")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  return bench::setup_or_run(
      "idem-bench-e2e", args.setup, [&] { setup(args); }, [&] { return run(args); });
}
