// examples/http_webhook end to end: the server runs as a child process against the shared
// Redis and PostgreSQL, in its own schema and Redis namespace, and is driven with an HTTP client.
// Built twice: against idem-http-webhook (blocking, cpp-httplib) and, with IDEM_WEBHOOK_ASYNC,
// against idem-async-webhook (RESTinio + AsyncDeduplicator), which must answer alike.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "examples_child.h"
#include "redis_server.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

#ifdef IDEM_WEBHOOK_ASYNC
// ctest names the tests by suite: keep them apart.
#define HttpWebhookTest AsyncHttpWebhookTest
#define HttpWebhookSlowHandlerTest AsyncHttpWebhookSlowHandlerTest
#define HttpWebhookPgConnections AsyncHttpWebhookPgConnections
#define HttpWebhookReplayMarker AsyncHttpWebhookReplayMarker
#define HttpWebhookStop AsyncHttpWebhookStop
#define HttpWebhookDrain AsyncHttpWebhookDrain
#endif

// The slow handler's refunds hold their claim this long (a slow gateway), so that repeats arrive
// while the first runs.
constexpr int kSlowHandlerDelayMs = 3000;

struct Reply {
  int status = 0;
  bool replayed = false;    // Idempotent-Replayed: true
  std::string retry_after;  // the Retry-After header, "" when absent
  std::string body;
};

// POSTs `body` to /refunds on 127.0.0.1:`port`, waiting up to `timeout` for the answer.
Reply post_refund(int port, const std::string& body, const httplib::Headers& headers,
                  seconds timeout = seconds(10)) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(timeout);
  const auto result = client.Post("/refunds", headers, body, "application/json");
  if (!result) return {};
  return {result->status, result->get_header_value("Idempotent-Replayed") == "true",
          result->get_header_value("Retry-After"), result->body};
}

// The body of a refund of `amount` cents for `order` from `account`.
std::string refund_body(const std::string& order, int account, std::int64_t amount) {
  return R"({"order_id":")" + order + R"(","account":)" + std::to_string(account) +
         R"(,"amount_cents":)" + std::to_string(amount) + "}";
}

// The Idempotency-Key header holding `key` (an RFC 9651 string: quoted).
httplib::Headers key_header(const std::string& key) {
  return {{"Idempotency-Key", "\"" + key + "\""}};
}

// Whether the claim of `order` (the business key) is in `server`'s Redis.
bool claimed(const ExampleServer& server, const std::string& order) {
  const std::vector<std::string> keys = server.keys();
  return std::any_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return key.ends_with(":refund:" + order); });
}

// The refunds booked for `order` in `server`'s schema.
std::int64_t refunds(const ExampleServer& server, const std::string& order) {
  pqxx::connection conn(server.pg_url);
  pqxx::work tx(conn);
  return tx
      .exec1("SELECT count(*) FROM " + server.schema +
             ".refund_records WHERE order_id = " + tx.quote(order))[0]
      .as<std::int64_t>();
}

// One server per suite, whose refunds each take kDelayMs.
template <int kDelayMs>
class WebhookServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_.start({IDEM_HTTP_WEBHOOK_BIN, "--handler-delay-ms", std::to_string(kDelayMs)},
                  "webhook");
  }

  static void TearDownTestSuite() { server_.stop(); }

  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    ASSERT_GT(server_.port, 0) << "the server did not start:\n" << server_.process->tail();
  }

  // Whether the claim of `order` (the business key) is in Redis.
  static bool claimed(const std::string& order) { return test::claimed(server_, order); }

  static Reply post(const std::string& body, const httplib::Headers& headers) {
    return post_refund(server_.port, body, headers);
  }

  static Reply refund(const std::string& key, const std::string& order, int account,
                      std::int64_t amount) {
    return post(refund_body(order, account, amount), key_header(key));
  }

  static std::int64_t sql_count(const std::string& sql) {
    pqxx::connection conn(server_.pg_url);
    pqxx::work tx(conn);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }

  static std::int64_t refunds(const std::string& order) { return test::refunds(server_, order); }

  static inline ExampleServer server_;
};

