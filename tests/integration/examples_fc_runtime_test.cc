// examples/fc_runtime end to end: the custom runtime runs as a child process and the test plays
// the Function Compute platform, replaying invocations the way its asynchronous retries do.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "examples_child.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem::test {
namespace {

using std::chrono::seconds;

struct Answer {
  int status = 0;
  std::string fc_status;
  std::string body;
};

class FcRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    redis_url_ = service_setting("IDEM_TEST_REDIS_URL");
    pg_url_ = service_setting("IDEM_TEST_PG_URL");
    if (redis_url_.empty() || pg_url_.empty()) return;
    schema_ = unique_name("fc");
    runtime_ =
        new ChildProcess({IDEM_FC_RUNTIME_BIN, "--host", "127.0.0.1", "--port", "0", "--redis-url",
                          redis_url_, "--pg-url", pg_url_, "--schema", schema_, "--ns", schema_});
    const auto line = runtime_->wait_for_line("listening on http://127.0.0.1:", seconds(20));
    if (line) port_ = std::stoi(line->substr(line->rfind(':') + 1));
  }

  static void TearDownTestSuite() {
    if (runtime_ == nullptr) return;
    runtime_->signal(SIGTERM);
    EXPECT_EQ(runtime_->wait_exit(seconds(10)), 0) << runtime_->tail();
    delete runtime_;
    runtime_ = nullptr;
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
    tx.commit();
    const std::string keys =
        redis_cli(redis_url_, {"--scan", "--pattern", "idem:" + schema_ + ":*"});
    for (std::size_t start = 0; start < keys.size();) {
      const std::size_t end = std::min(keys.find('\n', start), keys.size());
      if (end > start) redis_cli(redis_url_, {"DEL", keys.substr(start, end - start)});
      start = end + 1;
    }
  }

  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    ASSERT_GT(port_, 0) << "the runtime did not start:\n" << runtime_->tail();
    ASSERT_EQ(call("/initialize", "init-" + schema_, "").status, 200) << runtime_->tail();
  }

  // What the platform sends: POST with x-fc-request-id and the event as an octet stream.
  static Answer call(const std::string& path, const std::string& fc_request_id,
                     const std::string& event) {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(seconds(10));
    const auto result =
        client.Post(path.c_str(), {{"x-fc-request-id", fc_request_id}, {"x-fc-control-path", path}},
                    event, "application/octet-stream");
    if (!result) return {};
    return {result->status, result->get_header_value("x-fc-status"), result->body};
  }

  static Answer invoke(const std::string& fc_request_id, const std::string& event) {
    return call("/invoke", fc_request_id, event);
  }

  static std::int64_t grants(const std::string& order) {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    return tx
        .exec_params1("SELECT count(*) FROM " + schema_ + ".point_grants WHERE order_id = $1",
                      order)[0]
        .as<std::int64_t>();
  }

  static inline std::string redis_url_;
  static inline std::string pg_url_;
  static inline std::string schema_;
  static inline ChildProcess* runtime_ = nullptr;
  static inline int port_ = 0;
};

TEST_F(FcRuntimeTest, PlatformRetriesOfOneInvocationRunOnce) {
  const std::string event = R"({"user":"u1","order_id":"o-1","points":10})";
  const Answer first = invoke("fc-req-1", event);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(first.fc_status, "200");
  EXPECT_NE(first.body.find(R"("granted":10)"), std::string::npos) << first.body;

  // Sequential retries, then a burst of concurrent ones: all replay the first result.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(invoke("fc-req-1", event).body, first.body);
  std::vector<Answer> burst(8);
  std::vector<std::thread> retries;
  for (auto& answer : burst) retries.emplace_back([&] { answer = invoke("fc-req-1", event); });
  for (auto& t : retries) t.join();
  for (const Answer& a : burst) {
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.body, first.body);
  }
  EXPECT_EQ(grants("o-1"), 1);
  EXPECT_TRUE(runtime_->wait_for_line("FC Invoke Start RequestId: fc-req-1", seconds(1)));
  EXPECT_TRUE(runtime_->wait_for_line("FC Invoke End RequestId: fc-req-1", seconds(1)));
}

