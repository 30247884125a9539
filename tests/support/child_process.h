// A process a test runs beside it: an example under test, or a server the harness owns
// (redis-server, pgbouncer, stunnel). Its output can be collected line by line, every wait is
// bounded, and it never outlives the test (killed on destruction, and by the kernel if the test
// process dies first).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace idem::test {

class ChildProcess {
 public:
  /// kCollect: the child's stdout and stderr are read by a thread of the test's, line by line
  /// (wait_for_line(), lines(), tail()). kInherit: the child writes to the test's own (a server
  /// that logs to a file of its own); the test starts no thread for it, so a test that forks
  /// itself afterwards stays single-threaded (TSan stops a forked child of a threaded process
  /// when it starts a thread).
  enum class Output { kCollect, kInherit };

  /// Starts `argv[0]` (searched in PATH when it names no directory) with `argv`. Throws
  /// std::runtime_error when it is not found or cannot start. The child is killed when the
  /// thread that started it ends (PR_SET_PDEATHSIG): start it from a thread that outlives it.
  explicit ChildProcess(std::vector<std::string> argv, Output output = Output::kCollect);
  /// SIGKILLs the child if it still runs, reaps it and joins the reader.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The first output line starting with `prefix`, waiting up to `timeout`; nullopt on timeout,
  /// when the child closed its output first, or with Output::kInherit.
  std::optional<std::string> wait_for_line(std::string_view prefix,
                                           std::chrono::milliseconds timeout);
  enum class Start { kServing, kExited, kTimedOut };
  /// Calls `serves` every `interval` until it returns true (kServing), the child exits (kExited)
  /// or `timeout` passes (kTimedOut; the child is killed and reaped then).
  Start wait_until_serving(const std::function<bool()>& serves, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds interval);
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

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
bool accepts_on_loopback(int port);

}  // namespace idem::test
