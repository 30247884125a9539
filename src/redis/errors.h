// Every hiredis failure becomes an idem::RedisError here, and only here.
#pragma once

#include <string_view>
#include <system_error>

#include "idem/errors.h"

struct redisContext;
struct redisReply;
struct redisReader;

namespace idem::detail {

/// The error of a context whose last call failed (`context->err` set, or a null context after
/// a failed connect). `saved_errno` is errno right after the failing call (it tells a timeout,
/// EAGAIN, from other I/O errors). `during` names the operation, e.g. "connect" or "EVALSHA".
[[nodiscard]] RedisError context_error(const redisContext* context, int saved_errno,
                                       std::string_view during);

/// The error for an error reply (`reply->type == REDIS_REPLY_ERROR`). Retryable for the
/// transient server states: LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY,
/// MOVED, ASK.
[[nodiscard]] RedisError reply_error(const redisReply& reply, std::string_view during);

/// The error for a reply of a type the caller did not expect (not retryable).
[[nodiscard]] RedisError unexpected_reply(const redisReply& reply, std::string_view during);

/// The error of a socket or TLS operation of the Asio transports (async connection, blocking
/// TLS transport): EOF and resets say the server closed the connection; all are retryable
/// except TLS certificate failures.
[[nodiscard]] RedisError io_error(const std::error_code& error, std::string_view during);

/// Whether `error`, of an Asio transport, says the server closed the connection: EOF, a TLS
/// stream truncated, a reset, an abort or a broken pipe.
[[nodiscard]] bool closed_by_server(const std::error_code& error) noexcept;

/// `error`, for a plaintext TCP (redis://) connection the server closed before answering
/// anything, with its likely cause named: a TLS port (redis-server closes a connection whose
/// first bytes are not a TLS handshake). Retryable as `error` is: a plaintext server restarting
/// closes connections too.
[[nodiscard]] RedisError closed_unanswered(const RedisError& error);

/// A command (or a connect) that outlived its timeout, in ms (retryable).
[[nodiscard]] RedisError timeout_error(long long timeout_ms, std::string_view during);

/// A protocol error of a hiredis reader fed from an Asio socket (not retryable).
[[nodiscard]] RedisError reader_error(const redisReader& reader, std::string_view during);

/// Whether an error reply starts with `code` (e.g. "NOSCRIPT").
[[nodiscard]] bool reply_error_is(const redisReply& reply, std::string_view code);

}  // namespace idem::detail
