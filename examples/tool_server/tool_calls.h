// The tool server's protocol, apart from its HTTP server and its effects (main.cc): JSON-RPC 2.0
// requests as MCP clients send them over HTTP, the tools and their arguments, the idem request of
// a tool call, and the answer to each outcome. Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/http_answer.h"
#include "idem/deduplicator.h"
#include "idem/outcome.h"
#include "idem/request_id.h"

namespace tools {

using Json = nlohmann::ordered_json;  // members in the order written: "jsonrpc", "id", "result"

/// JSON-RPC 2.0 error codes: the standard ones, and the server's own for idem's outcomes (the
/// range -32000 to -32099 is the implementation's).
enum ErrorCode : int {
  kParseError = -32700,      ///< not JSON
  kInvalidRequest = -32600,  ///< JSON, but not a JSON-RPC 2.0 request object
  kMethodNotFound = -32601,  ///< a method the server does not have
  kInvalidParams = -32602,   ///< an unknown tool, bad arguments, no idempotency key
  kInternalError = -32603,   ///< a failure the server did not expect
  kInProgress = -32001,      ///< the first call with this idempotency key still runs (409)
  kMismatch = -32002,        ///< the key was used for another call (422)
  kUnavailable = -32003,     ///< a backend is down; nothing was executed (503)
};

/// The longest idempotency key accepted, in bytes.
inline constexpr std::size_t kMaxKeyBytes = 255;

/// A message refused before idem sees it: its JSON-RPC error, answered with HTTP 400.
struct RpcError : std::runtime_error {
  RpcError(int code, const std::string& message, Json request_id = nullptr)
      : std::runtime_error(message), code(code), id(std::move(request_id)) {}
  int code;
  Json id;  ///< the request's id, null when it could not be read
};

/// A JSON-RPC request.
struct Message {
  Json id;  ///< a string or an integer; null for a notification
  bool notification = false;
  std::string method;
  Json params;  ///< an object, an array, or null when absent
};

/// Parses `body` as one JSON-RPC 2.0 request (MCP sends no batches). Throws RpcError: kParseError
/// when it is not JSON, kInvalidRequest when it is not a request object (`"jsonrpc":"2.0"`, a
/// string `method`, an `id` that is a string or an integer when present, `params` an object or an
/// array when present).
inline Message parse_message(const std::string& body) {
  const Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) throw RpcError(kParseError, "parse error: the body is not JSON");
  if (!json.is_object()) {
    throw RpcError(kInvalidRequest, "invalid request: not a JSON-RPC 2.0 request object");
  }
  Message m;
  if (const auto id = json.find("id"); id != json.end()) {
    if (!id->is_string() && !id->is_number_integer()) {
      throw RpcError(kInvalidRequest, "invalid request: id must be a string or an integer");
    }
    m.id = *id;
  } else {
    m.notification = true;
  }
  const auto version = json.find("jsonrpc");
  if (version == json.end() || *version != "2.0") {
    throw RpcError(kInvalidRequest, R"(invalid request: "jsonrpc" must be "2.0")", m.id);
  }
  const auto method = json.find("method");
  if (method == json.end() || !method->is_string()) {
    throw RpcError(kInvalidRequest, "invalid request: method must be a string", m.id);
  }
  m.method = method->get<std::string>();
  if (const auto params = json.find("params"); params != json.end()) {
    if (!params->is_object() && !params->is_array()) {
      throw RpcError(kInvalidRequest, "invalid request: params must be an object or an array",
                     m.id);
    }
    m.params = *params;
  }
  return m;
}

/// A tool's description, as tools/list gives it.
struct Tool {
  std::string name;
  std::string description;
  Json input_schema;
};

/// The tools (book_ledger_entry, send_notification).
inline const std::vector<Tool>& tool_list() {
  static const std::vector<Tool> tools{
      {"book_ledger_entry",
       "Books one entry on an account's ledger and returns it with the account's balance. Send "
       "params._meta.idempotencyKey, and the same one when you retry the call: a retry returns "
       "the first result, marked \"idempotent_replayed\": true, and books nothing.",
       Json::parse(R"({"type":"object","properties":{
          "account":{"type":"string","minLength":1,"maxLength":64},
          "amount_cents":{"type":"integer","minimum":-1000000000000,"maximum":1000000000000,
                          "not":{"const":0}},
          "memo":{"type":"string","maxLength":200}},
          "required":["account","amount_cents"],"additionalProperties":false})")},
      {"send_notification",
       "Queues a notification to a recipient. Send params._meta.idempotencyKey, and the same one "
       "when you retry the call: a retry returns the first result, marked "
       "\"idempotent_replayed\": true, and queues nothing.",
       Json::parse(R"({"type":"object","properties":{
          "to":{"type":"string","minLength":1,"maxLength":254},
          "message":{"type":"string","minLength":1,"maxLength":2000}},
          "required":["to","message"],"additionalProperties":false})")},
  };
  return tools;
}

/// A tools/call, checked: the tool, its arguments, the idempotency key as the client sent it.
struct ToolCall {
  std::string tool;
  Json arguments;
  std::string key;
};

