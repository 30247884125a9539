// idemctl: operations CLI for idem's Redis guard and PostgreSQL sink. `idemctl --help`, and
// docs/operations.md ("idemctl") for commands, exit codes and examples.
#include <algorithm>
#include <iostream>
#include <iterator>

#include "cli.h"
#include "idem/errors.h"

int main(int argc, char** argv) {
  using namespace idem::ctl;
  CLI::App app{
      "idemctl: inspect, release and purge idem's idempotency records in Redis and PostgreSQL, "
      "migrate the PostgreSQL schema, and read a service's duplicate rate.",
      "idemctl"};
  app.require_subcommand(1);
  app.footer(
      "Connection flags also come from IDEM_REDIS_URL, IDEM_PG_URL, IDEM_NAMESPACE (a flag "
      "wins). Exit codes: 0 ok, 1 unexpected failure, 2 bad arguments, 3 not found, 4 not "
      "owner, 5 refused, 6 backend unavailable, 7 no idem metrics. `idemctl COMMAND --help` for "
      "each command.");
  const Command commands[] = {add_migrate_command(app), add_inspect_command(app),
                              add_release_command(app), add_purge_command(app),
                              add_stats_command(app)};
  // CLI11 reads an unknown first word as a missing subcommand; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    const auto known = [&](const Command& command) { return command.app->get_name() == argv[1]; };
    if (std::none_of(std::begin(commands), std::end(commands), known)) {
      std::cerr << "idemctl: unknown command '" << printable(argv[1])
                << "' (migrate, inspect, release, purge or stats; idemctl --help)\n";
      return kUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);  // prints the help, or the message on stderr
    return code == 0 ? kOk : kUsage;
  }
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    return kUsage;  // unreachable: require_subcommand(1)
  } catch (const CommandError& error) {
    std::cerr << "idemctl: " << idem::redact_credentials(error.what()) << "\n";
    return error.code();
  } catch (const idem::BackendError& error) {
    std::cerr << "idemctl: unavailable: " << idem::redact_credentials(error.what()) << "\n";
    return kUnavailable;
  } catch (const std::exception& error) {
    std::cerr << "idemctl: " << idem::redact_credentials(error.what()) << "\n";
    return kFailure;
  }
}