class HttpWebhookTest : public WebhookServerTest<0> {};
class HttpWebhookSlowHandlerTest : public WebhookServerTest<kSlowHandlerDelayMs> {};

TEST_F(HttpWebhookSlowHandlerTest, ConcurrentIdenticalRequestsBookOneRefund) {
  constexpr int kClients = 12;
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] { replies[i] = refund("key-concurrent", "o-1", 1, 500); });
  }
  for (auto& c : clients) c.join();

  int executed = 0, replayed = 0, conflicts = 0;
  std::string first_body;
  for (const Reply& r : replies) {
    if (r.status == 200 && !r.replayed) {
      ++executed;
      first_body = r.body;
    } else if (r.status == 200) {
      ++replayed;
    } else if (r.status == 409) {
      ++conflicts;
      EXPECT_EQ(r.retry_after, "1");
    }
  }
  EXPECT_EQ(executed, 1);
  EXPECT_EQ(executed + replayed + conflicts, kClients) << server_.process->tail();
  EXPECT_EQ(refunds("o-1"), 1);
  EXPECT_EQ(sql_count("SELECT balance_cents FROM " + server_.schema + ".accounts WHERE id = 1"),
            500);

  const Reply again = refund("key-concurrent", "o-1", 1, 500);
  EXPECT_EQ(again.status, 200);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first_body);
  EXPECT_EQ(refunds("o-1"), 1);
}

#ifdef IDEM_WEBHOOK_ASYNC
// The async server on its one thread: 24 orders, each sent three times at once (a client's
// retries), every refund waiting kSlowHandlerDelayMs in its transaction. One at a time that would
// be 72 s, far past the client's 10 s read timeout; on the loop (and 32 PostgreSQL connections)
// each order books once, every other request gets 409 or the replay, and no request fails.
TEST_F(HttpWebhookSlowHandlerTest, ManyOrdersInFlightOnOneThreadEachBooksOnce) {
  constexpr int kOrders = 24;
  constexpr int kCopies = 3;
  std::vector<Reply> replies(kOrders * kCopies);
  std::vector<std::thread> clients;
  for (int i = 0; i < kOrders * kCopies; ++i) {
    clients.emplace_back([&, i] {
      const int order = i / kCopies;
      replies[i] = refund("many-" + std::to_string(order), "om-" + std::to_string(order),
                          10 + order % 50, 100 + order);
    });
  }
  for (auto& c : clients) c.join();
  int executed = 0;
  for (const Reply& r : replies) {
    EXPECT_TRUE(r.status == 200 || r.status == 409) << r.status << " " << r.body;
    if (r.status == 200 && !r.replayed) ++executed;
  }
  EXPECT_EQ(executed, kOrders);
  EXPECT_EQ(sql_count("SELECT count(*) FROM " + server_.schema +
                      ".refund_records WHERE order_id LIKE 'om-%'"),
            kOrders);
  EXPECT_EQ(sql_count("SELECT count(DISTINCT order_id) FROM " + server_.schema +
                      ".refund_records WHERE order_id LIKE 'om-%'"),
            kOrders);
}
#endif

TEST_F(HttpWebhookTest, MissingOrInvalidKeyIs400) {
  const std::string body = R"({"order_id":"o-2","account":2,"amount_cents":100})";
  EXPECT_EQ(post(body, {}).status, 400);
  EXPECT_EQ(post(body, {{"Idempotency-Key", "unquoted-token"}}).status, 400);  // not an sf-string
  EXPECT_EQ(post(body, {{"Idempotency-Key", "\"has space\""}}).status, 400);   // not a valid ID
  EXPECT_EQ(post(body, {{"X-Request-ID", "trace-1"}}).status, 400);            // tracing, not a key
  EXPECT_EQ(refund("key-bad-body", "", 2, 100).status, 400);                   // empty order_id
  EXPECT_EQ(refunds("o-2"), 0);
  EXPECT_EQ(post(body, {{"X-Idempotency-Key", "key-x"}}).status, 200);
  EXPECT_EQ(refunds("o-2"), 1);
}

