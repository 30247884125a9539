// examples/tool_server end to end: the server runs as a child process against the shared Redis
// and PostgreSQL, in its own schema and Redis namespace, and is driven with an HTTP client as an
// agent's MCP client drives it: JSON-RPC 2.0 messages POSTed to /mcp.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "counting_proxy.h"
#include "examples_child.h"
#include "redis_server.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem::test {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kHandlerDelayMs = 500;  // each tool call holds its claim this long

struct Reply {
  int status = 0;
  bool replayed = false;    // Idempotent-Replayed: true
  std::string retry_after;  // the Retry-After header, "" when absent
  std::string text;         // the body as sent
  json body;                // the body parsed; null when it is not JSON

  // The tool's output in a tools/call result: its structured content.
  [[nodiscard]] const json& output() const { return body.at("result").at("structuredContent"); }
  // The JSON-RPC error's code, 0 when there is none.
  [[nodiscard]] int error_code() const {
    return body.contains("error") ? body["error"].value("code", 0) : 0;
  }
};

Reply post(int port, const std::string& body, const std::string& path = "/mcp") {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(seconds(10));
  const auto result = client.Post(path, body, "application/json");
  if (!result) return {};
  return {result->status, result->get_header_value("Idempotent-Replayed") == "true",
          result->get_header_value("Retry-After"), result->body,
          json::parse(result->body, nullptr, /*allow_exceptions=*/false)};
}

// A tools/call message: `tool` with `arguments`, the idempotency key `key` in params._meta.
std::string tools_call(const std::string& tool, const json& arguments, const std::string& key,
                       int id = 1) {
  return json{
      {"jsonrpc", "2.0"},
      {"id", id},
      {"method", "tools/call"},
      {"params", {{"name", tool}, {"arguments", arguments}, {"_meta", {{"idempotencyKey", key}}}}}}
      .dump();
}

json entry(const std::string& account, std::int64_t cents) {
  return {{"account", account}, {"amount_cents", cents}, {"memo", "test"}};
}

std::int64_t count(const std::string& pg_url, const std::string& sql) {
  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  return tx.exec1(sql)[0].as<std::int64_t>();
}

class ToolServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_.start({IDEM_TOOL_SERVER_BIN, "--handler-delay-ms", std::to_string(kHandlerDelayMs)},
                  "tools");
  }

  static void TearDownTestSuite() { server_.stop(); }

  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    ASSERT_GT(server_.port, 0) << "the server did not start:\n" << server_.process->tail();
  }

  static Reply send(const std::string& body) { return post(server_.port, body); }

  static Reply call(const std::string& tool, const json& arguments, const std::string& key,
                    int id = 1) {
    return send(tools_call(tool, arguments, key, id));
  }

  // Rows of `table` whose idempotency key is `key`.
  static std::int64_t rows(const std::string& table, const std::string& key) {
    return count(server_.pg_url, "SELECT count(*) FROM " + server_.schema + "." + table +
                                     " WHERE idempotency_key = '" + key + "'");
  }

  static inline ExampleServer server_;
};

TEST_F(ToolServerTest, AFirstCallExecutesAndARetryReplaysItWithTheMarkerInTheBody) {
  const Reply first = call("book_ledger_entry", entry("acct-1", 500), "k-first", 1);
  ASSERT_EQ(first.status, 200) << first.text;
  EXPECT_FALSE(first.replayed);
  EXPECT_EQ(first.body["jsonrpc"], "2.0");
  EXPECT_EQ(first.body["id"], 1);
  EXPECT_EQ(first.body["result"]["isError"], false);
  EXPECT_EQ(first.output()["balance_cents"], 500);
  EXPECT_FALSE(first.output().contains("idempotent_replayed"));
  EXPECT_EQ(json::parse(first.body["result"]["content"][0]["text"].get<std::string>()),
            first.output());

  const Reply retry = call("book_ledger_entry", entry("acct-1", 500), "k-first", 2);
  ASSERT_EQ(retry.status, 200) << retry.text;
  EXPECT_TRUE(retry.replayed);
  EXPECT_EQ(retry.body["id"], 2);  // the retry's own id
  json replayed = retry.output();
  EXPECT_EQ(replayed["idempotent_replayed"], true);
  replayed.erase("idempotent_replayed");
  EXPECT_EQ(replayed, first.output());  // the first result, entry_id and balance included
  const std::string text = retry.body["result"]["content"][0]["text"];
  EXPECT_TRUE(text.starts_with(R"({"idempotent_replayed":true,"entry_id":)")) << text;
  EXPECT_EQ(rows("ledger_entries", "k-first"), 1);
}

