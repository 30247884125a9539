// idem-fc-runtime: a Function Compute custom runtime (event handler) guarded by idem.
//
// The platform sends `POST /initialize` once per instance and `POST /invoke` per invocation, the
// event as the body, with `x-fc-request-id`. Asynchronous invocations are delivered at least once:
// a retry of the same invocation carries the same `x-fc-request-id`. Here each invocation grants
// loyalty points for a paid order, in one Postgres transaction with idem's claim row, so a retry
// replays the first result instead of granting twice.
//
// Contract (Alibaba Cloud FC custom runtime spec): listen on FC_SERVER_PORT (default 9000);
// answer 200 with the function result as the body and `x-fc-status: 200`; report a function
// error as 404 with `x-fc-status: 404` and a body {"errorType":..., "errorMessage":...}; write
// `FC Invoke Start RequestId: <id>` / `FC Invoke End RequestId: <id>` (and the Initialize pair)
// to stdout.
//
// Events: an invocation's own event {"user":..., "order_id":..., "points":...}, or an HTTP
// trigger's event, whose `body` carries that JSON as a string (base64 when `isBase64Encoded`).
// idem's fingerprint decodes such a body (FingerprintOptions::embedded_json) and leaves out the
// members that change per delivery (headers, requestContext), so a redelivered HTTP event is a
// duplicate, not a mismatch.
//
// The request ID: the event's `requestId` when present (the producer's ID survives a resubmission
// as a new invocation), else `x-fc-request-id` (the platform's ID, the same across its retries).
// Outcomes: executed or replayed → 200 with the result; in progress (a retry racing the first
// delivery) or unavailable → 404, so the platform retries later; key reuse with another event →
// 404 (errorType IdempotencyMismatch); an event whose user cannot form a key (over 512 bytes) →
// 404 (InvalidKey); a failed handler → 404 and the claim is released, so the platform's retry
// runs it again.
//
//   idem-fc-runtime [--host 0.0.0.0] [--port $FC_SERVER_PORT|9000] [--redis-url URL] [--pg-url URL]
//                   [--schema idem_fc] [--ns fc] [--pg-connections 8]
// URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL. --port 0 picks a free port; the server
// prints `listening on http://HOST:PORT`.
#include <httplib.h>

#include <chrono>
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
  std::string host = "0.0.0.0";
  int port = 9000;
  examples::ServiceFlags service{.schema = "idem_fc", .ns = "fc"};
};

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "idem-fc-runtime: a Function Compute custom runtime (POST /initialize, POST /invoke) that "
      "grants loyalty points once per invocation, guarded by idem.",
      "idem-fc-runtime"};
  app.add_option("--host", s.host, "Address to listen on")->capture_default_str();
  examples::add_port_option(app, s.port)->envname("FC_SERVER_PORT");
  examples::add_service_flags(app, s.service);
  examples::parse_or_exit(app, argc, argv);
  return s;
}

// One line to stdout (where the platform collects logs), whole even under concurrent calls.
void print_line(const std::string& line) {
  static std::mutex out;
  const std::lock_guard lock(out);
  std::cout << line << std::endl;
}

// A function error, reported to the platform as 404 + x-fc-status: 404.
struct FunctionError : std::runtime_error {
  FunctionError(std::string type, const std::string& message)
      : std::runtime_error(message), type(std::move(type)) {}
  std::string type;
};

struct Event {
  std::string user;
  std::string order_id;
  std::int64_t points = 0;
};

// The body of an HTTP trigger's event: a JSON string, base64 when the event says so.
const idem::EmbeddedJson kHttpBody{.pointer = "/body", .base64_flag = "/isBase64Encoded"};

// The invocation's event, or the one in an HTTP trigger event's body (decoded by idem's
// fingerprinter: no base64 or JSON-in-a-string code of the runtime's own).
nlohmann::json event_json(const std::string& event) {
  nlohmann::json json = nlohmann::json::parse(event);
  if (json.is_object() && json.contains("requestContext") && json.contains("body") &&
      json["body"].is_string()) {
    static const idem::Fingerprinter body_reader(
        {.include = {"/body"}, .embedded_json = {kHttpBody}});
    json = nlohmann::json::parse(body_reader.canonicalize(event)).at("body");
  }
  return json;
}

constexpr const char* kExpected =
    R"(expected {"user":..., "order_id":..., "points": a whole number >0})";