// An amount that would overflow the balance column is a 400: not a 503 + Retry-After (a retry
// can never succeed), and no PostgreSQL error text in the body.
TEST_F(HttpWebhookTest, AnAmountBeyondTheLimitIs400AndNoDatabaseTextReachesTheClient) {
  const Reply huge = refund("key-huge", "o-9", 1, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(huge.status, 400) << huge.body;
  EXPECT_EQ(huge.body.find("postgres"), std::string::npos) << huge.body;
  EXPECT_EQ(refunds("o-9"), 0);
}

TEST_F(HttpWebhookTest, ReusedKeyWithAnotherPayloadIs422) {
  ASSERT_EQ(refund("key-reuse", "o-3", 3, 100).status, 200);
  EXPECT_EQ(refund("key-reuse", "o-3", 3, 999).status, 422);
  EXPECT_EQ(refunds("o-3"), 1);
  EXPECT_EQ(sql_count("SELECT balance_cents FROM " + server_.schema + ".accounts WHERE id = 3"),
            100);
}

TEST_F(HttpWebhookSlowHandlerTest, RepeatWhileTheFirstRunsIs409) {
  Reply first;
  std::thread a([&] { first = refund("key-inflight", "o-4", 4, 100); });
  // Once the claim is visible in Redis the first request holds it for kSlowHandlerDelayMs.
  const auto deadline = std::chrono::steady_clock::now() + seconds(5);
  while (!claimed("o-4")) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the first request never claimed its key";
    std::this_thread::sleep_for(milliseconds(10));
  }
  const Reply second = refund("key-inflight", "o-4", 4, 100);
  a.join();
  EXPECT_EQ(second.status, 409);
  EXPECT_EQ(second.retry_after, "1");  // the client is told when to try again
  EXPECT_EQ(first.status, 200);
  EXPECT_TRUE(first.retry_after.empty());
  EXPECT_EQ(refunds("o-4"), 1);
}

// A double-click that sent a fresh Idempotency-Key is the same order's refund (the order is the
// business key): replayed, not booked again.
TEST_F(HttpWebhookTest, DoubleClickWithAFreshKeyReplaysTheOrdersFirstRefund) {
  const Reply first = refund("dc-1", "o-7", 7, 100);
  ASSERT_EQ(first.status, 200);
  for (const char* key : {"dc-2", "dc-3"}) {
    const Reply again = refund(key, "o-7", 7, 100);
    EXPECT_EQ(again.status, 200);
    EXPECT_TRUE(again.replayed);
    EXPECT_EQ(again.body, first.body);
  }
  EXPECT_EQ(refund("dc-4", "o-7", 7, 250).status, 422);  // another amount for the same order
  EXPECT_EQ(refunds("o-7"), 1);
  EXPECT_EQ(sql_count("SELECT balance_cents FROM " + server_.schema + ".accounts WHERE id = 7"),
            100);
}

// idem's key is the order's, so a key sent again for another order made another key: the
// second order was booked, under the first order's Idempotency-Key. The ledger's unique
// (client, key) answers it 422, as the draft asks, and books nothing of it, however often sent.
TEST_F(HttpWebhookTest, AKeySentAgainForAnotherOrderIs422AndBooksNothing) {
  ASSERT_EQ(refund("reuse-order", "o-10", 10, 100).status, 200);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Reply again = refund("reuse-order", "o-11", 10, 100);
    EXPECT_EQ(again.status, 422) << again.body;
  }
  EXPECT_EQ(refunds("o-11"), 0);
  EXPECT_EQ(sql_count("SELECT balance_cents FROM " + server_.schema + ".accounts WHERE id = 10"),
            100);
  // Keys are scoped per client: another client's same key books its own order.
  const Reply other = post(refund_body("o-12", 10, 100),
                           {{"Idempotency-Key", "\"reuse-order\""}, {"X-Client-Id", "client-b"}});
  EXPECT_EQ(other.status, 200) << other.body;
}

