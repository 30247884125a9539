// Command-line flags the examples share (CLI11): the servers an example uses, and how a command
// line is parsed. Header-only; each example includes it from its main.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <system_error>

namespace examples {

/// Largest request body the HTTP examples read, in bytes: idem's payload limit (1 MiB,
/// FingerprintOptions::max_payload_bytes) with room for an envelope around it. A larger one is
/// refused before it is read whole (cpp-httplib: 413; RESTinio: the connection is closed).
inline constexpr std::size_t kMaxBodyBytes = std::size_t{2} * 1024 * 1024;

/// The servers an example uses and where it keeps its data. The values a field holds when
/// add_service_flags() is called are the defaults `--help` shows.
struct ServiceFlags {
  std::string redis_url{};  ///< --redis-url; else $IDEM_TEST_REDIS_URL
  std::string pg_url{};     ///< --pg-url; else $IDEM_TEST_PG_URL
  std::string schema;  ///< --schema: PostgreSQL schema of the example's tables and idem's records
  std::string ns;      ///< --ns: idem namespace (RedisGuardOptions::ns, PgSinkOptions::ns)
  /// --pg-connections: idem's PostgreSQL connections at most (PgSinkOptions::pool_size, opened
  /// as needed); an open transaction holds one.
  std::size_t pg_connections = 8;
};

/// Adds --redis-url to `app`: required; from IDEM_TEST_REDIS_URL (which `scripts/dev services
/// start` writes to .services/env) when not given.
inline CLI::Option* add_redis_url(CLI::App& app, std::string& url) {
  return app.add_option("--redis-url", url, "Redis URL, redis://[:password@]host:port[/db]")
      ->envname("IDEM_TEST_REDIS_URL")
      ->required();
}

/// Adds --pg-url to `app`: required; from IDEM_TEST_PG_URL when not given.
inline CLI::Option* add_pg_url(CLI::App& app, std::string& url) {
  return app
      .add_option("--pg-url", url, "PostgreSQL connection string, postgresql://user@host:port/db")
      ->envname("IDEM_TEST_PG_URL")
      ->required();
}

/// Adds --port to `app`: 0..65535, 0 picks a free port (the server prints it).
inline CLI::Option* add_port_option(CLI::App& app, int& port) {
  return app
      .add_option("--port", port,
                  "Port to listen on; 0 picks a free port (the server prints `listening on "
                  "http://HOST:PORT`)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
}

/// Adds --host (the address to listen on) and --port (add_port_option) to `app`.
inline void add_listen_options(CLI::App& app, std::string& host, int& port) {
  add_port_option(app, port);
  app.add_option("--host", host, "Address to listen on")->capture_default_str();
}

/// Accepts a whole number from `least` to 2^64 - 1 (counts, durations). Unlike
/// CLI::PositiveNumber it rejects 1.5, -1 and out-of-range numbers, and its message shows the
/// value (CLI11 2.1 prints PositiveNumber's bound, DBL_MAX, in full).
inline CLI::Validator whole_number(std::uint64_t least) {
  return CLI::Validator(
      [least](const std::string& text) {
        std::uint64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        return error == std::errc() && end == text.data() + text.size() && value >= least
                   ? std::string()
                   : "needs a whole number from " + std::to_string(least) + ", got '" + text + "'";
      },
      least > 0 ? "POSITIVE" : "NON-NEGATIVE");
}

/// Adds option `flag` to `app`, bound to `value` (the default --help shows), accepting only a whole
/// number above 0.
template <class T>
CLI::Option* add_positive_option(CLI::App& app, const std::string& flag, T& value,
                                 const std::string& help) {
  return app.add_option(flag, value, help)->check(whole_number(1))->capture_default_str();
}

/// add_positive_option() that accepts 0 too (a duration where 0 means none or no limit).
template <class T>
CLI::Option* add_non_negative_option(CLI::App& app, const std::string& flag, T& value,
                                     const std::string& help) {
  return app.add_option(flag, value, help)->check(whole_number(0))->capture_default_str();
}

/// Adds --handler-delay-ms to `app`: milliseconds each call waits in its transaction, `what` it
/// stands for (e.g. "a slow payment gateway"), so that a retry can arrive while the first runs.
template <class Duration>
CLI::Option* add_handler_delay_option(CLI::App& app, Duration& delay, const std::string& what) {
  return add_non_negative_option(app, "--handler-delay-ms", delay,
                                 "Milliseconds each call waits in its transaction (" + what + ")");
}

/// Adds --redis-url, --pg-url, --schema, --ns and --pg-connections to `app`, bound to `flags`.
inline void add_service_flags(CLI::App& app, ServiceFlags& flags) {
  add_redis_url(app, flags.redis_url);
  add_pg_url(app, flags.pg_url);
  app.add_option("--schema", flags.schema, "PostgreSQL schema of the tables and idem's records")
      ->capture_default_str();
  app.add_option("--ns", flags.ns, "idem namespace of the keys and records")->capture_default_str();
  add_positive_option(app, "--pg-connections", flags.pg_connections,
                      "idem's PostgreSQL connections at most (an open transaction holds one)");
}

/// Parses the command line into the options of `app`. `--help` prints the help and exits 0; a
/// usage error (unknown flag, missing or malformed value) prints the message and exits 2.
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    std::exit(app.exit(error) == 0 ? 0 : 2);
  }
}

}  // namespace examples
