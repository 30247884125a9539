#include "redis/tls_transport.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <array>
#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <optional>
#include <string>

#include "redis/errors.h"
#include "redis/reply.h"
#include "redis/resp_command.h"
#include "redis/tls.h"

namespace idem::detail {

struct TlsTransport::Impl {
  Impl(const RedisEndpoint& endpoint, std::chrono::milliseconds command)
      : context(make_tls_context(endpoint)),
        stream(io, *context),
        reader(bounded_reader()),
        command_timeout(command) {
    if (reader == nullptr) throw RedisError("idem: redis: cannot allocate a reply reader", false);
    prepare_tls_stream(stream, endpoint);
  }
  ~Impl() { redisReaderFree(reader); }

  // Runs one asynchronous step started by `start(handler)` for at most `timeout`; on timeout the
  // socket is closed (so the step ends) and a timeout error is thrown.
  template <typename Start>
  std::error_code step(Start start, std::chrono::milliseconds timeout, std::string_view during) {
    std::optional<std::error_code> result;
    io.restart();
    start([&result](std::error_code error, auto&&...) { result = error; });
    io.run_for(timeout);
    if (!result) {
      std::error_code ignored;
      stream.next_layer().close(ignored);
      io.restart();
      io.run();  // the step completes (aborted) and releases its buffers
      throw timeout_error(timeout.count(), during);
    }
    return *result;
  }

  asio::io_context io{1};
  std::shared_ptr<asio::ssl::context> context;
  asio::ssl::stream<asio::ip::tcp::socket> stream;
  redisReader* reader;
  std::chrono::milliseconds command_timeout;
  std::string out;
  std::array<char, 16 * 1024> input{};
  std::atomic<int> fd{-1};
};

TlsTransport::TlsTransport(const RedisEndpoint& endpoint, std::chrono::milliseconds connect_timeout,
                           std::chrono::milliseconds command_timeout, bool keepalive)
    : impl_(std::make_unique<Impl>(endpoint, command_timeout)) {
  Impl& d = *impl_;
  asio::ip::tcp::resolver resolver(d.io);
  asio::ip::tcp::resolver::results_type endpoints;
  std::error_code error = d.step(
      [&](auto handler) {
        resolver.async_resolve(endpoint.host, std::to_string(endpoint.port),
                               [&, handler](std::error_code e, auto results) mutable {
                                 endpoints = std::move(results);
                                 handler(e);
                               });
      },
      connect_timeout, "resolve");
  if (error) throw io_error(error, "resolve");
  error = d.step(
      [&](auto handler) {
        asio::async_connect(d.stream.next_layer(), endpoints,
                            [handler](std::error_code e, const auto&) mutable { handler(e); });
      },
      connect_timeout, "connect");
  if (error) throw io_error(error, "connect");
  d.fd = d.stream.next_layer().native_handle();
  d.stream.next_layer().set_option(asio::ip::tcp::no_delay(true), error);
  if (keepalive) d.stream.next_layer().set_option(asio::socket_base::keep_alive(true), error);
  error = d.step(
      [&](auto handler) { d.stream.async_handshake(asio::ssl::stream_base::client, handler); },
      connect_timeout, "TLS handshake");
  if (error) throw io_error(error, "TLS handshake");
}

TlsTransport::~TlsTransport() = default;

void TlsTransport::check(const RedisEndpoint& endpoint) { (void)make_tls_context(endpoint); }

void TlsTransport::append(std::span<const std::string_view> args) {
  impl_->out += RespCommand(args).bytes();
}

ReplyPtr TlsTransport::read_reply() {
  Impl& d = *impl_;
  const auto failed = [this](std::error_code error, std::string_view during) {
    closed_by_server_ = detail::closed_by_server(error);
    return io_error(error, during);
  };
  if (!d.out.empty()) {
    const std::string bytes = std::move(d.out);
    d.out.clear();
    const std::error_code error =
        d.step([&](auto handler) { asio::async_write(d.stream, asio::buffer(bytes), handler); },
               d.command_timeout, "write");
    if (error) throw failed(error, "write");
  }
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(d.reader, &raw) != REDIS_OK) throw reader_error(*d.reader, "read");
    if (raw != nullptr) return ReplyPtr(static_cast<redisReply*>(raw));
    std::size_t size = 0;
    const std::error_code error = d.step(
        [&](auto handler) {
          d.stream.async_read_some(asio::buffer(d.input),
                                   [&size, handler](std::error_code e, std::size_t n) mutable {
                                     size = n;
                                     handler(e);
                                   });
        },
        d.command_timeout, "read");
    if (error) throw failed(error, "read");
    if (redisReaderFeed(d.reader, d.input.data(), size) != REDIS_OK)
      throw reader_error(*d.reader, "read");
  }
}

void TlsTransport::shutdown() noexcept {
  if (const int fd = impl_->fd.load(); fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

}  // namespace idem::detail