// nlohmann's get<std::int64_t>() casts a fraction: 500.9 cents were booked as 500, account 7.9 as
// account 7.
TEST_F(HttpWebhookTest, AFractionalAmountOrAccountIs400NotTruncated) {
  for (const char* body : {R"({"order_id":"o-13","account":13,"amount_cents":500.9})",
                           R"({"order_id":"o-13","account":13.9,"amount_cents":500})",
                           R"({"order_id":"o-13","account":13,"amount_cents":5e2})"}) {
    const Reply reply = post(body, key_header("fraction"));
    EXPECT_EQ(reply.status, 400) << body << ": " << reply.body;
  }
  EXPECT_EQ(refunds("o-13"), 0);
}

TEST_F(HttpWebhookTest, OversizeClientIdIs400NotUnavailable) {
  const std::string body = R"({"order_id":"o-8","account":8,"amount_cents":100})";
  const Reply reply =
      post(body, {{"Idempotency-Key", "\"big-client\""}, {"X-Client-Id", std::string(3000, 'c')}});
  EXPECT_EQ(reply.status, 400) << reply.body;
  EXPECT_EQ(refunds("o-8"), 0);
}

// The 400's message quotes the body, and a byte that is no UTF-8 made the JSON writer throw: the
// client got an empty reply, not the 400.
TEST_F(HttpWebhookTest, ABodyThatIsNotUtf8Is400NotADroppedConnection) {
  const std::string body =
      "{\"order_id\":\"o-9\",\"account\":9,\"amount_cents\":100,\"x\":\"\xff\"}";
  const Reply reply = post(body, {{"Idempotency-Key", "\"utf8-key\""}});
  EXPECT_EQ(reply.status, 400) << reply.body;
  EXPECT_TRUE(nlohmann::json::accept(reply.body)) << reply.body;
  EXPECT_EQ(refunds("o-9"), 0);
}

// With a wrong Redis password the service refuses to start: since the facade fails open, it
// would otherwise run on the Postgres sink alone, saying nothing.
TEST_F(HttpWebhookTest, AWrongRedisPasswordStopsTheServiceAtStartUp) {
  const std::string host_port = server_.redis_url.substr(server_.redis_url.find("//") + 2);
  ChildProcess wrong({IDEM_HTTP_WEBHOOK_BIN, "--port", "0", "--redis-url",
                      "redis://:not-the-password@" + host_port, "--pg-url", server_.pg_url,
                      "--schema", server_.schema, "--ns", server_.schema});
  EXPECT_EQ(wrong.wait_exit(seconds(20)), 1) << wrong.tail();
  EXPECT_NE(wrong.tail().find("AUTH"), std::string::npos) << wrong.tail();
  EXPECT_EQ(wrong.tail().find("not-the-password"), std::string::npos) << wrong.tail();
  for (const auto& line : wrong.lines())
    EXPECT_EQ(line.find("listening on"), std::string::npos) << line;
}

TEST_F(HttpWebhookTest, UnknownAccountIs404AndReleasesTheKey) {
  EXPECT_EQ(refund("key-no-account", "o-5", 999, 100).status, 404);
  EXPECT_EQ(refund("key-no-account", "o-5", 999, 100).status, 404);  // ran again: not 409
  EXPECT_EQ(refunds("o-5"), 0);
}

