// The refund endpoint's rules, apart from the HTTP server (main.cc, cpp-httplib): the flags, the
// tables, the body, the request idem sees, the statements of the effect, and the HTTP answer to
// each outcome or failure. Header-only.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "common/http_answer.h"
#include "common/startup.h"
#include "common/tables.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/outcome.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"
#include "idem/request_id.h"

namespace webhook {

struct Settings {
  std::string host = "127.0.0.1";
  int port = 8080;
  // A refund holds a connection for its transaction, gateway wait included: 32 refunds at once.
  examples::ServiceFlags service{.schema = "idem_webhook", .ns = "webhook", .pg_connections = 32};
  std::chrono::milliseconds handler_delay{0};  // simulates a slow payment gateway
  bool replay_marker_in_body = false;  // a replay's body carries "idempotent_replayed": true too
};

/// The flags of a webhook server; exits on --help or a usage error (examples::parse_or_exit).
inline Settings parse_settings(int argc, char** argv, const std::string& program,
                               const std::string& description) {
  Settings s;
  CLI::App app{program + ": " + description, program};
  examples::add_listen_options(app, s.host, s.port);
  examples::add_service_flags(app, s.service);
  examples::add_handler_delay_option(app, s.handler_delay, "a slow payment gateway");
  app.add_flag("--replay-marker-in-body", s.replay_marker_in_body,
               "Mark a replay in its JSON body too (\"idempotent_replayed\":true as its first "
               "member), besides the Idempotent-Replayed header, for clients that never see "
               "headers");
  examples::parse_or_exit(app, argc, argv);
  return s;
}

/// idem's Redis layer for the endpoint.
inline idem::RedisGuardOptions guard_options(const Settings& s) {
  return examples::guard_options(s.service,
                                 std::chrono::seconds(10) + s.handler_delay,  // > any refund
                                 std::chrono::hours(24));  // covers payment reconciliation
}

/// idem's PostgreSQL layer for the endpoint.
inline idem::PgSinkOptions sink_options(const Settings& s) {
  return examples::sink_options(s.service, std::chrono::hours(24));
}

// The business tables. idem's claim row, in the same transaction, is what keeps a refund from
// being booked twice. The ledger's one unique constraint, a client's Idempotency-Key, answers a
// key sent again for another order (idem's key is the order's): 422, as the draft asks. Returns
// the schema name quoted for SQL.
inline std::string create_tables(const examples::ServiceFlags& service) {
  return examples::create_tables(
      service.pg_url, service.schema,
      {"accounts (id bigint PRIMARY KEY, balance_cents bigint NOT NULL)",
       "refund_records (id bigserial PRIMARY KEY, idempotency_key text NOT NULL,"
       " order_id text NOT NULL, account bigint NOT NULL, amount_cents bigint NOT NULL,"
       " client text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),"
       " UNIQUE (client, idempotency_key))"},
      [](pqxx::work& tx, const std::string& schema) {
        tx.exec0("INSERT INTO " + schema +
                 ".accounts SELECT g, 0 FROM generate_series(1, 100) g ON CONFLICT DO NOTHING");
      });
}

/// The effect's first statement: account $2's balance grows by $1 cents; returns the balance
/// (no row: no such account).
inline std::string balance_update_sql(const std::string& schema) {
  return "UPDATE " + schema +
         ".accounts SET balance_cents = balance_cents + $1 WHERE id = $2 RETURNING balance_cents";
}

/// The effect's second statement: the refund row ($1 key, $2 order, $3 account, $4 cents,
/// $5 client); returns its id. A unique violation: the client's key was used for another order
/// (KeyReused).
inline std::string refund_insert_sql(const std::string& schema) {
  return "INSERT INTO " + schema +
         ".refund_records (idempotency_key, order_id, account, amount_cents, client)"
         " VALUES ($1, $2, $3, $4, $5) RETURNING id";
}

/// SQLSTATE unique_violation.
inline constexpr const char* kUniqueViolation = "23505";

struct UnknownAccount : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The Idempotency-Key was used before for another order (answered 422; the call's claim is
/// released, so the same request gets 422 again).
struct KeyReused : std::runtime_error {
  KeyReused() : std::runtime_error("this Idempotency-Key was already used with another payload") {}
};

/// A request answered 400 before idem sees it.
struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Refund {
  std::string order_id;
  std::int64_t account = 0;
  std::int64_t amount_cents = 0;
};

/// The stored response of a booked refund.
inline std::string refund_response(std::int64_t refund_id, const Refund& r,
                                   std::int64_t balance_cents) {
  return nlohmann::json{{"refund_id", refund_id},
                        {"order_id", r.order_id},
                        {"amount_cents", r.amount_cents},
                        {"balance_cents", balance_cents}}
      .dump();
}

/// The idem request of POST /refunds from its headers, X-Client-Id and body; the refund into
/// `refund`. Throws BadRequest (no or an invalid Idempotency-Key / X-Idempotency-Key, a
/// malformed body); a tracing header (X-Request-ID) is not a key.
inline idem::Request refund_request(const idem::Headers& headers, const std::string& client,
                                    const std::string& body, Refund& refund) {
  std::optional<idem::InboundRequestId> id;
  try {
    id = idem::extract_request_id(headers);
  } catch (const idem::InvalidRequestId& e) {
    throw BadRequest(e.what());
  }
  if (!id || (id->source != idem::RequestIdHeader::kIdempotencyKey &&
              id->source != idem::RequestIdHeader::kXIdempotencyKey)) {
    throw BadRequest("Idempotency-Key header required");
  }
  try {
    const nlohmann::json json = nlohmann::json::parse(body);
    // Whole numbers only: get<std::int64_t>() would truncate 500.9 to 500.
    const auto integer = [&](const char* name) {
      const nlohmann::json& value = json.at(name);
      if (!value.is_number_integer()) {
        throw std::invalid_argument(std::string(name) + " must be a whole number");
      }
      return value.get<std::int64_t>();
    };
    refund =
        Refund{json.at("order_id").get<std::string>(), integer("account"), integer("amount_cents")};
  } catch (const std::exception& e) {
    throw BadRequest(std::string("malformed refund: ") + e.what());
  }
  constexpr std::int64_t kMaxRefundCents = 1'000'000'000'000;  // keeps balances far from overflow
  if (refund.order_id.empty() || refund.amount_cents <= 0 ||
      refund.amount_cents > kMaxRefundCents) {
    throw BadRequest(
        "malformed refund: order_id must be non-empty and amount_cents in 1..1000000000000");
  }
  idem::Request request;
  request.request_id = id->id;
  // Keys are scoped per client (the draft: a key is unique per client). In a real service this
  // is the authenticated caller; here an X-Client-Id header.
  request.user = client.empty() ? "anonymous" : client;
  request.intent = "refund";
  request.biz_key = refund.order_id;  // one refund per order, whichever key the client sent
  request.payload = body;             // the same order with another body is a Mismatch (422)
  return request;
}

using examples::Answer;

/// An error answer: `{"error": message}`, and the headers `status` calls for (Retry-After on 409
/// and 503). Bytes of `message` that are not UTF-8 (a malformed body it quotes) become U+FFFD.
inline Answer error_answer(int status, const std::string& message) {
  return examples::make_answer(
      status, nlohmann::json{{"error", message}}.dump(-1, ' ', false,
                                                      nlohmann::json::error_handler_t::replace));
}

/// The answer to an outcome (draft-ietf-httpapi-idempotency-key-header). A replay carries
/// `Idempotent-Replayed: true`, and with `marker_in_body` (--replay-marker-in-body) also
/// `"idempotent_replayed":true` as the first member of the replayed body.
inline Answer outcome_answer(const idem::Outcome& outcome, bool marker_in_body) {
  const int status = examples::outcome_status(outcome.kind);
  switch (outcome.kind) {
    case idem::Outcome::Kind::kExecuted:
      return examples::make_answer(status, outcome.response.value_or(""));
    case idem::Outcome::Kind::kDuplicate: {
      std::string body = examples::replayed_body(outcome);
      if (marker_in_body) body = examples::with_replay_marker(body);
      return examples::make_answer(status, std::move(body), /*replayed=*/true);
    }
    case idem::Outcome::Kind::kInProgress:
      return error_answer(status, "a request for this order is still being processed");
    case idem::Outcome::Kind::kMismatch:
      return error_answer(status,
                          "this Idempotency-Key or order was already used with another payload");
    case idem::Outcome::Kind::kUnavailable:
      break;
  }
  return error_answer(status, "storage unavailable; nothing was executed");
}

/// The answer to a call that threw `error`: 404 for an unknown account (the claim was released:
/// a retry runs again), else as examples::classify_failure() says.
inline Answer failure_answer(const std::exception_ptr& error, const std::string& request_id,
                             const char* program) {
  try {
    std::rethrow_exception(error);
  } catch (const UnknownAccount& e) {
    return error_answer(404, e.what());
  } catch (const KeyReused& e) {
    return error_answer(422, e.what());
  } catch (...) {
    const examples::Failure failure =
        examples::classify_failure(std::current_exception(), request_id, program);
    return error_answer(failure.status, failure.message);
  }
}

}  // namespace webhook
