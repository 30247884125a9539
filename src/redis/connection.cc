#include "redis/connection.h"

#include <sys/socket.h>

#include <array>
#include <asio/error.hpp>
#include <cerrno>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "redis/errors.h"
#include "redis/reply.h"
#include "redis/resp_command.h"
#include "redis/sentinel_rules.h"
#include "redis/tls_transport.h"

namespace idem::detail {
namespace {

timeval to_timeval(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

}  // namespace

void Connection::ContextDeleter::operator()(redisContext* context) const noexcept {
  redisFree(context);
}

void Connection::connect_plain(const ConnectionSettings& settings) {
  const RedisEndpoint& endpoint = settings.endpoint;
  const timeval connect_timeout = to_timeval(settings.connect_timeout);
  errno = 0;
  context_.reset(
      endpoint.socket_path.empty()
          ? redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, connect_timeout)
          : redisConnectUnixWithTimeout(endpoint.socket_path.c_str(), connect_timeout));
  if (context_ == nullptr || context_->err != 0) fail(errno, "connect");
  bound_reader(*context_);
  if (redisSetTimeout(context_.get(), to_timeval(settings.command_timeout)) != REDIS_OK) {
    fail(errno, "set timeout");
  }
  if (settings.keepalive && endpoint.socket_path.empty() &&
      redisEnableKeepAlive(context_.get()) != REDIS_OK) {
    fail(errno, "keepalive");
  }
}

Connection::~Connection() = default;

Connection::Connection(const ConnectionSettings& settings) {
  const RedisEndpoint& endpoint = settings.endpoint;
  if (endpoint.tls) {
    // hiredis 0.14 has no TLS: the transport owns socket and TLS, hiredis parses.
    tls_ = std::make_unique<TlsTransport>(endpoint, settings.connect_timeout,
                                          settings.command_timeout, settings.keepalive);
  } else {
    connect_plain(settings);
  }

  const auto expect_ok = [](ReplyPtr reply, std::string_view during) {
    if (reply->type == REDIS_REPLY_ERROR) throw reply_error(*reply, during);
  };
  using Args2 = std::array<std::string_view, 2>;
  if (const std::vector<std::string_view> auth = auth_arguments(endpoint); !auth.empty()) {
    expect_ok(command(auth), "AUTH");
  }
  if (endpoint.db != 0) {
    const std::string db = std::to_string(endpoint.db);
    expect_ok(command(Args2{"SELECT", db}), "SELECT");
  }
  if (settings.require_master) {
    const ReplyPtr role = command(kRoleCommand);
    if (std::optional<RedisError> refused =
            not_master(*role, HostPort{endpoint.host, endpoint.port})) {
      throw *refused;
    }
  }
}

ReplyPtr Connection::command(std::span<const std::string_view> args) {
  append(args);
  return read_reply();
}

void Connection::append(std::span<const std::string_view> args) {
  if (tls_ != nullptr) return tls_->append(args);
  const RespCommand command(args);  // not redisAppendCommandArgv: its sds printer is slow
  errno = 0;
  if (redisAppendFormattedCommand(context_.get(), command.bytes().data(), command.bytes().size()) !=
      REDIS_OK) {
    fail(errno, "append");
  }
}

ReplyPtr Connection::read_reply() {
  if (tls_ != nullptr) {
    try {
      return tls_->read_reply();
    } catch (const RedisError&) {
      broken_ = true;
      closed_by_server_ = tls_->closed_by_server();
      throw;
    }
  }
  void* raw = nullptr;
  errno = 0;
  if (redisGetReply(context_.get(), &raw) != REDIS_OK || raw == nullptr) fail(errno, "command");
  answered_ = true;
  return ReplyPtr(static_cast<redisReply*>(raw));
}

void Connection::shutdown() noexcept {
  if (tls_ != nullptr) tls_->shutdown();
  if (context_ != nullptr && context_->fd >= 0) ::shutdown(context_->fd, SHUT_RDWR);
}

void Connection::fail(int saved_errno, std::string_view during) {
  broken_ = true;
  // hiredis's errno, read as the Asio transports' errors are: one rule for both.
  closed_by_server_ =
      context_ != nullptr &&
      (context_->err == REDIS_ERR_EOF ||
       (context_->err == REDIS_ERR_IO && detail::closed_by_server(std::error_code(
                                             saved_errno, asio::error::get_system_category()))));
  const RedisError error = context_error(context_.get(), saved_errno, during);
  if (closed_by_server_ && !answered_ && context_->connection_type == REDIS_CONN_TCP) {
    throw closed_unanswered(error);
  }
  throw error;
}

}  // namespace idem::detail
