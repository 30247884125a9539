// One blocking hiredis connection. Not thread-safe: a Pool hands it to one thread at a time.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string_view>

#include "redis/reply.h"
#include "redis/url.h"

namespace idem::detail {

class TlsTransport;

/// What a connection needs to open.
struct ConnectionSettings {
  RedisEndpoint endpoint;
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds command_timeout{500};
  bool keepalive = true;
  /// After AUTH and SELECT, send ROLE and refuse (retryable idem::RedisError) a server that is
  /// not a master: a Sentinel's answer may be stale during a failover.
  bool require_master = false;
};

class Connection {
 public:
  /// Connects, then sends AUTH and SELECT when the endpoint asks for them (and ROLE with
  /// `require_master`). Throws idem::RedisError.
  explicit Connection(const ConnectionSettings& settings);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Sends one command and reads its reply. An error reply is returned, not thrown (the caller
  /// decides, e.g. on NOSCRIPT). Throws idem::RedisError when the connection fails; from then
  /// on the connection is broken().
  [[nodiscard]] ReplyPtr command(std::span<const std::string_view> args);

  /// Queues one command without sending it (pipelining); read its reply with read_reply().
  void append(std::span<const std::string_view> args);

  /// Flushes queued commands and reads the next reply. Throws like command().
  [[nodiscard]] ReplyPtr read_reply();

  /// Shuts the socket down (both directions), so that a read blocked in another thread returns
  /// with an error at once. The only member that may be called from another thread.
  void shutdown() noexcept;

  /// True once a call failed at the connection level (I/O error, timeout, protocol error):
  /// the stream may hold a late or partial reply, so the connection must not be used again.
  [[nodiscard]] bool broken() const noexcept { return broken_; }

  /// True when the failure showed the server had closed the connection (EOF, reset, abort,
  /// broken pipe) rather than a timeout: typical of an idle pooled connection after a server
  /// restart.
  [[nodiscard]] bool closed_by_server() const noexcept { return closed_by_server_; }

 private:
  struct ContextDeleter {
    void operator()(redisContext* context) const noexcept;
  };

  void connect_plain(const ConnectionSettings& settings);  // hiredis' own socket
  [[noreturn]] void fail(int saved_errno, std::string_view during);

  std::unique_ptr<redisContext, ContextDeleter> context_;  // null with TLS
  std::unique_ptr<TlsTransport> tls_;                      // rediss:// only
  bool broken_ = false;
  bool closed_by_server_ = false;
  bool answered_ = false;  // a reply has come on hiredis's (plaintext) socket
};

}  // namespace idem::detail
