// idem-http-webhook: the refund endpoint, guarded by idem.
//
//   POST /refunds   Idempotency-Key: "<key>"   [X-Client-Id: <client>]
//                   {"order_id":"o-1","account":7,"amount_cents":500}
//   GET  /metrics   Prometheus text
//
// One refund row and the account's balance update commit in one transaction together with
// idem's claim row. Answers (draft-ietf-httpapi-idempotency-key-header):
//   200  executed, or a replay of the first response (then `Idempotent-Replayed: true`)
//   400  no Idempotency-Key / X-Idempotency-Key, an invalid one, or a malformed body
//   404  unknown account (nothing committed, the key is released: a retry may run)
//   409  the first request for this order is still being processed (Retry-After: 1)
//   422  the key, or the order, was used before with another payload
// One refund per order: the order is the business key, so a double-click that sent a fresh
// Idempotency-Key is a duplicate of the first refund too (200 with Idempotent-Replayed).
//   503  a backend is unavailable; nothing was executed (Retry-After: 1)
//
//   idem-http-webhook [--port 8080] [--host 127.0.0.1] [--redis-url URL] [--pg-url URL]
//                     [--schema idem_webhook] [--ns webhook] [--handler-delay-ms 0]
// URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL (`source .services/env`).
// --port 0 picks a free port; the server prints `listening on http://HOST:PORT`.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/flags.h"
#include "common/http_listen.h"
#include "common/startup.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/request_id.h"

namespace {

struct Settings {
  std::string host = "127.0.0.1";
  int port = 8080;
  examples::ServiceFlags service{.schema = "idem_webhook", .ns = "webhook"};
  std::chrono::milliseconds handler_delay{0};  // simulates a slow payment gateway
};

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "idem-http-webhook: the refund endpoint POST /refunds, guarded by idem (Idempotency-Key), "
      "and GET /metrics.",
      "idem-http-webhook"};
  examples::add_port_option(app, s.port);
  app.add_option("--host", s.host, "Address to listen on")->capture_default_str();
  examples::add_service_flags(app, s.service);
  app.add_option("--handler-delay-ms", s.handler_delay,
                 "Milliseconds each refund sleeps in its transaction (a slow payment gateway)")
      ->capture_default_str();
  examples::parse_or_exit(app, argc, argv);
  return s;
}

// The business tables. The refund ledger has no unique constraint of its own: idem's claim row,
// in the same transaction, is what keeps a refund from being booked twice.
void create_tables(const Settings& s) {
  pqxx::connection conn(s.service.pg_url);
  pqxx::work tx(conn);
  const std::string schema = tx.quote_name(s.service.schema);
  tx.exec0("CREATE SCHEMA IF NOT EXISTS " + schema);
  tx.exec0("CREATE TABLE IF NOT EXISTS " + schema +
           ".accounts (id bigint PRIMARY KEY, balance_cents bigint NOT NULL)");
  tx.exec0("CREATE TABLE IF NOT EXISTS " + schema +
           ".refund_records (id bigserial PRIMARY KEY, idempotency_key text NOT NULL,"
           " order_id text NOT NULL, account bigint NOT NULL, amount_cents bigint NOT NULL,"
           " created_at timestamptz NOT NULL DEFAULT now())");
  tx.exec0("INSERT INTO " + schema +
           ".accounts SELECT g, 0 FROM generate_series(1, 100) g ON CONFLICT DO NOTHING");
  tx.commit();
}