TEST_F(ToolServerTest, ConcurrentDuplicatesHaveOneEffect) {
  constexpr int kCalls = 8;
  std::vector<Reply> replies(kCalls);
  std::vector<std::thread> agents;
  for (int i = 0; i < kCalls; ++i) {
    agents.emplace_back([&, i] {
      replies[i] = call("book_ledger_entry", entry("acct-2", 100), "k-concurrent", i);
    });
  }
  for (auto& agent : agents) agent.join();
  int executed = 0, replayed = 0, in_progress = 0;
  for (const Reply& r : replies) {
    if (r.status == 200 && !r.replayed) {
      ++executed;
    } else if (r.status == 200) {
      ++replayed;
      EXPECT_EQ(r.output()["idempotent_replayed"], true);
    } else if (r.status == 409) {
      ++in_progress;
      EXPECT_EQ(r.retry_after, "1");
      EXPECT_EQ(r.error_code(), -32001) << r.text;
      EXPECT_EQ(r.body["error"]["data"]["retryAfter"], 1);
    }
  }
  EXPECT_EQ(executed, 1);
  EXPECT_EQ(executed + replayed + in_progress, kCalls) << server_.process->tail();
  EXPECT_EQ(rows("ledger_entries", "k-concurrent"), 1);
}

TEST_F(ToolServerTest, ARetryWhileTheFirstRunsIs409WithRetryAfter) {
  Reply first;
  std::thread agent([&] { first = call("book_ledger_entry", entry("acct-3", 100), "k-inflight"); });
  // Once the claim is in Redis the first call holds it for kHandlerDelayMs.
  const bool claimed = wait_until(seconds(5), [] {
    for (const auto& key : server_.keys()) {
      if (key.ends_with(":k-inflight")) return true;
    }
    return false;
  });
  const Reply retry = call("book_ledger_entry", entry("acct-3", 100), "k-inflight", 2);
  agent.join();
  ASSERT_TRUE(claimed) << "the first call never claimed its key";
  EXPECT_EQ(retry.status, 409) << retry.text;
  EXPECT_EQ(retry.retry_after, "1");
  EXPECT_EQ(retry.error_code(), -32001);
  EXPECT_EQ(retry.body["id"], 2);
  EXPECT_EQ(first.status, 200) << first.text;
  EXPECT_EQ(rows("ledger_entries", "k-inflight"), 1);
}

TEST_F(ToolServerTest, AKeyReusedWithOtherArgumentsOrAnotherToolIs422) {
  ASSERT_EQ(call("book_ledger_entry", entry("acct-4", 100), "k-reuse").status, 200);
  const Reply other = call("book_ledger_entry", entry("acct-4", 999), "k-reuse");
  EXPECT_EQ(other.status, 422) << other.text;
  EXPECT_EQ(other.error_code(), -32002);
  const Reply tool = call("send_notification", {{"to", "a@b.c"}, {"message", "hi"}}, "k-reuse");
  EXPECT_EQ(tool.status, 422) << tool.text;
  EXPECT_EQ(rows("ledger_entries", "k-reuse"), 1);
  EXPECT_EQ(rows("notifications", "k-reuse"), 0);
}

