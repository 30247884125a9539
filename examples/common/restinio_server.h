// The HTTP server of the examples on an event loop: RESTinio (Debian's librestinio-dev 0.6, on
// standalone Asio, the same Asio as idem) serving on an io_context that also runs the calls of an
// idem::AsyncDeduplicator. Header-only; its users link idem_examples_restinio.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <restinio/all.hpp>
#include <string>
#include <utility>

#include "common/flags.h"
#include "common/http_answer.h"
#include "idem/async_deduplicator.h"
#include "idem/metrics.h"
#include "idem/request_id.h"

namespace examples {

using RestinioTraits = restinio::default_single_thread_traits_t;

/// The reason phrase of the statuses the examples answer ("Error" for any other).
inline const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 202:
      return "Accepted";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 422:
      return "Unprocessable Entity";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

/// Sends `answer` as the response to `req`: its status and headers, and its body as
/// application/json (no body, no Content-Type, when it is empty). With `close`, the connection
/// closes once it is sent (`Connection: close`).
inline void send(const restinio::request_handle_t& req, const Answer& answer, bool close = false) {
  auto response = req->create_response(restinio::http_status_line_t{
      restinio::http_status_code_t{static_cast<std::uint16_t>(answer.status)},
      reason_phrase(answer.status)});
  if (!answer.body.empty()) {
    response.append_header(restinio::http_field::content_type, "application/json");
  }
  for (const auto& [name, value] : answer.headers) response.append_header(name, value);
  if (close) response.connection_close();
  response.set_body(answer.body).done();
}

/// Answers `req` with the Prometheus text of `metrics` (GET /metrics).
inline void send_metrics(const restinio::request_handle_t& req,
                         const idem::InProcessMetrics& metrics) {
  req->create_response()
      .append_header(restinio::http_field::content_type, "text/plain; version=0.0.4")
      .set_body(metrics.prometheus_text())
      .done();
}

/// The request's header fields, in wire order, as idem reads them (idem::extract_request_id).
inline idem::Headers headers_of(const restinio::request_handle_t& req) {
  idem::Headers headers;
  req->header().for_each_field([&headers](const restinio::http_header_field_t& field) {
    headers.emplace_back(field.name(), field.value());
  });
  return headers;
}

/// The answers still running on the loop: spawn() starts one and counts it until it completes,
/// so that serve_until_signal() can wait for them before it stops. Use it on the loop's thread.
class Answering {
 public:
  explicit Answering(asio::io_context& io) : io_(io) {}
  Answering(const Answering&) = delete;
  Answering& operator=(const Answering&) = delete;

  /// Runs `answer` (a coroutine that sends its response; it catches what it can answer) on the
  /// loop. An exception out of it ends io.run() with that exception.
  void spawn(asio::awaitable<void> answer) {
    ++running_;
    asio::co_spawn(io_, std::move(answer), [this](const std::exception_ptr& error) {
      if (--running_ == 0 && on_idle_) std::exchange(on_idle_, nullptr)();
      if (error) std::rethrow_exception(error);
    });
  }

  /// From now on, stopping() is true: a request that comes is refused.
  void refuse() noexcept { stopping_ = true; }

  /// From now on, stopping() is true; calls `fn` once no answer runs: now, or when the last one
  /// running completes.
  void stop_then(std::function<void()> fn) {
    stopping_ = true;
    if (running_ == 0) return fn();
    on_idle_ = std::move(fn);
  }

  /// Whether the server is stopping: a request that comes now is refused.
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }

 private:
  asio::io_context& io_;
  std::size_t running_ = 0;
  bool stopping_ = false;
  std::function<void()> on_idle_;
};

/// Serves HTTP on `host`:`port` (0: a free port) with RESTinio on `io`, each request answered by
/// `route` on the loop (its idem calls started through `answering`), and runs `io` until SIGINT
/// or SIGTERM. Then the server takes no new connection, answers a request that comes on an open
/// one 503 (Retry-After: 1, Connection: close: it ran nothing), and the answers running finish
/// and are sent; those still running after kDrainFor, or at a second signal, are cancelled
/// (dedup.shutdown(): their claims stay until their leases end, and they answer as a cancelled
/// call does). Then `dedup` closes (its idle connections would keep the loop going) and `io`
/// stops. Prints `listening on http://HOST:PORT` once the port is bound, `stopping on signal N`
/// on a signal, and at the end `stopped` and the text of `metrics`. Throws what opening the
/// server threw (e.g. the port is taken).
inline void serve_until_signal(
    asio::io_context& io, const std::string& host, int port,
    std::function<restinio::request_handling_status_t(const restinio::request_handle_t&)> route,
    Answering& answering, idem::AsyncDeduplicator& dedup, const idem::InProcessMetrics& metrics) {
  std::uint16_t bound = 0;  // --port 0 picks it
  restinio::http_server_t<RestinioTraits> server{
      restinio::external_io_context(io),
      restinio::server_settings_t<RestinioTraits>{}
          .address(host)
          .port(static_cast<std::uint16_t>(port))
          .handle_request_timeout(std::chrono::seconds(60))
          .incoming_http_msg_limits(
              restinio::incoming_http_msg_limits_t{}.max_body_size(kMaxBodyBytes))
          .acceptor_post_bind_hook([&bound](asio::ip::tcp::acceptor& acceptor) {
            bound = acceptor.local_endpoint().port();  // before listen(): not reachable yet
          })
          .request_handler(
              [&answering, route = std::move(route)](const restinio::request_handle_t& req) {
                if (!answering.stopping()) return route(req);
                send(req, stopping_answer(), true);
                return restinio::request_accepted();
              })};
  std::exception_ptr failure;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  asio::steady_timer drain_limit(io);
  const auto stop = [&] {
    signals.cancel();
    drain_limit.cancel();
    dedup.close();
    io.stop();
  };
  const auto drain = [&] {
    drain_limit.expires_after(kDrainFor);
    drain_limit.async_wait([&](const asio::error_code& error) {
      if (!error) dedup.shutdown();  // the answers still running are cancelled
    });
    answering.stop_then(stop);
  };
  server.open_async(
      [&] { std::cout << "listening on http://" << host << ":" << bound << std::endl; },
      [&](const std::exception_ptr& error) {
        failure = error;
        stop();
      });
  signals.async_wait([&](const asio::error_code& error, int signal) {
    if (error) return;
    answering.refuse();  // before the line: a request sent once it is read is refused
    std::cout << "stopping on signal " << signal << std::endl;
    server.close_async(drain, [&](const std::exception_ptr&) { drain(); });
    signals.async_wait([&](const asio::error_code& again, int) {
      if (again) return;
      std::cout << "cancelling what still runs: a second signal" << std::endl;
      dedup.shutdown();
    });
  });
  io.run();
  if (failure) std::rethrow_exception(failure);
  std::cout << "stopped\n" << metrics.prometheus_text() << std::flush;
}

}  // namespace examples
