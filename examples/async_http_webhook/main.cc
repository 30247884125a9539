// idem-async-webhook: the refund endpoint of examples/http_webhook on one event loop. RESTinio
// (Debian's librestinio-dev 0.6, on standalone Asio, the same Asio as idem) serves HTTP on an
// io_context; each POST /refunds runs through idem::AsyncDeduplicator::run_transactional on that
// same loop, its effect (the balance update and a refund row) through `co_await tx.exec(...)` in
// the call's own transaction with idem's claim row. One thread; no request holds it while it
// waits on Redis, PostgreSQL, or the slow payment gateway (--handler-delay-ms, a timer). What a
// refund does hold is one of --pg-connections (32) PostgreSQL connections, for its transaction.
//
// The same endpoint, rules and answers as the blocking example (http_webhook/refund.h):
//   POST /refunds   Idempotency-Key: "<key>"   [X-Client-Id: <client>]
//                   {"order_id":"o-1","account":7,"amount_cents":500}
//   GET  /metrics   Prometheus text
//   200 executed, or a replay of the first response (`Idempotent-Replayed: true`); 400 no or an
//   invalid key, a malformed body; 404 unknown account (the key is released); 409 the first
//   request for this order still runs (Retry-After: 1); 422 the key or order was used with
//   another payload; 503 a backend is unavailable, nothing was executed (Retry-After: 1), or the
//   server stopped while the refund ran (its claim kept: a retry gets 409 until its lease ends).
//   With --replay-marker-in-body a replayed body also starts with `"idempotent_replayed":true`.
//
//   idem-async-webhook [--port 8080] [--host 127.0.0.1] [--redis-url URL] [--pg-url URL]
//                      [--schema idem_webhook] [--ns webhook] [--pg-connections 32]
//                      [--handler-delay-ms 0] [--replay-marker-in-body]
// URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL (`source .services/env`).
// --port 0 picks a free port; the server prints `listening on http://HOST:PORT`.
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <restinio/all.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/async_startup.h"
#include "common/flags.h"
#include "common/restinio_server.h"
#include "common/startup.h"
#include "http_webhook/refund.h"
#include "idem/async_deduplicator.h"
#include "idem/metrics.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

// GCC 12 at -O1 (the sanitized builds' level) inlines Asio's coroutine frame allocation down to
// ::operator new and calls the frame class's operator delete a mismatch: a false positive, as in
// src/redis/async_sentinel.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

constexpr const char* kProgram = "idem-async-webhook";

using webhook::Settings;

// The business effect in the call's transaction; every argument by value (the coroutine's frame
// owns them).
asio::awaitable<std::string> book_refund(idem::AsyncTransaction& tx, std::string schema,
                                         std::string key, std::string client, webhook::Refund r,
                                         std::chrono::milliseconds delay) {
  std::vector<std::optional<std::string>> balance_args{std::to_string(r.amount_cents),
                                                       std::to_string(r.account)};
  const idem::AsyncResult balance =
      co_await tx.exec(webhook::balance_update_sql(schema), std::move(balance_args));
  if (balance.rows() == 0) throw webhook::UnknownAccount("no account " + std::to_string(r.account));
  std::vector<std::optional<std::string>> refund_args{
      std::move(key), r.order_id, std::to_string(r.account), std::to_string(r.amount_cents),
      std::move(client)};
  std::optional<idem::AsyncResult> id;
  try {
    id = co_await tx.exec(webhook::refund_insert_sql(schema), std::move(refund_args));
  } catch (const idem::PostgresError& error) {
    if (error.sqlstate() != webhook::kUniqueViolation) throw;
  }
  if (!id) throw webhook::KeyReused();
  if (delay.count() > 0) {
    asio::steady_timer gateway(co_await asio::this_coro::executor, delay);
    co_await gateway.async_wait(asio::use_awaitable);
  }
  co_return webhook::refund_response(std::stoll(std::string(id->get(0, 0).value())), r,
                                     std::stoll(std::string(balance.get(0, 0).value())));
}

using RequestHandle = restinio::request_handle_t;

// Answers one POST /refunds; runs on the loop until the call completes.
asio::awaitable<void> refund(const Settings& s, const std::string& schema,
                             idem::AsyncDeduplicator& dedup, RequestHandle req,
                             idem::Request request, webhook::Refund r) {
  // Named first: GCC 12 destroys a lambda temporary inside a co_await expression twice.
  auto booking = [schema, key = request.request_id, client = request.user, r,
                  delay = s.handler_delay](idem::AsyncTransaction& tx) {
    return book_refund(tx, schema, key, client, r, delay);
  };
  webhook::Answer answer;
  try {
    const idem::Outcome outcome =
        co_await dedup.run_transactional(request, std::move(booking), asio::use_awaitable);
    answer = webhook::outcome_answer(outcome, s.replay_marker_in_body);
  } catch (const std::exception&) {
    answer = webhook::failure_answer(std::current_exception(), request.request_id, kProgram);
  }
  examples::send(req, answer);
}

restinio::request_handling_status_t route(examples::Answering& answering, const Settings& s,
                                          const std::string& schema, idem::AsyncDeduplicator& dedup,
                                          const idem::InProcessMetrics& metrics,
                                          const RequestHandle& req) {
  const auto method = req->header().method();
  const auto path = req->header().path();
  if (method == restinio::http_method_get() && path == "/metrics") {
    examples::send_metrics(req, metrics);
    return restinio::request_accepted();
  }
  if (method != restinio::http_method_post() || path != "/refunds") {
    return restinio::request_rejected();  // 501 from RESTinio
  }
  webhook::Refund r;
  idem::Request request;
  try {
    request = webhook::refund_request(examples::headers_of(req),
                                      std::string(req->header().get_field_or("X-Client-Id", "")),
                                      req->body(), r);
  } catch (const webhook::BadRequest& e) {
    examples::send(req, webhook::error_answer(400, e.what()));
    return restinio::request_accepted();
  }
  answering.spawn(refund(s, schema, dedup, req, std::move(request), std::move(r)));
  return restinio::request_accepted();
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = webhook::parse_settings(
      argc, argv, kProgram,
      "the refund endpoint POST /refunds on one event loop (RESTinio + idem::AsyncDeduplicator), "
      "and GET /metrics.");
  try {
    const std::string schema = webhook::create_tables(settings.service);
    asio::io_context io(1);
    const auto metrics = std::make_shared<idem::InProcessMetrics>();
    const auto dedup = examples::make_async_deduplicator(io, webhook::guard_options(settings),
                                                         webhook::sink_options(settings), metrics);

    examples::Answering answering(io);
    examples::serve_until_signal(
        io, settings.host, settings.port,
        [&](const RequestHandle& req) {
          return route(answering, settings, schema, *dedup, *metrics, req);
        },
        answering, *dedup, *metrics);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return 1;
  }
}