std::unique_ptr<idem::Deduplicator> make_deduplicator(
    const Settings& s, std::shared_ptr<idem::InProcessMetrics> metrics) {
  idem::RedisGuardOptions guard;
  guard.redis.url = s.service.redis_url;
  guard.ns = s.service.ns;
  guard.lease = std::chrono::seconds(10) + s.handler_delay;  // longer than any refund takes
  guard.retention = std::chrono::hours(24);                  // covers payment reconciliation
  idem::PgSinkOptions sink;
  sink.conninfo = s.service.pg_url;
  sink.schema = s.service.schema;
  sink.ns = s.service.ns;
  sink.retention = std::chrono::hours(24);

  idem::DeduplicatorOptions options;
  auto redis_guard = std::make_shared<idem::RedisGuard>(guard);
  examples::check_redis_at_startup(*redis_guard, std::cerr);
  options.guard = std::move(redis_guard);
  options.sink = std::make_shared<idem::PgSink>(sink);
  options.sink->migrate();
  metrics->watch_backends(options.guard, options.sink);  // breaker and pool gauges on /metrics
  options.metrics = std::move(metrics);
  options.on_decision = [](const idem::DecisionEvent& e) {
    static std::mutex out;
    const std::lock_guard lock(out);
    std::cout << "decision request_id=" << e.request_id
              << " outcome=" << (e.handler_failed ? "handler_failed" : to_string(e.outcome))
              << " layer=" << to_string(e.layer) << " latency_us=" << e.latency.count()
              << std::endl;
  };
  return std::make_unique<idem::Deduplicator>(std::move(options));
}

struct UnknownAccount : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Refund {
  std::string order_id;
  std::int64_t account = 0;
  std::int64_t amount_cents = 0;
};

// Throws nlohmann::json::exception on a malformed body.
Refund parse_refund(const std::string& body) {
  const nlohmann::json json = nlohmann::json::parse(body);
  Refund refund{json.at("order_id").get<std::string>(), json.at("account").get<std::int64_t>(),
                json.at("amount_cents").get<std::int64_t>()};
  constexpr std::int64_t kMaxRefundCents = 1'000'000'000'000;  // keeps balances far from overflow
  if (refund.order_id.empty() || refund.amount_cents <= 0 ||
      refund.amount_cents > kMaxRefundCents) {
    throw std::invalid_argument("order_id must be non-empty and amount_cents in 1..1000000000000");
  }
  return refund;
}

// The business effect, in idem's transaction: a refund row and the balance update.
std::string book_refund(pqxx::transaction_base& tx, const Settings& s, const std::string& key,
                        const Refund& r) {
  const std::string schema = tx.quote_name(s.service.schema);
  const pqxx::result balance = tx.exec_params(
      "UPDATE " + schema +
          ".accounts SET balance_cents = balance_cents + $1 WHERE id = $2 RETURNING balance_cents",
      r.amount_cents, r.account);
  if (balance.empty()) throw UnknownAccount("no account " + std::to_string(r.account));
  const pqxx::row id =
      tx.exec_params1("INSERT INTO " + schema +
                          ".refund_records (idempotency_key, order_id, account, amount_cents)"
                          " VALUES ($1, $2, $3, $4) RETURNING id",
                      key, r.order_id, r.account, r.amount_cents);
  std::this_thread::sleep_for(s.handler_delay);
  return nlohmann::json{{"refund_id", id[0].as<std::int64_t>()},
                        {"order_id", r.order_id},
                        {"amount_cents", r.amount_cents},
                        {"balance_cents", balance[0][0].as<std::int64_t>()}}
      .dump();
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
  if (status == 409 || status == 503) res.set_header("Retry-After", "1");
}

// The idempotency key of a request: `Idempotency-Key` (an RFC 8941 sf-string) or
// `X-Idempotency-Key`. Throws idem::InvalidRequestId for an invalid value; a tracing header
// (X-Request-ID) is not a key.
std::optional<std::string> idempotency_key(const httplib::Request& req) {
  const idem::Headers headers(req.headers.begin(), req.headers.end());
  const auto id = idem::extract_request_id(headers);
  if (!id || (id->source != idem::RequestIdHeader::kIdempotencyKey &&
              id->source != idem::RequestIdHeader::kXIdempotencyKey)) {
    return std::nullopt;
  }
  return id->id;
}