Event parse_event(const std::string& body) {
  try {
    const nlohmann::json json = event_json(body);
    // Whole points only: get<std::int64_t>() would truncate 10.7 to 10.
    if (!json.at("points").is_number_integer()) throw FunctionError("InvalidEvent", kExpected);
    Event e{json.at("user").get<std::string>(), json.at("order_id").get<std::string>(),
            json.at("points").get<std::int64_t>()};
    if (!e.user.empty() && !e.order_id.empty() && e.points > 0) return e;
  } catch (const nlohmann::json::exception&) {
  } catch (const idem::PayloadError& e) {
    throw FunctionError("InvalidEvent", e.what());
  }
  throw FunctionError("InvalidEvent", kExpected);
}

// The function: everything is created by the first /initialize (or the first /invoke when the
// function has no initializer configured).
class Function {
 public:
  explicit Function(Settings settings) : settings_(std::move(settings)) {}

  // The platform's initializer hook: tables, idem's migration, connection pools. Thread-safe;
  // a failed attempt is retried by the next call.
  void initialize() {
    try {
      std::call_once(initialized_, [this] { create(); });
    } catch (const pqxx::broken_connection& e) {  // PostgreSQL unreachable: the log says why
      std::cerr << "initialize: " << idem::redact_credentials(e.what()) << "\n";
      throw FunctionError("Unavailable", "PostgreSQL is unreachable; nothing was executed");
    } catch (const idem::BackendError& e) {
      throw FunctionError("Unavailable", e.what());
    }
  }

  // Creates the tables, idem's migration and the deduplicator (initialize(), once).
  void create() {
    pqxx::connection conn(settings_.service.pg_url);
    pqxx::work tx(conn);
    const std::string schema = tx.quote_name(settings_.service.schema);
    tx.exec0("CREATE SCHEMA IF NOT EXISTS " + schema);
    tx.exec0("CREATE TABLE IF NOT EXISTS " + schema +
             ".orders (order_id text PRIMARY KEY, paid boolean NOT NULL)");
    tx.exec0("CREATE TABLE IF NOT EXISTS " + schema +
             ".point_grants (id bigserial PRIMARY KEY, request_id text NOT NULL, user_id text "
             "NOT NULL,"
             " order_id text NOT NULL, points bigint NOT NULL, created_at timestamptz NOT NULL "
             "DEFAULT now())");
    tx.exec0("CREATE TABLE IF NOT EXISTS " + schema +
             ".loyalty (user_id text PRIMARY KEY, points bigint NOT NULL)");
    tx.exec0("INSERT INTO " + schema +
             ".orders SELECT 'o-' || g, true FROM generate_series(1, 100) g"
             " ON CONFLICT DO NOTHING");
    tx.commit();

    idem::RedisGuardOptions guard;
    guard.redis.url = settings_.service.redis_url;
    guard.ns = settings_.service.ns;
    guard.lease = std::chrono::seconds(60);   // longer than the function's timeout
    guard.retention = std::chrono::hours(1);  // covers the platform's async retries
    idem::PgSinkOptions sink;
    sink.conninfo = settings_.service.pg_url;
    sink.schema = settings_.service.schema;
    sink.ns = settings_.service.ns;
    sink.retention = std::chrono::hours(24);  // a late resubmission still replays
    idem::DeduplicatorOptions options;
    auto redis_guard = std::make_shared<idem::RedisGuard>(guard);
    examples::check_redis_at_startup(*redis_guard, std::cerr);
    options.guard = std::move(redis_guard);
    options.sink = std::make_shared<idem::PgSink>(sink);
    options.sink->migrate();
    // An HTTP trigger's body is fingerprinted as JSON (base64 or not); what changes per
    // delivery is left out.
    options.fingerprint =
        idem::FingerprintOptions{.exclude = {"/headers", "/requestContext", "/isBase64Encoded"},
                                 .embedded_json = {kHttpBody}};
    options.on_decision = [](const idem::DecisionEvent& e) {
      print_line("decision request_id=" + std::string(e.request_id) + " outcome=" +
                 std::string(e.handler_failed ? "handler_failed" : to_string(e.outcome)) +
                 " layer=" + std::string(to_string(e.layer)) +
                 " latency_us=" + std::to_string(e.latency.count()));
    };
    dedup_ = std::make_unique<idem::Deduplicator>(std::move(options));
  }