TEST_F(FcRuntimeTest, ConcurrentFirstDeliveriesRunOnceAndTheLosersAskForARetry) {
  const std::string event = R"({"user":"u2","order_id":"o-2","points":5})";
  std::vector<Answer> answers(8);
  std::vector<std::thread> deliveries;
  for (auto& answer : answers) deliveries.emplace_back([&] { answer = invoke("fc-req-2", event); });
  for (auto& t : deliveries) t.join();
  int ok = 0;
  for (const Answer& a : answers) {
    if (a.status == 200) {
      ++ok;
    } else {
      EXPECT_EQ(a.status, 404);
      EXPECT_EQ(a.fc_status, "404");
      EXPECT_NE(a.body.find(R"("errorType":"InProgress")"), std::string::npos) << a.body;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(invoke("fc-req-2", event).status, 200);  // the platform's later retry
  EXPECT_EQ(grants("o-2"), 1);
}

TEST_F(FcRuntimeTest, EventRequestIdWinsOverTheInvocationId) {
  // A producer resubmits its event as a new invocation: new x-fc-request-id, same requestId.
  const std::string event = R"({"requestId":"evt-3","user":"u3","order_id":"o-3","points":7})";
  const Answer first = invoke("fc-req-3a", event);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(invoke("fc-req-3b", event).body, first.body);
  EXPECT_EQ(grants("o-3"), 1);
}

TEST_F(FcRuntimeTest, AFailedInvocationRunsAgainOnRetry) {
  const std::string event = R"({"user":"u4","order_id":"o-late","points":3})";
  const Answer failed = invoke("fc-req-4", event);
  EXPECT_EQ(failed.status, 404);
  EXPECT_EQ(failed.fc_status, "404");
  EXPECT_NE(failed.body.find(R"("errorType":"OrderNotFound")"), std::string::npos) << failed.body;
  {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("INSERT INTO " + schema_ + ".orders VALUES ('o-late', true)");
    tx.commit();
  }
  const Answer retry = invoke("fc-req-4", event);
  EXPECT_EQ(retry.status, 200) << retry.body;
  EXPECT_EQ(grants("o-late"), 1);
}

TEST_F(FcRuntimeTest, SameIdWithAnotherEventIsAMismatchAndInvalidEventsFail) {
  ASSERT_EQ(invoke("fc-req-5", R"({"user":"u5","order_id":"o-5","points":1})").status, 200);
  const Answer other = invoke("fc-req-5", R"({"user":"u5","order_id":"o-5","points":2})");
  EXPECT_EQ(other.status, 404);
  EXPECT_NE(other.body.find("IdempotencyMismatch"), std::string::npos) << other.body;
  const Answer invalid = invoke("fc-req-6", "not json");
  EXPECT_EQ(invalid.status, 404);
  EXPECT_NE(invalid.body.find("InvalidEvent"), std::string::npos) << invalid.body;
  EXPECT_EQ(grants("o-5"), 1);
}

// Events the fingerprint refuses (a duplicate member, a payload over 1 MiB) were UnhandledError,
// and fractional points were granted truncated (10.7 as 10): each is InvalidEvent.
TEST_F(FcRuntimeTest, ADuplicateMemberAnOversizePayloadOrFractionalPointsAreInvalidEvents) {
  const std::string oversize =
      R"({"user":"u8","order_id":"o-8","points":1,"pad":")" + std::string(1100000, 'x') + "\"}";
  for (const std::string& event :
       {std::string(R"({"user":"u8","order_id":"o-8","points":1,"points":2})"), oversize,
        std::string(R"({"user":"u8","order_id":"o-8","points":10.7})")}) {
    const Answer answer = invoke("fc-req-8", event);
    EXPECT_EQ(answer.status, 404);
    EXPECT_NE(answer.body.find(R"("errorType":"InvalidEvent")"), std::string::npos)
        << answer.body.substr(0, 300);
  }
  EXPECT_EQ(grants("o-8"), 0);
}

// PostgreSQL unreachable when the function initializes: Unavailable (the outcome table's answer
// to a backend failure), not UnhandledError with libpq's text.
TEST(FcRuntimeInitialize, PostgresUnreachableAtInitializeIsUnavailable) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  ChildProcess runtime({IDEM_FC_RUNTIME_BIN, "--host", "127.0.0.1", "--port", "0", "--redis-url",
                        redis_url, "--pg-url", "postgresql://postgres@127.0.0.1:1/idem"});
  const auto line = runtime.wait_for_line("listening on http://127.0.0.1:", seconds(20));
  ASSERT_TRUE(line) << runtime.tail();
  httplib::Client client("127.0.0.1", std::stoi(line->substr(line->rfind(':') + 1)));
  client.set_read_timeout(seconds(10));
  const auto result = client.Post("/initialize", {{"x-fc-request-id", "init-down"}}, "",
                                  "application/octet-stream");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  EXPECT_NE(result->body.find(R"("errorType":"Unavailable")"), std::string::npos) << result->body;
  EXPECT_EQ(result->body.find("127.0.0.1"), std::string::npos) << result->body;
  runtime.signal(SIGTERM);
  EXPECT_EQ(runtime.wait_exit(seconds(10)), 0) << runtime.tail();
}