namespace detail {

// The string member `name` of `arguments`, of `min`..`max` bytes; throws kInvalidParams.
inline void check_string(const Json& arguments, const char* name, std::size_t min, std::size_t max,
                         const Json& id) {
  const auto found = arguments.find(name);
  if (found == arguments.end()) {
    if (min == 0) return;  // optional
    throw RpcError(kInvalidParams, std::string("invalid params: missing argument ") + name, id);
  }
  if (!found->is_string() || found->get_ref<const std::string&>().size() < min ||
      found->get_ref<const std::string&>().size() > max) {
    throw RpcError(kInvalidParams,
                   std::string("invalid params: ") + name + " must be a string of " +
                       std::to_string(min) + " to " + std::to_string(max) + " bytes",
                   id);
  }
  // JSON allows \u0000; PostgreSQL's text does not (22021), and no retry changes that.
  if (found->get_ref<const std::string&>().find('\0') != std::string::npos) {
    throw RpcError(kInvalidParams, std::string("invalid params: ") + name + " holds a NUL byte",
                   id);
  }
}

// Throws kInvalidParams when `arguments` has a member not in `allowed`.
inline void check_members(const Json& arguments, std::initializer_list<std::string_view> allowed,
                          const Json& id) {
  for (const auto& [name, value] : arguments.items()) {
    bool known = false;
    for (const std::string_view a : allowed) known = known || a == name;
    if (!known) throw RpcError(kInvalidParams, "invalid params: unknown argument " + name, id);
  }
}

// Checks the arguments of tool `tool` (one of tool_list()); throws kInvalidParams.
inline void check_arguments(const std::string& tool, const Json& arguments, const Json& id) {
  if (tool == "book_ledger_entry") {
    check_members(arguments, {"account", "amount_cents", "memo"}, id);
    check_string(arguments, "account", 1, 64, id);
    check_string(arguments, "memo", 0, 200, id);
    constexpr std::int64_t kMaxCents = 1'000'000'000'000;  // keeps balances far from overflow
    const auto amount = arguments.find("amount_cents");
    const bool in_range =
        amount != arguments.end() && amount->is_number_integer() &&
        (amount->is_number_unsigned()
             ? amount->get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxCents)
             : amount->get<std::int64_t>() >= -kMaxCents &&
                   amount->get<std::int64_t>() <= kMaxCents);
    if (!in_range || *amount == 0) {
      throw RpcError(kInvalidParams,
                     "invalid params: amount_cents must be an integer, not 0, within "
                     "-1000000000000..1000000000000",
                     id);
    }
  } else {  // send_notification
    check_members(arguments, {"to", "message"}, id);
    check_string(arguments, "to", 1, 254, id);
    check_string(arguments, "message", 1, 2000, id);
  }
}

}  // namespace detail

/// The tool call of a tools/call's `params`: `{"name": tool, "arguments": {...},
/// "_meta": {"idempotencyKey": "..."}}`. Throws RpcError kInvalidParams for params that are not
/// such an object, an unknown tool, arguments its schema refuses, and a missing or malformed
/// idempotency key (a string of 1 to 255 bytes).
inline ToolCall parse_tool_call(const Json& params, const Json& id) {
  if (!params.is_object()) throw RpcError(kInvalidParams, "invalid params: not an object", id);
  const auto name = params.find("name");
  if (name == params.end() || !name->is_string()) {
    throw RpcError(kInvalidParams, "invalid params: name must be a string", id);
  }
  ToolCall call;
  call.tool = name->get<std::string>();
  bool known = false;
  for (const Tool& tool : tool_list()) known = known || tool.name == call.tool;
  if (!known) throw RpcError(kInvalidParams, "invalid params: unknown tool " + call.tool, id);
  call.arguments = Json::object();
  if (const auto arguments = params.find("arguments"); arguments != params.end()) {
    if (!arguments->is_object()) {
      throw RpcError(kInvalidParams, "invalid params: arguments must be an object", id);
    }
    call.arguments = *arguments;
  }
  detail::check_arguments(call.tool, call.arguments, id);
  const auto meta = params.find("_meta");
  const Json* key = nullptr;
  if (meta != params.end() && meta->is_object()) {
    if (const auto found = meta->find("idempotencyKey"); found != meta->end()) key = &*found;
  }
  if (key == nullptr) {
    throw RpcError(kInvalidParams,
                   "invalid params: an idempotency key is required in "
                   "params._meta.idempotencyKey (send the same one when you retry the call)",
                   id);
  }
  if (!key->is_string() || key->get_ref<const std::string&>().empty() ||
      key->get_ref<const std::string&>().size() > kMaxKeyBytes) {
    throw RpcError(kInvalidParams,
                   "invalid params: params._meta.idempotencyKey must be a string of 1 to 255 bytes",
                   id);
  }
  call.key = key->get<std::string>();
  return call;
}

