// The blocking guard's `rediss://` transport: hiredis 0.14 cannot do TLS, so this owns the socket
// and TLS (asio::ssl over OpenSSL, driven synchronously on a private io_context so that every
// step has a timeout); it writes commands with RespCommand and parses replies with hiredis's
// redisReader. Not thread-safe, like Connection, except shutdown().
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string_view>

#include "redis/reply.h"
#include "redis/url.h"

namespace idem::detail {

class TlsTransport {
 public:
  /// Resolves, connects (within `connect_timeout`, ms) and completes the TLS handshake
  /// (verifying the server as docs/async.md says). Each later read or write has
  /// `command_timeout`. Throws idem::RedisError, or idem::ConfigError when the endpoint's TLS
  /// files cannot be loaded.
  TlsTransport(const RedisEndpoint& endpoint, std::chrono::milliseconds connect_timeout,
               std::chrono::milliseconds command_timeout, bool keepalive);
  ~TlsTransport();
  /// Loads the endpoint's TLS files as a connection would; throws idem::ConfigError when one
  /// cannot be loaded (RedisGuard's constructor calls it).
  static void check(const RedisEndpoint& endpoint);
  TlsTransport(const TlsTransport&) = delete;
  TlsTransport& operator=(const TlsTransport&) = delete;

  /// Queues one command (sent by the next read_reply()).
  void append(std::span<const std::string_view> args);
  /// Writes what is queued, then reads until one whole reply is parsed. Throws idem::RedisError
  /// (a timeout, an I/O or TLS error, a protocol error); the transport is then unusable.
  [[nodiscard]] ReplyPtr read_reply();
  /// Shuts the socket down so that a blocked read_reply() in another thread fails at once.
  void shutdown() noexcept;
  /// Whether the last failure was the server closing the connection (EOF, reset, abort,
  /// broken pipe).
  [[nodiscard]] bool closed_by_server() const noexcept { return closed_by_server_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool closed_by_server_ = false;
};

}  // namespace idem::detail