// Each malformed message gets its JSON-RPC error (HTTP 400) and executes nothing; a notification
// (no id) gets 202 and executes nothing either.
TEST_F(ToolServerTest, MalformedJsonRpcGetsItsErrorCodeAndExecutesNothing) {
  const json good_params = {{"name", "book_ledger_entry"},
                            {"arguments", entry("acct-5", 100)},
                            {"_meta", {{"idempotencyKey", "k-bad"}}}};
  const auto message = [&](const json& changes) {
    json m = {{"jsonrpc", "2.0"}, {"id", 7}, {"method", "tools/call"}, {"params", good_params}};
    m.merge_patch(changes);  // a member set to null is removed
    return m.dump();
  };
  struct Case {
    std::string body;
    int code;
  };
  const std::vector<Case> cases{
      {"{not json", -32700},
      {"", -32700},
      {"[" + message({}) + "]", -32600},  // a batch: MCP sends none
      {"42", -32600},
      {message({{"jsonrpc", "1.0"}}), -32600},
      {message({{"jsonrpc", nullptr}}), -32600},
      {message({{"method", nullptr}}), -32600},
      {message({{"method", 3}}), -32600},
      {message({{"id", json::object()}}), -32600},
      {message({{"params", "book_ledger_entry"}}), -32600},
      {message({{"method", "tools/execute"}}), -32601},
      {message({{"params", {{"name", nullptr}}}}), -32602},
      {message({{"params", {{"arguments", "acct-5"}}}}), -32602},
      {message({{"params", {{"arguments", {{"amount_cents", "100"}}}}}}), -32602},
      {message({{"params", {{"arguments", {{"amount_cents", 0}}}}}}), -32602},
      {message({{"params", {{"arguments", {{"amount_cents", 1.5}}}}}}), -32602},
      {message({{"params", {{"arguments", {{"account", nullptr}}}}}}), -32602},
      {message({{"params", {{"arguments", {{"overdraft", true}}}}}}), -32602},
      // PostgreSQL's text holds no NUL byte: it was a 500 (22021 from the INSERT).
      {message({{"params", {{"arguments", {{"memo", std::string("a\0b", 3)}}}}}}), -32602},
      {message({{"params", {{"_meta", nullptr}}}}), -32602},  // no idempotency key
      {message({{"params", {{"_meta", {{"idempotencyKey", ""}}}}}}), -32602},
      {message({{"params", {{"_meta", {{"idempotencyKey", 12}}}}}}), -32602},
      {message({{"params", {{"_meta", {{"idempotencyKey", std::string(256, 'k')}}}}}}), -32602},
  };
  for (const Case& c : cases) {
    const Reply reply = send(c.body);
    EXPECT_EQ(reply.status, 400) << c.body << "\n" << reply.text;
    EXPECT_EQ(reply.error_code(), c.code) << c.body << "\n" << reply.text;
    EXPECT_EQ(reply.body["jsonrpc"], "2.0") << reply.text;
  }
  const Reply notification = send(message({{"id", nullptr}}));
  EXPECT_EQ(notification.status, 202);
  EXPECT_TRUE(notification.text.empty()) << notification.text;
  EXPECT_EQ(count(server_.pg_url, "SELECT count(*) FROM " + server_.schema +
                                      ".ledger_entries WHERE account = "
                                      "'acct-5'"),
            0);
  for (const auto& key : server_.keys())
    EXPECT_FALSE(key.ends_with(":k-bad")) << key;  // never claimed
}

TEST_F(ToolServerTest, AnUnknownToolIsInvalidParams) {
  const Reply reply = call("drop_ledger", entry("acct-6", 100), "k-unknown");
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.error_code(), -32602);
  EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("drop_ledger"),
            std::string::npos);
  EXPECT_EQ(rows("ledger_entries", "k-unknown"), 0);
}

// A key that is no request ID (a space, a '/', over 64 bytes) is taken as its digest, and a retry
// with the same key still replays.
TEST_F(ToolServerTest, SendNotificationQueuesOneRowUnderAKeyThatIsNoRequestId) {
  const std::string key = "agent run 7f3c/step 3/" + std::string(64, 'x');
  const json arguments = {{"to", "ops@example.com"}, {"message", "refund 42 booked"}};
  const Reply first = call("send_notification", arguments, key);
  ASSERT_EQ(first.status, 200) << first.text;
  EXPECT_EQ(first.output()["status"], "queued");
  const Reply retry = call("send_notification", arguments, key, 2);
  EXPECT_EQ(retry.status, 200);
  EXPECT_TRUE(retry.replayed);
  EXPECT_EQ(retry.output()["notification_id"], first.output()["notification_id"]);
  EXPECT_EQ(retry.output()["idempotent_replayed"], true);
  EXPECT_EQ(count(server_.pg_url, "SELECT count(*) FROM " + server_.schema +
                                      ".notifications WHERE message = 'refund 42 booked'"
                                      " AND idempotency_key LIKE 'sha256~%'"),
            1);
}