void handle_refund(const Settings& s, idem::Deduplicator& dedup, const httplib::Request& req,
                   httplib::Response& res) {
  idem::Request request;
  Refund refund;
  try {
    const auto key = idempotency_key(req);
    if (!key) return reply_error(res, 400, "Idempotency-Key header required");
    refund = parse_refund(req.body);
    request.request_id = *key;
    // Keys are scoped per client (the draft: a key is unique per client). In a real service this
    // is the authenticated caller; here an X-Client-Id header.
    const std::string client = req.get_header_value("X-Client-Id");
    request.user = client.empty() ? "anonymous" : client;
    request.intent = "refund";
    request.biz_key = refund.order_id;  // one refund per order, whichever key the client sent
    request.payload = req.body;         // the same order with another body is a Mismatch (422)
  } catch (const idem::InvalidRequestId& e) {
    return reply_error(res, 400, e.what());
  } catch (const std::exception& e) {
    return reply_error(res, 400, std::string("malformed refund: ") + e.what());
  }

  try {
    const idem::Outcome outcome = dedup.run_transactional(request, [&](pqxx::transaction_base& tx) {
      return book_refund(tx, s, request.request_id, refund);
    });
    switch (outcome.kind) {
      case idem::Outcome::Kind::kExecuted:
        res.status = 200;
        res.set_content(*outcome.response, "application/json");
        return;
      case idem::Outcome::Kind::kDuplicate:
        res.status = 200;
        res.set_header("Idempotent-Replayed", "true");
        // Without a body when the first response was over the stored-size cap.
        res.set_content(outcome.response.value_or(R"({"status":"duplicate"})"), "application/json");
        return;
      case idem::Outcome::Kind::kInProgress:
        return reply_error(res, 409, "a request with this Idempotency-Key is being processed");
      case idem::Outcome::Kind::kMismatch:
        return reply_error(res, 422,
                           "this Idempotency-Key or order was already used with another payload");
      case idem::Outcome::Kind::kUnavailable:
        return reply_error(res, 503, "storage unavailable; nothing was executed");
    }
  } catch (const UnknownAccount& e) {
    return reply_error(res, 404, e.what());
  } catch (const idem::PayloadError& e) {
    return reply_error(res, 400, e.what());
  } catch (const idem::InvalidKey& e) {  // e.g. an X-Client-Id or order_id over the size limit
    return reply_error(res, 400, e.what());
  } catch (const idem::BackendError& e) {
    // The details go to the log, not to the client (they may quote SQL or the server).
    std::cerr << "idem-http-webhook: refund " << request.request_id << " failed: " << e.what()
              << "\n";
    if (e.retryable()) {
      // E.g. the commit's connection was lost: the outcome is unknown and the claim is kept
      // until its lease ends; a retry then gets 409 or, once decided, the stored answer.
      return reply_error(res, 503, "storage failed; retry later");
    }
    return reply_error(res, 500, "the refund failed; it was not booked");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse_settings(argc, argv);
  // SIGINT/SIGTERM are taken by a waiting thread (below), never by a handler mid-request.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    create_tables(settings);
    const auto metrics = std::make_shared<idem::InProcessMetrics>();
    const auto dedup = make_deduplicator(settings, metrics);

    httplib::Server server;
    server.Post("/refunds", [&](const httplib::Request& req, httplib::Response& res) {
      handle_refund(settings, *dedup, req, res);
    });
    server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics->prometheus_text(), "text/plain; version=0.0.4");
    });

    const int port = examples::bind_exclusive(server, settings.host, settings.port);
    if (port < 0)
      throw std::runtime_error("cannot listen on " + settings.host + ":" +
                               std::to_string(settings.port));
    std::thread stopper([&] {
      int signal = 0;
      sigwait(&stop_signals, &signal);
      std::cout << "stopping on signal " << signal << std::endl;
      server.stop();
    });
    stopper.detach();
    std::cout << "listening on http://" << settings.host << ":" << port << std::endl;
    server.listen_after_bind();
    std::cout << "stopped\n" << metrics->prometheus_text() << std::flush;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "idem-http-webhook: error: " << e.what() << "\n";
    return 1;
  }
}
