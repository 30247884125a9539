// idem-tool-server: tools an AI agent can call, and retry, safely. MCP-style JSON-RPC 2.0 over
// HTTP (a POST per message, answered with application/json, as MCP's Streamable HTTP transport
// allows), served by RESTinio on one event loop; each tools/call runs through
// idem::AsyncDeduplicator::run_transactional on that loop, its effect a row written in the call's
// own PostgreSQL transaction with idem's record.
//
//   POST /mcp      {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
//                    "name":"book_ledger_entry","arguments":{"account":"acct-7","amount_cents":500},
//                    "_meta":{"idempotencyKey":"run-42-step-3"}}}       [X-Client-Id: <client>]
//   GET  /metrics  Prometheus text
//
// Methods: initialize, ping, tools/list, tools/call; a message without an id (a notification)
// gets 202 and executes nothing. Tools:
//   book_ledger_entry {account, amount_cents, memo?}  a row in ledger_entries; returns it with
//                                                      the account's balance
//   send_notification {to, message}                   a row in the notifications outbox
// A tools/call needs an idempotency key in params._meta.idempotencyKey: the first call with it
// executes, a retry with it gets the first result again. Answers:
//   200  the result (a replay: the first result with "idempotent_replayed": true as the first
//        member of its structured and text content, and `Idempotent-Replayed: true`)
//   400  -32700 not JSON; -32600 not a JSON-RPC 2.0 request; -32601 an unknown method; -32602 an
//        unknown tool, bad arguments, no idempotency key. Nothing was executed.
//   409  -32001 the first call with this key still runs (Retry-After: 1)
//   422  -32002 the key was used for another tool call (another tool or other arguments)
//   503  -32003 a backend is unavailable; nothing was executed (Retry-After: 1)
//
//   idem-tool-server [--port 8090] [--host 127.0.0.1] [--redis-url URL] [--pg-url URL]
//                    [--schema idem_tools] [--ns tools] [--pg-connections 32]
//                    [--handler-delay-ms 0]
// URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL (`source .services/env`).
// --port 0 picks a free port; the server prints `listening on http://HOST:PORT`.
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
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
#include "common/http_answer.h"
#include "common/restinio_server.h"
#include "common/startup.h"
#include "common/tables.h"
#include "idem/async_deduplicator.h"
#include "idem/metrics.h"
#include "tool_server/tool_calls.h"

// GCC 12 at -O1 (the sanitized builds' level) inlines Asio's coroutine frame allocation down to
// ::operator new and calls the frame class's operator delete a mismatch: a false positive, as in
// src/redis/async_sentinel.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

constexpr const char* kProgram = "idem-tool-server";

using RequestHandle = restinio::request_handle_t;
using tools::Json;

struct Settings {
  std::string host = "127.0.0.1";
  int port = 8090;
  // A tool call holds a connection for its transaction, downstream wait included: 32 at once.
  examples::ServiceFlags service{.schema = "idem_tools", .ns = "tools", .pg_connections = 32};
  std::chrono::milliseconds handler_delay{0};  // simulates a slow downstream
};

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      std::string(kProgram) +
          ": MCP-style JSON-RPC tools (POST /mcp: book_ledger_entry, "
          "send_notification) that agents can retry safely, guarded by idem; GET /metrics.",
      kProgram};
  examples::add_listen_options(app, s.host, s.port);
  examples::add_service_flags(app, s.service);
  examples::add_handler_delay_option(app, s.handler_delay, "a slow downstream");
  examples::parse_or_exit(app, argc, argv);
  return s;
}

// The tables of the tools' effects. Neither has a unique constraint of its own: idem's record, in
// the same transaction, is what keeps a call from writing twice. Returns the schema name quoted.
std::string create_tables(const examples::ServiceFlags& service) {
  return examples::create_tables(
      service.pg_url, service.schema,
      {"ledger_entries (id bigserial PRIMARY KEY, idempotency_key text NOT NULL,"
       " account text NOT NULL, amount_cents bigint NOT NULL, memo text NOT NULL,"
       " created_at timestamptz NOT NULL DEFAULT now())",
       "notifications (id bigserial PRIMARY KEY, idempotency_key text NOT NULL,"
       " recipient text NOT NULL, message text NOT NULL,"
       " created_at timestamptz NOT NULL DEFAULT now())"});
}

// The first value of `result` as an integer.
std::int64_t first_integer(const idem::AsyncResult& result) {
  return std::stoll(std::string(result.get(0, 0).value()));
}

// book_ledger_entry's effect: the entry, and the account's balance after it.
asio::awaitable<std::string> book_ledger_entry(idem::AsyncTransaction& tx, std::string schema,
                                               std::string key, Json arguments) {
  const std::string account = arguments["account"].get<std::string>();
  const std::int64_t amount = arguments["amount_cents"].get<std::int64_t>();
  std::vector<std::optional<std::string>> entry_args{
      std::move(key), account, std::to_string(amount), arguments.value("memo", std::string())};
  const idem::AsyncResult entry =
      co_await tx.exec("INSERT INTO " + schema +
                           ".ledger_entries (idempotency_key, account, amount_cents, memo)"
                           " VALUES ($1, $2, $3, $4) RETURNING id",
                       std::move(entry_args));
  std::vector<std::optional<std::string>> balance_args{account};
  const idem::AsyncResult balance = co_await tx.exec(
      "SELECT sum(amount_cents) FROM " + schema + ".ledger_entries WHERE account = $1",
      std::move(balance_args));
  co_return Json{{"entry_id", first_integer(entry)},
                 {"account", account},
                 {"amount_cents", amount},
                 {"balance_cents", first_integer(balance)}}
      .dump();
}

