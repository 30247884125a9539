// The HTTP server of the examples on an event loop: RESTinio (Debian's librestinio-dev 0.6, on
// standalone Asio, the same Asio as idem) serving on an io_context that also runs the calls of an
// idem::AsyncDeduplicator. Header-only; its users link idem_examples_restinio.
#pragma once

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <chrono>
#include <csignal>
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
/// application/json (no body, no Content-Type, when it is empty).
inline void send(const restinio::request_handle_t& req, const Answer& answer) {
  auto response = req->create_response(restinio::http_status_line_t{
      restinio::http_status_code_t{static_cast<std::uint16_t>(answer.status)},
      reason_phrase(answer.status)});
  if (!answer.body.empty()) {
    response.append_header(restinio::http_field::content_type, "application/json");
  }
  for (const auto& [name, value] : answer.headers) response.append_header(name, value);
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

/// Serves HTTP on `host`:`port` (0: a free port) with RESTinio on `io`, each request answered by
/// `route` on the loop, and runs `io` until SIGINT or SIGTERM: then the server closes, so does
/// `dedup` (its idle connections would keep the loop going), and `io` stops; calls still running
/// keep their claims until their leases end. Prints `listening on http://HOST:PORT` once the port
/// is bound, `stopping on signal N` on a signal, and at the end `stopped` and the text of
/// `metrics`. Throws what opening the server threw (e.g. the port is taken).
inline void serve_until_signal(
    asio::io_context& io, const std::string& host, int port,
    std::function<restinio::request_handling_status_t(const restinio::request_handle_t&)> route,
    idem::AsyncDeduplicator& dedup, const idem::InProcessMetrics& metrics) {
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
          .request_handler(std::move(route))};
  std::exception_ptr failure;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  const auto stop = [&] {
    signals.cancel();
    dedup.close();
    io.stop();
  };
  server.open_async(
      [&] { std::cout << "listening on http://" << host << ":" << bound << std::endl; },
      [&](const std::exception_ptr& error) {
        failure = error;
        stop();
      });
  signals.async_wait([&](const asio::error_code& error, int signal) {
    if (error) return;
    std::cout << "stopping on signal " << signal << std::endl;
    server.close_async(stop, [&](const std::exception_ptr&) { stop(); });
  });
  io.run();
  if (failure) std::rethrow_exception(failure);
  std::cout << "stopped\n" << metrics.prometheus_text() << std::flush;
}

}  // namespace examples
