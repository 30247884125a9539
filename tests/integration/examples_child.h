// An example under test, for the examples' end-to-end tests: an HTTP server run as a child
// process (ChildProcess) against the shared Redis and PostgreSQL.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "child_process.h"

namespace idem::test {

/// An example HTTP server under test, run against the shared Redis and PostgreSQL
/// (IDEM_TEST_REDIS_URL, IDEM_TEST_PG_URL) in a PostgreSQL schema and an idem namespace of its
/// own, both named `schema`.
struct ExampleServer {
  std::string redis_url;  ///< empty when IDEM_TEST_REDIS_URL is unset
  std::string pg_url;     ///< empty when IDEM_TEST_PG_URL is unset
  std::string schema;
  std::unique_ptr<ChildProcess> process;
  int port = 0;  ///< 0 until it listens

  /// Starts `argv[0]` with `argv`, then --port 0, --redis-url, --pg-url (`server_pg_url`, else
  /// pg_url), --schema and --ns (a unique name made from `stem`), and waits up to 20 s for its
  /// `listening on http://127.0.0.1:PORT`. Starts nothing when either URL is unset.
  void start(std::vector<std::string> argv, const std::string& stem,
             const std::string& server_pg_url = "");
  /// Stops the server with SIGTERM, expecting exit code 0, and drops its schema and its
  /// namespace's Redis keys. Does nothing when it was not started.
  void stop();
  /// The Redis keys of its namespace.
  [[nodiscard]] std::vector<std::string> keys() const;
};

/// The integer after ` name=` in a `key=value ...` summary line an example printed; 0 when absent.
long long summary_field(const std::string& line, const std::string& name);

}  // namespace idem::test