TEST_F(HttpWebhookTest, MetricsServePrometheusText) {
  ASSERT_EQ(refund("key-metrics", "o-6", 6, 100).status, 200);
  httplib::Client client("127.0.0.1", server_.port);
  const auto result = client.Get("/metrics");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_NE(result->body.find("idem_decisions_total{layer=\"handler\",outcome=\"executed\"}"),
            std::string::npos)
      << result->body;
  EXPECT_NE(result->body.find("idem_decision_duration_seconds_count{layer=\"handler\"} "),
            std::string::npos);
#ifndef IDEM_WEBHOOK_ASYNC  // the async front's backends are not objects one can watch
  EXPECT_NE(result->body.find("idem_redis_breaker_state{state=\"closed\"} 1\n"), std::string::npos);
  EXPECT_NE(result->body.find("idem_pool_connections_open{layer=\"pg_sink\"} "), std::string::npos);
  EXPECT_NE(result->body.find("idem_pool_waiters{layer=\"redis_guard\"} 0\n"), std::string::npos);
#endif
}

// --pg-connections bounds idem's PostgreSQL connections: a server of its own with 2, four refunds
// at once each holding its transaction for a second. Its connections carry an application_name
// of their own, so pg_stat_activity shows how many it has open; the four refunds still all book.
TEST(HttpWebhookPgConnections, AtMostThatManyConnectionsAreOpenAndTheRestWait) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  // Short: application_name keeps 63 bytes, and the schema's name holds the test's.
  const std::string app = "idem_pool_" + std::to_string(::getpid());
  const std::string tagged_url =
      pg_url + (pg_url.find('?') == std::string::npos ? "?" : "&") + "application_name=" + app;
  ExampleServer server;
  server.start({IDEM_HTTP_WEBHOOK_BIN, "--pg-connections", "2", "--handler-delay-ms", "1000"},
               "webhook_pool", tagged_url);
  const int port = server.port;
  ASSERT_GT(port, 0) << server.process->tail();

  pqxx::connection watcher(pg_url);
  const auto open_now = [&] {
    pqxx::nontransaction tx(watcher);
    return tx
        .exec_params1("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app)[0]
        .as<int>();
  };
  // The start-up's other connections (the tables') are gone, their backends too; the blocking
  // sink keeps the one its migration used.
  ASSERT_TRUE(wait_until(seconds(5), [&] { return open_now() <= 1; })) << open_now();
  std::atomic<bool> done = false;
  std::vector<int> statuses(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(seconds(10));
      const std::string order = "op-" + std::to_string(i);
      const auto result =
          client.Post("/refunds", {{"Idempotency-Key", "\"pool-" + std::to_string(i) + "\""}},
                      R"({"order_id":")" + order + R"(","account":)" + std::to_string(20 + i) +
                          R"(,"amount_cents":100})",
                      "application/json");
      statuses[i] = result ? result->status : 0;
    });
  }
  std::thread finisher([&] {
    for (auto& c : clients) c.join();
    done = true;
  });
  int most = 0;
  while (!done) {
    most = std::max(most, open_now());
    std::this_thread::sleep_for(milliseconds(50));
  }
  finisher.join();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(statuses[i], 200) << "refund " << i << "\n" << server.process->tail();
  EXPECT_EQ(most, 2) << "idem's connections open at most, with --pg-connections 2";
  server.stop();
}

// With --replay-marker-in-body a replay says so in its body too, for clients that never see
// headers: the first response byte for byte, with "idempotent_replayed":true as its first member.
// (Without the flag, the tests above find the first response unchanged.)
TEST(HttpWebhookReplayMarker, WithTheFlagAReplayedBodyCarriesTheMarker) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  ExampleServer server;
  server.start({IDEM_HTTP_WEBHOOK_BIN, "--replay-marker-in-body"}, "webhook_marker");
  const int port = server.port;
  ASSERT_GT(port, 0) << server.process->tail();

  const std::string body = refund_body("om-1", 30, 100);
  const Reply first = post_refund(port, body, key_header("marker-1"));
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_FALSE(first.replayed);
  ASSERT_TRUE(first.body.starts_with("{\"amount_cents\":100,")) << first.body;
  const std::string marked = R"({"idempotent_replayed":true,)" + first.body.substr(1);
  // A retry with the key, and a double-click with a fresh key (the same order).
  for (const char* key : {"marker-1", "marker-2"}) {
    const Reply again = post_refund(port, body, key_header(key));
    EXPECT_EQ(again.status, 200);
    EXPECT_TRUE(again.replayed);
    EXPECT_EQ(again.body, marked);
  }
  EXPECT_EQ(post_refund(port, refund_body("om-1", 30, 999), key_header("marker-1")).status, 422);
  server.stop();
}

