// idem-http-webhook: the refund endpoint, guarded by idem.
//
//   POST /refunds   Idempotency-Key: "<key>"   [X-Client-Id: <client>]
//                   {"order_id":"o-1","account":7,"amount_cents":500}
//   GET  /metrics   Prometheus text
//
// One refund row and the account's balance update commit in one transaction together with
// idem's claim row. Answers (draft-ietf-httpapi-idempotency-key-header):
//   200  executed, or a replay of the first response (then `Idempotent-Replayed: true`; with
//        --replay-marker-in-body the body also starts with `"idempotent_replayed":true`)
//   400  no Idempotency-Key / X-Idempotency-Key, an invalid one, or a malformed body
//   404  unknown account (nothing committed, the key is released: a retry may run)
//   409  the first request for this order is still being processed (Retry-After: 1)
//   422  the key, or the order, was used before with another payload
// One refund per order: the order is the business key, so a double-click that sent a fresh
// Idempotency-Key is a duplicate of the first refund too (200 with Idempotent-Replayed).
//   503  a backend is unavailable; nothing was executed (Retry-After: 1). Or the server stopped
//        while the refund ran: cancelled, its claim kept, so a retry gets 409 until its lease ends.
//
//   idem-http-webhook [--port 8080] [--host 127.0.0.1] [--redis-url URL] [--pg-url URL]
//                     [--schema idem_webhook] [--ns webhook] [--pg-connections 32]
//                     [--handler-delay-ms 0] [--replay-marker-in-body]
// URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL (`source .services/env`).
// --port 0 picks a free port; the server prints `listening on http://HOST:PORT`.
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <stop_token>
#include <string>

#include "common/flags.h"
#include "common/http_listen.h"
#include "common/startup.h"
#include "http_webhook/refund.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/request_id.h"

namespace {

using webhook::Settings;

std::unique_ptr<idem::Deduplicator> make_deduplicator(
    const Settings& s, std::shared_ptr<idem::InProcessMetrics> metrics) {
  idem::DeduplicatorOptions options;
  auto redis_guard = std::make_shared<idem::RedisGuard>(webhook::guard_options(s));
  examples::check_redis_at_startup(*redis_guard, std::cerr);
  options.guard = std::move(redis_guard);
  options.sink = std::make_shared<idem::PgSink>(webhook::sink_options(s));
  options.sink->migrate();
  metrics->watch_backends(options.guard, options.sink);  // breaker and pool gauges on /metrics
  options.metrics = std::move(metrics);
  options.on_decision = examples::print_decision;
  return std::make_unique<idem::Deduplicator>(std::move(options));
}

// The slow payment gateway: waits `delay`, or less when the call's stop is requested (a stop of
// the server whose drain ran out). Cut short, it throws idem::Cancelled, as a handler that sees
// its stop should: the transaction rolls back and the call throws idem::Cancelled (503), its claim
// kept until its lease ends (another exception would be answered 500, the claim kept too). A real
// gateway is sent the refund's idempotency key: what a cut-short call sent it must not be paid
// again by the retry that runs once the lease ends.
void call_gateway(std::chrono::milliseconds delay, const std::stop_token& stop) {
  std::mutex mutex;
  std::condition_variable_any woken;
  std::unique_lock lock(mutex);
  const auto until = std::chrono::steady_clock::now() + delay;
  woken.wait_until(lock, stop, until, [] { return false; });
  if (stop.stop_requested() && std::chrono::steady_clock::now() < until)
    throw idem::Cancelled("stopped while the payment gateway ran");
}

// The business effect, in idem's transaction: the balance update and a refund row.
std::string book_refund(pqxx::transaction_base& tx, const idem::Context& context, const Settings& s,
                        const idem::Request& request, const webhook::Refund& r) {
  const std::string schema = tx.quote_name(s.service.schema);
  const pqxx::result balance =
      tx.exec_params(webhook::balance_update_sql(schema), r.amount_cents, r.account);
  if (balance.empty()) throw webhook::UnknownAccount("no account " + std::to_string(r.account));
  pqxx::row id;
  try {
    id = tx.exec_params1(webhook::refund_insert_sql(schema), request.request_id, r.order_id,
                         r.account, r.amount_cents, request.user);
  } catch (const pqxx::unique_violation&) {
    throw webhook::KeyReused();
  }
  call_gateway(s.handler_delay, context.stop_token());
  return webhook::refund_response(id[0].as<std::int64_t>(), r, balance[0][0].as<std::int64_t>());
}

void send(httplib::Response& res, const webhook::Answer& answer) {
  res.status = answer.status;
  for (const auto& [name, value] : answer.headers) res.set_header(name, value);
  res.set_content(answer.body, "application/json");
}

void handle_refund(const Settings& s, idem::Deduplicator& dedup, const httplib::Request& req,
                   httplib::Response& res) {
  idem::Request request;
  webhook::Refund refund;
  try {
    request = webhook::refund_request(idem::Headers(req.headers.begin(), req.headers.end()),
                                      req.get_header_value("X-Client-Id"), req.body, refund);
  } catch (const webhook::BadRequest& e) {
    return send(res, webhook::error_answer(400, e.what()));
  }
  try {
    const idem::Outcome outcome =
        dedup.run_transactional(request, [&](pqxx::transaction_base& tx, idem::Context& context) {
          return book_refund(tx, context, s, request, refund);
        });
    send(res, webhook::outcome_answer(outcome, s.replay_marker_in_body));
  } catch (const std::exception&) {
    send(res, webhook::failure_answer(std::current_exception(), request.request_id,
                                      "idem-http-webhook"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = webhook::parse_settings(
      argc, argv, "idem-http-webhook",
      "the refund endpoint POST /refunds, guarded by idem (Idempotency-Key), and GET /metrics.");
  examples::StopOnSignal stop;  // before any thread starts
  try {
    webhook::create_tables(settings.service);
    const auto metrics = std::make_shared<idem::InProcessMetrics>();
    const auto dedup = make_deduplicator(settings, metrics);

    httplib::Server server;
    // One thread per refund the sink can run at once (cpp-httplib's default is 8, whatever the
    // pool): a slow refund, or a slow client, holds its thread.
    const std::size_t threads = settings.service.pg_connections;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.Post("/refunds", [&](const httplib::Request& req, httplib::Response& res) {
      if (stop.stopping()) {  // a request on a connection kept alive: run nothing
        res.set_header("Connection", "close");
        return send(res, examples::stopping_answer());
      }
      handle_refund(settings, *dedup, req, res);
    });
    server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics->prometheus_text(), "text/plain; version=0.0.4");
    });

    const int port = examples::bind_exclusive(server, settings.host, settings.port);
    if (port < 0)
      throw std::runtime_error("cannot listen on " + settings.host + ":" +
                               std::to_string(settings.port));
    // Refunds still running kDrainFor after a signal are cancelled: their claims are kept.
    const auto watching = stop.watch(server, [&dedup] { dedup->shutdown(); });
    std::cout << "listening on http://" << settings.host << ":" << port << std::endl;
    if (!server.listen_after_bind()) throw std::runtime_error("accepting connections failed");
    std::cout << "stopped\n" << metrics->prometheus_text() << std::flush;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "idem-http-webhook: error: " << e.what() << "\n";
    return 1;
  }
}