// send_notification's effect: a row in the outbox that a sender drains.
asio::awaitable<std::string> send_notification(idem::AsyncTransaction& tx, std::string schema,
                                               std::string key, Json arguments) {
  const std::string to = arguments["to"].get<std::string>();
  std::vector<std::optional<std::string>> args{std::move(key), to,
                                               arguments["message"].get<std::string>()};
  const idem::AsyncResult row = co_await tx.exec(
      "INSERT INTO " + schema +
          ".notifications (idempotency_key, recipient, message) VALUES ($1, $2, $3) RETURNING id",
      std::move(args));
  co_return Json{{"notification_id", first_integer(row)}, {"to", to}, {"status", "queued"}}.dump();
}

// The tool's effect in the call's transaction, then the slow downstream; every argument by value
// (the coroutine's frame owns them).
asio::awaitable<std::string> run_tool(idem::AsyncTransaction& tx, std::string schema,
                                      std::string key, tools::ToolCall call,
                                      std::chrono::milliseconds delay) {
  std::string output;
  if (call.tool == "book_ledger_entry") {
    output = co_await book_ledger_entry(tx, schema, std::move(key), std::move(call.arguments));
  } else {
    output = co_await send_notification(tx, schema, std::move(key), std::move(call.arguments));
  }
  if (delay.count() > 0) {
    asio::steady_timer downstream(co_await asio::this_coro::executor, delay);
    co_await downstream.async_wait(asio::use_awaitable);
  }
  co_return output;
}

// Answers one tools/call; runs on the loop until the call completes.
asio::awaitable<void> call_tool(const Settings& s, const std::string& schema,
                                idem::AsyncDeduplicator& dedup, RequestHandle req, Json id,
                                tools::ToolCall call, idem::Request request) {
  // Named first: GCC 12 destroys a lambda temporary inside a co_await expression twice.
  auto effect = [schema, key = request.request_id, call = std::move(call), delay = s.handler_delay](
                    idem::AsyncTransaction& tx) { return run_tool(tx, schema, key, call, delay); };
  examples::Answer answer;
  try {
    const idem::Outcome outcome =
        co_await dedup.run_transactional(request, std::move(effect), asio::use_awaitable);
    answer = tools::outcome_answer(id, outcome);
  } catch (const std::exception&) {
    answer = tools::failure_answer(id, std::current_exception(), request.request_id, kProgram);
  }
  examples::send(req, answer);
}

// Answers one JSON-RPC message posted to /mcp: at once, or (tools/call) from a coroutine started
// through `answering`.
void answer_message(examples::Answering& answering, const Settings& s, const std::string& schema,
                    idem::AsyncDeduplicator& dedup, const RequestHandle& req) {
  try {
    const tools::Message m = tools::parse_message(req->body());
    if (m.notification) return examples::send(req, {202, "", {}});  // executes nothing
    if (m.method == "initialize") {
      return examples::send(req, tools::result_answer(m.id, tools::initialize_result()));
    }
    if (m.method == "ping") return examples::send(req, tools::result_answer(m.id, Json::object()));
    if (m.method == "tools/list") {
      return examples::send(req, tools::result_answer(m.id, tools::tools_list_result()));
    }
    if (m.method != "tools/call") {
      throw tools::RpcError(tools::kMethodNotFound, "method not found: " + m.method, m.id);
    }
    tools::ToolCall call = tools::parse_tool_call(m.params, m.id);
    idem::Request request =
        tools::tool_request(call, std::string(req->header().get_field_or("X-Client-Id", "")));
    answering.spawn(call_tool(s, schema, dedup, req, m.id, std::move(call), std::move(request)));
  } catch (const tools::RpcError& e) {
    examples::send(req, tools::refusal_answer(e));
  }
}

restinio::request_handling_status_t route(examples::Answering& answering, const Settings& s,
                                          const std::string& schema, idem::AsyncDeduplicator& dedup,
                                          const idem::InProcessMetrics& metrics,
                                          const RequestHandle& req) {
  const auto method = req->header().method();
  const auto path = req->header().path();
  if (method == restinio::http_method_get() && path == "/metrics") {
    examples::send_metrics(req, metrics);
  } else if (path != "/mcp") {
    return restinio::request_rejected();  // 501 from RESTinio
  } else if (method == restinio::http_method_post()) {
    answer_message(answering, s, schema, dedup, req);
  } else {
    // MCP's Streamable HTTP: a server that opens no event stream answers GET with 405.
    examples::send(req, examples::make_answer(405, ""));
  }
  return restinio::request_accepted();
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse_settings(argc, argv);
  try {
    const std::string schema = create_tables(settings.service);
    asio::io_context io(1);
    const auto metrics = std::make_shared<idem::InProcessMetrics>();
    const auto dedup = examples::make_async_deduplicator(
        io,
        examples::guard_options(settings.service,
                                std::chrono::seconds(10) + settings.handler_delay,  // > any call
                                std::chrono::hours(24)),  // covers an agent run's retries
        examples::sink_options(settings.service, std::chrono::hours(24)), metrics);
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