// SIGTERM while a refund runs (a platform stopping the instance): the server takes no new
// request, answers the one in flight and books it, then exits 0. The async server stopped its
// loop at once: the refund went unanswered and its claim stayed until its lease ended, so the
// client's retry met 409 meanwhile. A request sent then on a connection kept alive runs nothing:
// the async server answers it 503 and closes the connection (it ran it, and the drain ended by
// cancelling it, its claim kept), the blocking one closes the connection.
TEST(HttpWebhookStop, ARefundInFlightAtSigtermIsAnsweredAndBooked) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  ExampleServer server;
  server.start({IDEM_HTTP_WEBHOOK_BIN, "--handler-delay-ms", "1500"}, "webhook_stop");
  const int port = server.port;
  ASSERT_GT(port, 0) << server.process->tail();
  httplib::Client kept_alive("127.0.0.1", port);
  kept_alive.set_keep_alive(true);
  kept_alive.set_read_timeout(seconds(10));
  // Each refund from an account of its own: none waits on another's row lock.
  const auto post_kept_alive = [&](const std::string& order, const std::string& key, int account) {
    const auto result = kept_alive.Post("/refunds", key_header(key),
                                        refund_body(order, account, 100), "application/json");
    return result ? result->status : 0;
  };
  ASSERT_EQ(post_kept_alive("os-0", "stop-0", 40), 200) << server.process->tail();
  Reply reply;
  std::thread client(
      [&] { reply = post_refund(port, refund_body("os-1", 41, 100), key_header("stop-1")); });
  const bool in_flight = wait_until(seconds(5), [&] { return claimed(server, "os-1"); });
  server.process->signal(SIGTERM);
  ASSERT_TRUE(server.process->wait_for_line("stopping on signal", seconds(5)))
      << server.process->tail();
  const int refused = post_kept_alive("os-2", "stop-2", 42);
  client.join();
  ASSERT_TRUE(in_flight) << server.process->tail();
  EXPECT_EQ(reply.status, 200) << reply.body << "\n" << server.process->tail();
#ifdef IDEM_WEBHOOK_ASYNC
  EXPECT_EQ(refused, 503);
#else
  EXPECT_TRUE(refused == 503 || refused == 0) << refused;
#endif
  EXPECT_FALSE(claimed(server, "os-2"));
  EXPECT_EQ(server.process->wait_exit(seconds(10)), 0) << server.process->tail();
  EXPECT_EQ(refunds(server, "os-1"), 1);
  EXPECT_EQ(refunds(server, "os-2"), 0);
  server.stop();  // drops its schema and keys
}

// Whether a refund of `server` waits on its payment gateway: its transaction wrote the refund row
// and is idle in it. (A call stopped before its handler started releases its claim instead.)
bool refund_at_the_gateway(const ExampleServer& server) {
  pqxx::connection conn(server.pg_url);
  pqxx::nontransaction tx(conn);
  return tx.exec_params1(
               "SELECT count(*) FROM pg_stat_activity WHERE state = "
               "'idle in transaction' AND query LIKE '%' || $1 || '%refund_records%'",
               server.schema)[0]
             .as<int>() > 0;
}

// Starts a refund whose payment gateway hangs (60 s), and SIGTERM once it waits there. Returns the
// refund's answer, and the time from the signal to it; `more` runs after the signal.
template <class More>
std::pair<Reply, std::chrono::steady_clock::duration> refund_stopped_while_running(
    ExampleServer& server, const std::string& order, More more) {
  Reply reply;
  std::thread client([&] {
    reply = post_refund(server.port, refund_body(order, 43, 100), key_header(order), seconds(40));
  });
  const bool in_flight = wait_until(seconds(5), [&] { return refund_at_the_gateway(server); });
  const auto signalled = std::chrono::steady_clock::now();
  server.process->signal(SIGTERM);
  more();
  client.join();
  EXPECT_TRUE(in_flight) << server.process->tail();
  return {reply, std::chrono::steady_clock::now() - signalled};
}