/// idem's request for `call` from client `client`. The request ID is the idempotency key when it
/// is a valid request ID (1–64 bytes of [A-Za-z0-9._~:-], as an agent's tool-call ID
/// "toolu_01…" or a UUID), else its digest ("sha256~…", idem::request_id_or_digest), so a longer
/// key, or one with other characters, works too and its retries still match. One key is one tool
/// call whatever the tool: the intent is "tools/call" for every tool, and the payload whose
/// fingerprint a repeat must match holds the tool's name and arguments, so a key reused for another
/// tool or other arguments is a mismatch.
inline idem::Request tool_request(const ToolCall& call, const std::string& client) {
  idem::Request request;
  request.request_id = idem::request_id_or_digest(call.key);
  // Keys are scoped per client. In a real server this is the authenticated caller; here an
  // X-Client-Id header.
  request.user = client.empty() ? "anonymous" : client;
  request.intent = "tools/call";
  request.payload = Json{{"name", call.tool}, {"arguments", call.arguments}}.dump();
  return request;
}

/// A JSON-RPC result: HTTP 200 (with `Idempotent-Replayed: true` when `replayed`).
inline examples::Answer result_answer(const Json& id, Json result, bool replayed = false) {
  return examples::make_answer(
      200, Json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}}.dump(), replayed);
}

/// A JSON-RPC error with HTTP `status`; a status to retry later (409, 503) carries `Retry-After`
/// and the same in the error's data, `{"retryAfter": 1}`.
inline examples::Answer error_answer(int status, const Json& id, int code,
                                     const std::string& message) {
  Json error{{"code", code}, {"message", message}};
  if (examples::retry_later(status)) error["data"] = {{"retryAfter", examples::kRetryAfterSeconds}};
  return examples::make_answer(status,
                               Json{{"jsonrpc", "2.0"}, {"id", id}, {"error", error}}.dump());
}

/// The answer to a message refused before idem saw it: HTTP 400 with its JSON-RPC error.
inline examples::Answer refusal_answer(const RpcError& e) {
  return error_answer(400, e.id, e.code, e.what());
}

/// The result of tools/call for the tool's output `output` (a JSON object, as stored): as text
/// content, and as structured content. A replay's output carries "idempotent_replayed": true as its
/// first member, in both, since an agent reads bodies, not headers.
inline Json tool_result(const std::string& output, bool replayed) {
  const std::string text = replayed ? examples::with_replay_marker(output) : output;
  return Json{{"content", Json::array({Json{{"type", "text"}, {"text", text}}})},
              {"structuredContent", Json::parse(text)},
              {"isError", false}};
}

/// The answer to a tools/call's outcome: 200 with the tool's result (replayed: the first call's,
/// marked), 409 + Retry-After (kInProgress), 422 (kMismatch), 503 + Retry-After (kUnavailable).
inline examples::Answer outcome_answer(const Json& id, const idem::Outcome& outcome) {
  const int status = examples::outcome_status(outcome.kind);
  switch (outcome.kind) {
    case idem::Outcome::Kind::kExecuted:
      return result_answer(id, tool_result(outcome.response.value_or("{}"), false));
    case idem::Outcome::Kind::kDuplicate:
      return result_answer(id, tool_result(examples::replayed_body(outcome), true),
                           /*replayed=*/true);
    case idem::Outcome::Kind::kInProgress:
      return error_answer(status, id, kInProgress,
                          "a tool call with this idempotency key is in progress; retry later");
    case idem::Outcome::Kind::kMismatch:
      return error_answer(status, id, kMismatch,
                          "this idempotency key was used for another tool call (another tool or "
                          "other arguments)");
    case idem::Outcome::Kind::kUnavailable:
      break;
  }
  return error_answer(status, id, kUnavailable, "storage unavailable; nothing was executed");
}

/// The answer to a tools/call that threw `error` (examples::classify_failure): 400 as
/// kInvalidParams, 503 as kUnavailable (+ Retry-After), 500 as kInternalError.
inline examples::Answer failure_answer(const Json& id, const std::exception_ptr& error,
                                       const std::string& request_id, std::string_view program) {
  const examples::Failure failure = examples::classify_failure(error, request_id, program);
  const int code = failure.status == 400   ? kInvalidParams
                   : failure.status == 503 ? kUnavailable
                                           : kInternalError;
  return error_answer(failure.status, id, code, failure.message);
}

/// The result of `initialize`: MCP's protocol version, the tools capability, the server.
inline Json initialize_result() {
  return Json{{"protocolVersion", "2025-06-18"},
              {"capabilities", {{"tools", {{"listChanged", false}}}}},
              {"serverInfo", {{"name", "idem-tool-server"}, {"version", "1.0.0"}}},
              {"instructions",
               "Every tools/call needs params._meta.idempotencyKey; a retry of a call sends the "
               "same one and gets the first result, marked \"idempotent_replayed\": true."}};
}

/// The result of `tools/list`.
inline Json tools_list_result() {
  Json tools = Json::array();
  for (const Tool& tool : tool_list()) {
    tools.push_back(Json{{"name", tool.name},
                         {"description", tool.description},
                         {"inputSchema", tool.input_schema}});
  }
  return Json{{"tools", tools}};
}

}  // namespace tools
