#include "redis/errors.h"

#include <hiredis/hiredis.h>

#include <array>
#include <asio/error.hpp>
#include <asio/ssl/error.hpp>
#include <cerrno>
#include <string>

#include "redis/reply.h"

namespace idem::detail {
namespace {

std::string prefix(std::string_view during) { return "idem: redis " + std::string(during) + ": "; }

}  // namespace

RedisError context_error(const redisContext* context, int saved_errno, std::string_view during) {
  if (context == nullptr) return RedisError(prefix(during) + "cannot allocate a context", true);
  const std::string detail = context->errstr;
  if (context->err == REDIS_ERR_OOM) {  // a reply array over kMaxReplyElements, say
    return RedisError(prefix(during) + "protocol error: " + reader_failure(context->errstr), false);
  }
  switch (context->err) {
    case REDIS_ERR_IO:
      if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT ||
          saved_errno == EINPROGRESS) {
        return RedisError(prefix(during) + "timed out (" + detail + ")", true);
      }
      return RedisError(prefix(during) + "I/O error: " + detail, true);
    case REDIS_ERR_EOF:
      return RedisError(prefix(during) + "connection closed by the server: " + detail, true);
    case REDIS_ERR_PROTOCOL:
      return RedisError(prefix(during) + "protocol error: " + detail, false);
    default:
      // REDIS_ERR_OTHER: unknown host, unix socket path too long, connect timeout (hiredis
      // 0.14 reports "Connection timed out" here), ...
      return RedisError(prefix(during) + detail, true);
  }
}

bool reply_error_is(const redisReply& reply, std::string_view code) {
  const std::string_view text(reply.str, reply.len);
  return text.substr(0, code.size()) == code &&
         (text.size() == code.size() || text[code.size()] == ' ');
}

RedisError reply_error(const redisReply& reply, std::string_view during) {
  static constexpr std::array<std::string_view, 8> kTransient = {
      "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK"};
  bool retryable = false;
  for (const std::string_view code : kTransient)
    retryable = retryable || reply_error_is(reply, code);
  return RedisError(prefix(during) + std::string(reply.str, reply.len), retryable);
}

bool closed_by_server(const std::error_code& error) noexcept {
  // Asio's own enumerators: standalone Asio 1.22 reports socket errors in its own category
  // ("asio.system"), which it maps to no std::errc condition.
  return error == asio::error::eof || error == asio::ssl::error::stream_truncated ||
         error == asio::error::connection_reset || error == asio::error::broken_pipe ||
         error == asio::error::connection_aborted;
}

RedisError closed_unanswered(const RedisError& error) {
  return RedisError(std::string(error.what()) +
                        " (no reply came before the server closed the connection, as a TLS "
                        "port does with a plaintext client; if this port serves TLS, use a "
                        "rediss:// URL)",
                    error.retryable());
}

RedisError io_error(const std::error_code& error, std::string_view during) {
  const std::string text = error.message();
  if (closed_by_server(error)) {
    return RedisError(prefix(during) + "connection closed by the server: " + text, true);
  }
  if (error.category() == asio::error::get_ssl_category()) {
    // A certificate the client does not trust will not become trusted on a retry.
    const bool certificate = text.find("certificate") != std::string::npos;
    return RedisError(prefix(during) + "TLS error: " + text, !certificate);
  }
  return RedisError(prefix(during) + "I/O error: " + text, true);
}

RedisError timeout_error(long long timeout_ms, std::string_view during) {
  return RedisError(prefix(during) + "timed out after " + std::to_string(timeout_ms) + " ms", true);
}

RedisError reader_error(const redisReader& reader, std::string_view during) {
  return RedisError(prefix(during) + "protocol error: " + reader_failure(reader.errstr), false);
}

RedisError unexpected_reply(const redisReply& reply, std::string_view during) {
  return RedisError(prefix(during) + "unexpected reply type " + std::to_string(reply.type), false);
}

}  // namespace idem::detail
