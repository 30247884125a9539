// idemctl migrate and purge: the PostgreSQL sink's schema and its expired rows.
#include <iostream>

#include "cli.h"

namespace idem::ctl {
namespace {

struct PgFlags {
  BackendFlags backends{};
  std::size_t batch = 1000;
  bool expired = false;
  bool json = false;
};

std::unique_ptr<PgSink> required_sink(const PgFlags& flags) {
  std::unique_ptr<PgSink> sink = flags.backends.sink();
  if (!sink) throw CommandError(kUsage, "no PostgreSQL configured: give --pg or IDEM_PG_URL");
  return sink;
}

// Runs `body` against PostgreSQL; a backend error ends the command (as unavailable).
template <class Body>
void on_postgres(const PgFlags& flags, Body&& body) {
  if (const auto error = backend_error(body)) {
    throw CommandError(error->code(),
                       "postgres " + flags.backends.pg_table_label() + ": " + error->message);
  }
}

int migrate(const PgFlags& flags) {
  const std::unique_ptr<PgSink> sink = required_sink(flags);
  PgSink::Migration done;
  // Both versions read under the migration's lock: run at once with another, each says what
  // it did.
  on_postgres(flags, [&] { done = sink->migrate_schema(); });
  const std::string table = flags.backends.pg_schema + "." + flags.backends.pg_table;
  if (flags.json) {
    print_json({{"table", table}, {"schema_version", done.to}, {"previous_version", done.from}});
  } else if (done.from == done.to) {
    std::cout << table << ": schema version " << done.to << " (already up to date)\n";
  } else {
    std::cout << table << ": schema version " << done.to << " (was " << done.from << ")\n";
  }
  return kOk;
}

int purge(const PgFlags& flags) {
  const std::unique_ptr<PgSink> sink = required_sink(flags);
  std::size_t removed = 0;
  on_postgres(flags, [&] { removed = sink->purge_expired(flags.batch); });
  const std::string table = flags.backends.pg_schema + "." + flags.backends.pg_table;
  if (flags.json) {
    print_json({{"table", table}, {"removed", removed}, {"batch", flags.batch}});
  } else {
    std::cout << table << ": removed " << removed << " expired rows\n";
  }
  return kOk;
}

}  // namespace

Command add_migrate_command(CLI::App& app) {
  auto flags = std::make_shared<PgFlags>();
  CLI::App* sub = app.add_subcommand(
      "migrate",
      "Create or upgrade the PostgreSQL records table (PgSink::migrate; idempotent, safe to run "
      "from many processes at once) and print its schema version");
  add_backend_flags(*sub, flags->backends, Backends::kPgOnly);
  add_json_flag(*sub, flags->json);
  sub->footer("Exit: 0 done, 2 bad arguments, 6 PostgreSQL unavailable or refused.");
  return {sub, [flags] { return migrate(*flags); }};
}

Command add_purge_command(CLI::App& app) {
  auto flags = std::make_shared<PgFlags>();
  CLI::App* sub = app.add_subcommand(
      "purge",
      "Delete the rows whose expiry (PostgreSQL's now()) has passed, in every namespace of the "
      "table, in short transactions of at most --batch rows (PgSink::purge_expired), and print "
      "how many were removed");
  sub->add_flag("--expired", flags->expired, "Required: purge the expired rows")->required();
  sub->add_option("--batch", flags->batch, "Rows deleted per transaction")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  add_backend_flags(*sub, flags->backends, Backends::kPgOnly);
  add_json_flag(*sub, flags->json);
  sub->footer(
      "Exit: 0 done (also when nothing expired), 2 bad arguments, 6 PostgreSQL unavailable.");
  return {sub, [flags] { return purge(*flags); }};
}

}  // namespace idem::ctl