  // One invocation: the function result, or FunctionError.
  std::string invoke(const std::string& fc_request_id, const std::string& body) {
    initialize();
    const Event event = parse_event(body);
    idem::Request request;
    try {
      request.request_id = idem::request_id_from_json(body).value_or(fc_request_id);
      idem::validate_request_id(request.request_id);
    } catch (const idem::Error& e) {
      throw FunctionError("InvalidRequestId", e.what());
    }
    request.user = event.user;
    request.intent = "grant-points";
    request.payload = body;

    idem::Outcome outcome;
    try {
      outcome = dedup_->run_transactional(request, [&](pqxx::transaction_base& tx) {
        return grant_points(tx, request.request_id, event);
      });
    } catch (const idem::BackendError& e) {
      throw FunctionError("Unavailable", e.what());
    } catch (const idem::InvalidKey& e) {  // e.g. a user longer than a key component may be
      throw FunctionError("InvalidKey", e.what());
    } catch (const idem::PayloadError& e) {  // the fingerprint's: a duplicate member, over 1 MiB
      throw FunctionError("InvalidEvent", e.what());
    }
    switch (outcome.kind) {
      case idem::Outcome::Kind::kExecuted:
      case idem::Outcome::Kind::kDuplicate:
        return outcome.response.value_or(R"({"status":"duplicate"})");
      case idem::Outcome::Kind::kInProgress:
        throw FunctionError("InProgress",
                            "the first delivery of " + request.request_id + " is still running");
      case idem::Outcome::Kind::kMismatch:
        throw FunctionError("IdempotencyMismatch",
                            request.request_id + " was used with another event");
      case idem::Outcome::Kind::kUnavailable:
        throw FunctionError("Unavailable", "storage unavailable; nothing was executed");
    }
    throw std::logic_error("unknown outcome");
  }

 private:
  // The business effect, in idem's transaction.
  std::string grant_points(pqxx::transaction_base& tx, const std::string& request_id,
                           const Event& e) const {
    const std::string schema = tx.quote_name(settings_.service.schema);
    if (tx.exec_params("SELECT 1 FROM " + schema + ".orders WHERE order_id = $1 AND paid",
                       e.order_id)
            .empty()) {
      // Not replicated here yet: fail, release the claim, and let the platform retry.
      throw FunctionError("OrderNotFound", "no paid order " + e.order_id);
    }
    tx.exec_params0(
        "INSERT INTO " + schema +
            ".point_grants (request_id, user_id, order_id, points) VALUES ($1, $2, $3, $4)",
        request_id, e.user, e.order_id, e.points);
    const pqxx::row balance = tx.exec_params1(
        "INSERT INTO " + schema +
            ".loyalty VALUES ($1, $2) ON CONFLICT (user_id)"
            " DO UPDATE SET points = loyalty.points + excluded.points RETURNING points",
        e.user, e.points);
    return nlohmann::json{{"user", e.user},
                          {"order_id", e.order_id},
                          {"granted", e.points},
                          {"balance", balance[0].as<std::int64_t>()}}
        .dump();
  }

  Settings settings_;
  std::once_flag initialized_;
  std::unique_ptr<idem::Deduplicator> dedup_;
};

void reply(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_header("x-fc-status", std::to_string(status));
  res.set_content(body, "application/json");
}

// Runs `body` between the FC log markers; maps FunctionError and any other failure to 404.
template <class Body>
void serve(const char* phase, const httplib::Request& req, httplib::Response& res, Body&& body) {
  const std::string id = req.get_header_value("x-fc-request-id");
  // Only a valid ID reaches the log: a header with CR/LF must not forge log lines.
  const std::string logged_id = idem::is_valid_request_id(id) ? id : "(invalid)";
  print_line("FC " + std::string(phase) + " Start RequestId: " + logged_id);
  try {
    reply(res, 200, body(id));
  } catch (const FunctionError& e) {
    reply(res, 404, nlohmann::json{{"errorType", e.type}, {"errorMessage", e.what()}}.dump());
  } catch (const std::exception& e) {
    reply(res, 404,
          nlohmann::json{{"errorType", "UnhandledError"}, {"errorMessage", e.what()}}.dump());
  }
  print_line("FC " + std::string(phase) + " End RequestId: " + logged_id +
             " status=" + std::to_string(res.status));
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse_settings(argc, argv);
  examples::StopOnSignal stop;  // before any thread starts

  Function function(settings);
  httplib::Server server;
  server.Post("/initialize", [&](const httplib::Request& req, httplib::Response& res) {
    serve("Initialize", req, res, [&](const std::string&) {
      function.initialize();
      return std::string("{}");
    });
  });
  server.Post("/invoke", [&](const httplib::Request& req, httplib::Response& res) {
    serve("Invoke", req, res, [&](const std::string& id) { return function.invoke(id, req.body); });
  });

  const int port = examples::bind_exclusive(server, settings.host, settings.port);
  if (port < 0) {
    std::cerr << "idem-fc-runtime: cannot listen on " << settings.host << ":" << settings.port
              << "\n";
    return 1;
  }
  const auto watching = stop.watch(server);
  std::cout << "listening on http://" << settings.host << ":" << port << std::endl;
  if (!server.listen_after_bind()) {
    std::cerr << "idem-fc-runtime: accepting connections failed\n";
    return 1;
  }
  std::cout << "stopped" << std::endl;
  return 0;
}