// What a refund cancelled by a stop leaves: an answer 503, nothing booked, its claim kept until
// its lease ends (so a retry meanwhile gets 409), an exit 0.
void expect_cancelled_with_its_claim_kept(ExampleServer& server, const std::string& order,
                                          const Reply& reply) {
  EXPECT_EQ(reply.status, 503) << reply.body << "\n" << server.process->tail();
  EXPECT_EQ(server.process->wait_exit(seconds(10)), 0) << server.process->tail();
  EXPECT_TRUE(claimed(server, order));
  EXPECT_EQ(refunds(server, order), 0);
}

// SIGTERM while the server starts and its PostgreSQL hangs (a port that accepts connections and
// never answers): the server ends at once, as the signal's default action does; nothing ran yet.
// The blocking server held the signal until it would listen, so it ran on until a SIGKILL.
TEST(HttpWebhookStop, ASigtermWhileTheServerStartsEndsIt) {
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(::listen(silent, 4), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string pg_url =
      "postgresql://postgres@127.0.0.1:" + std::to_string(ntohs(address.sin_port)) +
      "/idem?connect_timeout=0";
  // Redis is never reached: the tables come first.
  ChildProcess server({IDEM_HTTP_WEBHOOK_BIN, "--port", "0", "--redis-url", "redis://127.0.0.1:1",
                       "--pg-url", pg_url, "--schema", "webhook_starting", "--ns",
                       "webhook_starting"});
  // Its connection waits, unanswered, in the port's backlog: the server hangs on it.
  pollfd connecting{silent, POLLIN, 0};
  ASSERT_EQ(::poll(&connecting, 1, 10000), 1) << server.tail();
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait_exit(seconds(5)), 128 + SIGTERM) << server.tail();
  ::close(silent);
}

// A server whose payment gateway hangs (60 s), for the stops that cancel refunds still running.
class HttpWebhookDrain : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    server_.start({IDEM_HTTP_WEBHOOK_BIN, "--handler-delay-ms", "60000"}, "webhook_drain");
    ASSERT_GT(server_.port, 0) << server_.process->tail();
  }

  void TearDown() override { server_.stop(); }  // drops its schema and keys

  ExampleServer server_;
};

// SIGTERM while a refund runs past the drain (a payment gateway that hangs): the server waits
// for it 10 s, then cancels it, and exits 0. The blocking server waited for the refund as long as
// it ran: only a SIGKILL ended it.
TEST_F(HttpWebhookDrain, ARefundStillRunningWhenTheDrainEndsIsCancelledAndKeepsItsClaim) {
  const auto [reply, took] = refund_stopped_while_running(server_, "od-1", [] {});
  EXPECT_GE(took, milliseconds(9500)) << "the drain did not wait";
  EXPECT_LT(took, seconds(30));
  expect_cancelled_with_its_claim_kept(server_, "od-1", reply);
}

// A second signal (an operator's second Ctrl-C) cancels the refunds still running at once.
TEST_F(HttpWebhookDrain, ASecondSignalCancelsTheRefundsStillRunningAtOnce) {
  const auto [reply, took] = refund_stopped_while_running(server_, "oa-1", [&] {
    EXPECT_TRUE(server_.process->wait_for_line("stopping on signal", seconds(5)));
    server_.process->signal(SIGINT);
  });
  EXPECT_LT(took, seconds(8)) << "the second signal did not cut the drain short";
  EXPECT_TRUE(
      server_.process->wait_for_line("cancelling what still runs: a second signal", seconds(5)))
      << server_.process->tail();
  expect_cancelled_with_its_claim_kept(server_, "oa-1", reply);
}

}  // namespace
}  // namespace idem::test