// An event whose user is too long for a key component is the event's fault, and the answer says
// so (errorType InvalidKey, not UnhandledError).
TEST_F(FcRuntimeTest, AnOversizeUserIsAnInvalidKeyError) {
  const std::string user(600, 'u');
  const Answer oversize =
      invoke("fc-req-7", R"({"user":")" + user + R"(","order_id":"o-7","points":1})");
  EXPECT_EQ(oversize.status, 404);
  EXPECT_EQ(oversize.fc_status, "404");
  EXPECT_NE(oversize.body.find(R"("errorType":"InvalidKey")"), std::string::npos) << oversize.body;
  EXPECT_EQ(grants("o-7"), 0);
}

// An HTTP trigger's event: the invocation's JSON as the body string (base64 when `base64`), and
// members that change per delivery (requestContext.time, a header).
std::string http_trigger_event(const std::string& body, bool base64, const std::string& time) {
  return R"({"version":"v1","rawPath":"/grant","headers":{"X-Trace":")" + time +
         R"("},"queryParameters":{},"body":")" + body + R"(","isBase64Encoded":)" +
         (base64 ? "true" : "false") +
         R"(,"requestContext":{"accountId":"1234567890","requestId":"1-6568","time":")" + time +
         R"(","http":{"method":"POST","path":"/grant"}}})";
}

TEST_F(FcRuntimeTest, AnHttpTriggerEventsBodyIsTheEventAndItsRedeliveryReplays) {
  // {"user":"u8","order_id":"o-8","points":3}, as a JSON string and base64-encoded.
  const std::string plain = R"({\"user\":\"u8\",\"order_id\":\"o-8\",\"points\":3})";
  const std::string base64 = "eyJ1c2VyIjoidTgiLCJvcmRlcl9pZCI6Im8tOCIsInBvaW50cyI6M30=";
  const Answer first = invoke("fc-req-8", http_trigger_event(plain, false, "06:41:11"));
  ASSERT_EQ(first.status, 200) << first.body;
  const Answer again = invoke("fc-req-8", http_trigger_event(base64, true, "06:41:19"));
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(grants("o-8"), 1);
  const Answer bad = invoke("fc-req-9", http_trigger_event("***", true, "06:41:20"));
  EXPECT_EQ(bad.status, 404);
  EXPECT_NE(bad.body.find("InvalidEvent"), std::string::npos) << bad.body;
}

}  // namespace
}  // namespace idem::test
