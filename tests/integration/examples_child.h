// Runs an example binary as a child process for the examples' end-to-end tests: its output is
// collected line by line, every wait is bounded, and the child never outlives the test (killed
// on destruction, and by the kernel if the test process dies first).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace idem::test {

class ChildProcess {
 public:
  /// Starts `argv[0]` with `argv`; stdout and stderr are collected. Throws std::runtime_error
  /// when it cannot start.
  explicit ChildProcess(std::vector<std::string> argv);
  /// SIGKILLs the child if it still runs, reaps it and joins the reader.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The first output line starting with `prefix`, waiting up to `timeout`; nullopt on timeout
  /// or when the child closed its output first.
  std::optional<std::string> wait_for_line(std::string_view prefix,
                                           std::chrono::milliseconds timeout);
  /// Sends `signal` to the child (no-op once it was reaped).
  void signal(int signal);
  /// Waits up to `timeout` for the child to exit; its exit code (128 + signal when killed), or
  /// nullopt when it still runs. Once it exited, lines() holds everything it wrote (waiting up to
  /// 2 s more for the pipe to drain).
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  /// Every line printed so far.
  [[nodiscard]] std::vector<std::string> lines() const;
  /// The last `n` lines, joined, for failure messages.
  [[nodiscard]] std::string tail(std::size_t n = 20) const;

 private:
  void read_output(int fd);

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> lines_;
  bool output_closed_ = false;
  std::thread reader_;
};

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
