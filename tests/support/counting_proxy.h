// A loopback TCP proxy that counts the requests clients send to a server, for tests that count
// the round trips of a call (tests/integration/call_cost_test.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace idem::test {

/// Listens on a free loopback port and forwards every connection to `host:port`, parsing what
/// the client sends:
/// - kPostgres: frontend messages (protocol 3.0) after the startup packet, by type. A round trip
///   is a Query ('Q') or a Sync ('S'): libpq waits for the server's answer after each. The
///   client must not use TLS or GSS encryption (sslmode=disable gssencmode=disable).
/// - kRedis: RESP commands (arrays); each is a round trip for a client that does not pipeline.
/// Counters are thread-safe; one thread per proxied connection. Stops on destruction.
class CountingProxy {
 public:
  enum class Protocol { kPostgres, kRedis };

  /// Throws std::runtime_error when it cannot listen.
  CountingProxy(Protocol protocol, std::string host, int port);
  ~CountingProxy();
  CountingProxy(const CountingProxy&) = delete;
  CountingProxy& operator=(const CountingProxy&) = delete;

  /// The proxy's port on 127.0.0.1.
  [[nodiscard]] int port() const noexcept { return port_; }
  /// Round trips since the last reset(): Queries and Syncs, or Redis commands.
  [[nodiscard]] std::size_t round_trips() const;
  /// PostgreSQL frontend messages since the last reset(), by type ('Q', 'P', 'B', 'E', 'S', …).
  [[nodiscard]] std::map<char, std::size_t> messages() const;
  /// Redis commands since the last reset(), by name (uppercased).
  [[nodiscard]] std::map<std::string, std::size_t> commands() const;
  /// Zeroes every counter.
  void reset();

 private:
  struct Parser;
  void accept_loop();
  void forward(int client);
  void count(Parser& parser, const char* data, std::size_t size);

  Protocol protocol_;
  std::string host_;
  int target_port_;
  int listener_ = -1;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;  // the counters and threads_
  std::map<char, std::size_t> messages_;
  std::map<std::string, std::size_t> commands_;
  std::size_t round_trips_ = 0;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace idem::test
