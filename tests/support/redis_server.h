// A private redis-server for destructive tests (kill, restart, SCRIPT FLUSH, DEBUG SLEEP): it
// runs on a free loopback port with its own temporary directory and never touches the shared
// server. Also a small redis-cli runner for inspecting a server from a test, and a fake server
// answering with fixed bytes (RawReplyServer).
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"

namespace idem::test {

/// Runs `argv` (searched in PATH) and returns its exit status (-1 when killed by a signal) and,
/// when `output` is set, its stdout and stderr (trailing newlines removed). Throws
/// std::runtime_error when it cannot start.
int run(const std::vector<std::string>& argv, std::string* output);

/// A TCP socket listening on a free loopback port (`backlog` pending connections); sets `port`.
/// Throws std::runtime_error naming `who` when it cannot listen.
int listen_on_loopback(int& port, int backlog, const std::string& who);

/// A free loopback TCP port below 55536 (so that a cluster node's bus port, port + 10000, is
/// valid too).
int free_port();

/// Runs `redis-cli -u url args...` and returns its output (trailing newline removed).
/// Fails the calling test (ADD_FAILURE) when redis-cli exits with an error.
std::string redis_cli(const std::string& url, const std::vector<std::string>& args);

/// One redis-server process owned by the test. Not thread-safe.
class RedisServer {
 public:
  /// Starts redis-server on a free port and waits until it answers PING. With `persistent`,
  /// the server writes an append-only file fsynced on every write (so a reply is only sent for
  /// a durable write) and restart() reloads it. Throws std::runtime_error when it cannot start.
  /// `extra_args` are appended to the redis-server command line (e.g. {"--requirepass", "pw"}).
  explicit RedisServer(bool persistent = false, std::vector<std::string> extra_args = {});
  /// A Redis Sentinel (`redis-server <dir>/sentinel.conf --sentinel`) whose configuration file
  /// holds `config_lines` (e.g. "sentinel monitor m 127.0.0.1 6379 2"); the Sentinel rewrites
  /// it as it learns. Throws std::runtime_error when it cannot start.
  static std::unique_ptr<RedisServer> sentinel(const std::vector<std::string>& config_lines);
  /// Kills the server (if running) and removes its directory.
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// The TCP port.
  [[nodiscard]] int port() const noexcept { return port_; }
  /// `127.0.0.1:<port>`.
  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// `redis://127.0.0.1:<port>/0`.
  [[nodiscard]] std::string url() const;
  /// The server's private directory (for a unix socket path, say).
  [[nodiscard]] const std::filesystem::path& dir() const { return dir_; }
  /// Runs redis-cli against this server.
  std::string cli(const std::vector<std::string>& args) const { return redis_cli(url(), args); }
  /// Whether the server runs (started and not killed).
  [[nodiscard]] bool running() const noexcept { return process_ != nullptr; }
  /// SIGSTOP: the server keeps its sockets (connects still succeed in the kernel's backlog)
  /// but answers nothing, like a paused VM. resume() (or kill()) ends it.
  void pause();
  /// SIGCONT after pause().
  void resume();
  /// SIGKILL and reap; the port stays reserved for restart().
  void kill();
  /// Starts the server again on the same port and directory; waits until it answers PING.
  void restart();

 private:
  struct SentinelMode {};
  RedisServer(SentinelMode, const std::vector<std::string>& config_lines);
  // Starts the server on port_ and waits until it answers; throws when it exits first.
  void start();
  // Picks a free port and starts there, again on another when the server exits at once.
  void start_on_a_free_port();
  // Starts the server on port_: true once it answers PING, false when it exited first; throws
  // std::runtime_error when it did neither within 10 s.
  bool launch();
  [[nodiscard]] std::string exited_message() const;

  bool persistent_;
  bool sentinel_ = false;
  std::vector<std::string> extra_args_;
  int port_ = 0;
  std::filesystem::path dir_;
  std::unique_ptr<ChildProcess> process_;
  bool paused_ = false;
};

/// A loopback TCP server that answers every read of every connection with `reply` (and keeps
/// the connection open), standing in for a broken or hostile Redis or Sentinel: e.g. an array
/// header announcing two billion elements. One thread; stops on destruction.
class RawReplyServer {
 public:
  /// Throws std::runtime_error when it cannot listen.
  explicit RawReplyServer(std::string reply);
  ~RawReplyServer();
  RawReplyServer(const RawReplyServer&) = delete;
  RawReplyServer& operator=(const RawReplyServer&) = delete;

  /// `redis://127.0.0.1:<port>/0`.
  [[nodiscard]] std::string url() const;

 private:
  std::string reply_;
  int port_ = 0;  // before listener_: its initializer sets it
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace idem::test