TEST_F(ToolServerTest, InitializeAndToolsListDescribeTheServer) {
  const Reply init = send(R"({"jsonrpc":"2.0","id":"i-1","method":"initialize","params":{
      "protocolVersion":"2025-06-18","capabilities":{},
      "clientInfo":{"name":"test","version":"1"}}})");
  ASSERT_EQ(init.status, 200) << init.text;
  EXPECT_EQ(init.body["id"], "i-1");
  EXPECT_EQ(init.body["result"]["protocolVersion"], "2025-06-18");
  EXPECT_TRUE(init.body["result"]["capabilities"].contains("tools"));
  const Reply list = send(R"({"jsonrpc":"2.0","id":2,"method":"tools/list"})");
  ASSERT_EQ(list.status, 200) << list.text;
  std::vector<std::string> names;
  for (const json& tool : list.body["result"]["tools"]) {
    names.push_back(tool["name"]);
    EXPECT_EQ(tool["inputSchema"]["type"], "object");
  }
  EXPECT_EQ(names, (std::vector<std::string>{"book_ledger_entry", "send_notification"}));
  EXPECT_EQ(send(R"({"jsonrpc":"2.0","id":3,"method":"ping"})").body["result"], json::object());
  httplib::Client client("127.0.0.1", server_.port);
  const auto get = client.Get("/mcp");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);  // no event stream
}

// The test's proxy was inherited by the example server the test forked, listening socket and all,
// so a backend "taken away" still accepted connections and a reconnect hung until its connect
// timeout. A child started while a proxy listens must not keep the proxy's port open.
TEST(ToolServerUnavailable, AProxyTakenAwayRefusesConnectionsThoughAChildStartedDuringItsLife) {
  auto proxy = std::make_unique<CountingProxy>(CountingProxy::Protocol::kPostgres, "127.0.0.1", 1);
  const int port = proxy->port();
  ChildProcess child({"/bin/sh", "-c", "echo started; exec sleep 30"});
  ASSERT_TRUE(child.wait_for_line("started", seconds(10)));  // exec'd: what it inherits, it keeps
  proxy.reset();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  const int connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  const int error = errno;
  ::close(fd);
  EXPECT_EQ(connected, -1);
  EXPECT_EQ(error, ECONNREFUSED);
}

// The server's PostgreSQL through a proxy that is then taken away: a call answers 503 with
// Retry-After and the JSON-RPC error -32003, and executes nothing.
TEST(ToolServerUnavailable, ABackendDownIs503WithRetryAfterAndExecutesNothing) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  static const std::regex form(R"((postgres(?:ql)?://[^@/]+@)([^:/]+):([0-9]+)(/[^?]+))");
  std::smatch m;
  if (!std::regex_match(pg_url, m, form)) GTEST_SKIP() << "IDEM_TEST_PG_URL is not user@host:port";
  auto proxy =
      std::make_unique<CountingProxy>(CountingProxy::Protocol::kPostgres, m[2], std::stoi(m[3]));
  ExampleServer server;
  server.start({IDEM_TOOL_SERVER_BIN}, "tools_down",
               m[1].str() + "127.0.0.1:" + std::to_string(proxy->port()) + m[4].str() +
                   "?sslmode=disable&gssencmode=disable");
  ASSERT_GT(server.port, 0) << server.process->tail();
  const Reply up = post(server.port, tools_call("book_ledger_entry", entry("acct-8", 100), "k-up"));
  ASSERT_EQ(up.status, 200) << up.text << "\n" << server.process->tail();

  proxy.reset();  // PostgreSQL is gone: its connections closed, its port refuses
  const Reply down =
      post(server.port, tools_call("book_ledger_entry", entry("acct-8", 100), "k-down"));
  EXPECT_EQ(down.status, 503) << down.text << "\n" << server.process->tail();
  EXPECT_EQ(down.retry_after, "1");
  EXPECT_EQ(down.error_code(), -32003);
  EXPECT_EQ(down.body["error"]["data"]["retryAfter"], 1);
  EXPECT_EQ(count(pg_url, "SELECT count(*) FROM " + server.schema +
                              ".ledger_entries WHERE idempotency_key = 'k-down'"),
            0);
  server.stop();
}

}  // namespace
}  // namespace idem::test
