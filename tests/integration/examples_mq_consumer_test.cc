// examples/mq_consumer end to end: three consumer processes share a Redis Streams consumer group,
// one is SIGKILLed mid-run, and every payment still has exactly one ledger effect; blocking
// consumers, then async ones (`--async`, many entries in flight on one thread each).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "examples_child.h"
#include "redis_server.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem::test {
namespace {

using std::chrono::seconds;

// 10 000 payments plus 20 % duplicate XADDs (a producer's retries) = 12 000 stream entries; 3 000
// payments under the sanitizers, whose 3-10x slowdown would not fit the test's time bounds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kPayments = 3000;
#else
constexpr int kPayments = 10000;
#endif

class MqConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    redis_url_ = redis_url;
    pg_url_ = pg_url;
    // Postgres folds unquoted names to lower case and keeps 63 bytes; the example quotes them.
    name_ = unique_name("mq").substr(0, 40);
    for (char& c : name_) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }

  void TearDown() override {
    if (pg_url_.empty()) return;
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("DROP SCHEMA IF EXISTS " + name_ + " CASCADE");
    tx.commit();
    redis_cli(redis_url_, {"DEL", name_});  // the stream
    redis_cli(
        redis_url_,
        {"EVAL",
         "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0",
         "0", "idem:" + name_ + ":*"});
  }

  std::vector<std::string> args(const std::string& mode) const {
    return {IDEM_MQ_CONSUMER_BIN,
            mode,
            "--redis-url",
            redis_url_,
            "--pg-url",
            pg_url_,
            "--stream",
            name_,
            "--group",
            "ledger",
            "--schema",
            name_,
            "--ns",
            name_};
  }

  // `extra`: more flags, e.g. --async, or a --lease-ms of its own (2000 otherwise).
  std::unique_ptr<ChildProcess> consumer(const std::string& name,
                                         const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> argv = args("consume");
    argv.insert(argv.end(), {"--consumer", name, "--claim-idle-ms", "1000", "--block-ms", "200",
                             "--exit-when-idle-ms", "2000", "--max-seconds", "50"});
    if (std::find(extra.begin(), extra.end(), "--lease-ms") == extra.end()) {
      argv.insert(argv.end(), {"--lease-ms", "2000"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<ChildProcess>(argv);
  }

  std::int64_t sql(const std::string& query) const {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    return tx.exec1(query)[0].as<std::int64_t>();
  }

  // Ledger rows so far; 0 while the consumers have not created the table yet.
  std::int64_t ledger_rows() const {
    try {
      return sql("SELECT count(*) FROM " + name_ + ".ledger");
    } catch (const pqxx::sql_error&) {
      return 0;
    }
  }

  // Three consumers (flags `extra`) share the group; one is SIGKILLed once a quarter of the
  // payments are booked. Then every payment has exactly one effect, none is lost, nothing is
  // left pending, and the survivors took over the killed one's entries. Returns the seconds from
  // the consumers' start to the last one's exit.
  double run_three_consumers_one_killed(const std::vector<std::string>& extra) {
    std::vector<std::string> produce = args("produce");
    produce.insert(produce.end(), {"--count", std::to_string(kPayments), "--duplicates", "0.2"});
    ChildProcess producer(produce);
    EXPECT_EQ(producer.wait_exit(seconds(30)), 0) << producer.tail();
    EXPECT_EQ(redis_cli(redis_url_, {"XLEN", name_}), std::to_string(kPayments * 12 / 10));

    const auto start = std::chrono::steady_clock::now();
    auto c1 = consumer("c1", extra);
    auto c2 = consumer("c2", extra);
    auto c3 = consumer("c3", extra);
    // SIGKILL c2 once a quarter of the payments are booked: it dies holding delivered, unacked
    // entries (and possibly claims and open transactions).
    const auto deadline = start + seconds(40);
    while (ledger_rows() < kPayments / 4) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ADD_FAILURE() << "no progress\n" << c1->tail() << c2->tail();
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    c2->signal(SIGKILL);
    EXPECT_EQ(c2->wait_exit(seconds(5)), 128 + SIGKILL);
    // What c2 died holding (delivered, unacked): none when it died between batches.
    const long long held_by_c2 = pending_of("c2");

    EXPECT_EQ(c1->wait_exit(seconds(50)), 0) << c1->tail();
    EXPECT_EQ(c3->wait_exit(seconds(50)), 0) << c3->tail();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;

    // Exactly one effect per payment, none lost, nothing left pending.
    EXPECT_EQ(sql("SELECT count(*) FROM " + name_ + ".ledger"), kPayments);
    EXPECT_EQ(sql("SELECT count(DISTINCT request_id) FROM " + name_ + ".ledger"), kPayments);
    EXPECT_EQ(sql("SELECT sum(amount_cents) FROM " + name_ + ".totals"),
              sql("SELECT sum(amount_cents) FROM " + name_ + ".ledger"));
    const std::string pending = redis_cli(redis_url_, {"XPENDING", name_, "ledger"});
    EXPECT_EQ(pending.substr(0, pending.find('\n')), "0") << pending;

    // The survivors took over c2's entries with XAUTOCLAIM.
    long long reclaimed = 0;
    for (ChildProcess* c : {c1.get(), c3.get()}) {
      const auto done = c->wait_for_line("done consumer=", seconds(1));
      EXPECT_TRUE(done);
      if (!done) continue;
      reclaimed += summary_field(*done, "reclaimed");
      std::cout << *done << "\n";
    }
    if (held_by_c2 > 0) {
      EXPECT_GT(reclaimed, 0);
    }
    return took.count();
  }

  // Five good payments and four entries no retry can book: an amount that is no number (the
  // booking's INSERT fails with 22P02), a request ID with spaces, a user with a leading space, a
  // request ID with a newline and a forged summary line after it (not echoed: it forged the line
  // this test reads). One consumer (flags `extra`) books the five and dead-letters the four: all
  // nine acked.
  void bad_entries_are_dead_lettered(const std::vector<std::string>& extra) {
    std::vector<std::string> produce = args("produce");
    produce.insert(produce.end(), {"--count", "5", "--duplicates", "0"});
    ChildProcess producer(produce);
    ASSERT_EQ(producer.wait_exit(seconds(30)), 0) << producer.tail();
    const std::vector<std::vector<std::string>> bad = {
        {"bad-amount", "u1", R"({"order_id":"o-x","amount_cents":"abc"})"},
        {"bad id with spaces", "u1", R"({"order_id":"o-y","amount_cents":5})"},
        {"bad-user", " u1", R"({"order_id":"o-z","amount_cents":5})"},
        {"x\ndone consumer=c9 acked=999 dead_lettered=999", "u1",
         R"({"order_id":"o-w","amount_cents":5})"}};
    for (const auto& entry : bad) {
      redis_cli(redis_url_, {"XADD", name_, "*", "request_id", entry[0], "user", entry[1],
                             "payload", entry[2]});
    }
    auto c1 = consumer("c1", extra);
    EXPECT_EQ(c1->wait_exit(seconds(45)), 0) << c1->tail();
    EXPECT_EQ(sql("SELECT count(*) FROM " + name_ + ".ledger"), 5);
    const std::string pending = redis_cli(redis_url_, {"XPENDING", name_, "ledger"});
    EXPECT_EQ(pending.substr(0, pending.find('\n')), "0") << pending;
    const auto done = c1->wait_for_line("done consumer=", seconds(1));
    ASSERT_TRUE(done);
    EXPECT_EQ(done->rfind("done consumer=c1 ", 0), 0U) << *done;
    EXPECT_EQ(summary_field(*done, "dead_lettered"), 4) << *done;
  }

  // 30 payments, each booking taking 500 ms; one consumer (flags `extra`) gets SIGTERM once the
  // first is booked. It exits 0 within 3 s, having booked few; the entries it did not start stay
  // pending, hold no claim, and another consumer takes them over: every payment is booked once.
  void sigterm_stops_after_the_bookings_under_way(const std::vector<std::string>& extra) {
    constexpr int kCount = 30;
    auto first = consumer("c0");  // creates the tables, then exits when idle
    ASSERT_EQ(first->wait_exit(seconds(30)), 0) << first->tail();
    const std::string slow = " slow BEFORE INSERT ON " + name_ + ".ledger";
    {
      pqxx::connection conn(pg_url_);
      pqxx::work tx(conn);
      tx.exec0("CREATE FUNCTION " + name_ +
               ".slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.5); "
               "RETURN NEW; END $$");
      tx.exec0("CREATE TRIGGER" + slow + " FOR EACH ROW EXECUTE FUNCTION " + name_ + ".slow()");
      tx.commit();
    }
    std::vector<std::string> produce = args("produce");
    produce.insert(produce.end(), {"--count", std::to_string(kCount), "--duplicates", "0"});
    ChildProcess producer(produce);
    ASSERT_EQ(producer.wait_exit(seconds(30)), 0) << producer.tail();

    auto c1 = consumer("c1", extra);
    ASSERT_TRUE(wait_until(seconds(20), [&] { return ledger_rows() >= 1; })) << c1->tail();
    c1->signal(SIGTERM);
    EXPECT_EQ(c1->wait_exit(seconds(3)), 0) << c1->tail();
    EXPECT_LT(ledger_rows(), kCount / 2);
    {
      pqxx::connection conn(pg_url_);
      pqxx::work tx(conn);
      tx.exec0("DROP TRIGGER" + slow.substr(0, slow.find(" BEFORE")) + " ON " + name_ + ".ledger");
      tx.commit();
    }
    auto c2 = consumer("c2", extra);  // takes over c1's pending entries after --claim-idle-ms
    EXPECT_EQ(c2->wait_exit(seconds(45)), 0) << c2->tail();
    EXPECT_EQ(sql("SELECT count(*) FROM " + name_ + ".ledger"), kCount);
    EXPECT_EQ(sql("SELECT count(DISTINCT request_id) FROM " + name_ + ".ledger"), kCount);
    const std::string pending = redis_cli(redis_url_, {"XPENDING", name_, "ledger"});
    EXPECT_EQ(pending.substr(0, pending.find('\n')), "0") << pending;
  }

  // The entries `consumer` holds delivered and unacked (XPENDING's summary: count, first, last,
  // then each consumer's name and count on lines of their own).
  long long pending_of(const std::string& consumer) {
    std::istringstream lines(redis_cli(redis_url_, {"XPENDING", name_, "ledger"}));
    for (std::string line; std::getline(lines, line);) {
      if (line != consumer) continue;
      std::string count;
      return std::getline(lines, count) ? std::stoll(count) : 0;
    }
    return 0;
  }

  std::string redis_url_;
  std::string pg_url_;
  std::string name_;
};

TEST_F(MqConsumerTest, ThreeConsumersOneKilledEveryPaymentHasExactlyOneEffect) {
  const double took = run_three_consumers_one_killed({});
  std::cout << "blocking consumers: " << took << " s\n";
}

// The async consumer: up to 128 entries in flight on each consumer's one thread, so the killed
// one dies mid-batch with many calls between their claim and their commit.
TEST_F(MqConsumerTest, ThreeAsyncConsumersOneKilledMidBatchEveryPaymentHasExactlyOneEffect) {
  const double took = run_three_consumers_one_killed({"--async", "--in-flight", "128"});
  std::cout << "async consumers: " << took << " s\n";
}

// A negative duration was taken without a word: --max-seconds -1 read nothing and exited 0,
// --exit-when-idle-ms -5 ran for ever.
TEST_F(MqConsumerTest, ANegativeDurationIsAUsageError) {
  for (const char* flag : {"--max-seconds", "--exit-when-idle-ms"}) {
    std::vector<std::string> argv = args("consume");
    argv.insert(argv.end(), {flag, "-1"});
    ChildProcess consumer(argv);
    EXPECT_EQ(consumer.wait_exit(seconds(10)), 2) << flag << ": " << consumer.tail();
    EXPECT_NE(consumer.tail().find("whole number"), std::string::npos) << consumer.tail();
  }
}

// SIGTERM stops the blocking consumer after the entry in hand: it handled the rest of the batch
// it had read first (up to --batch entries, minutes with a slow handler, past a platform's grace
// period).
TEST_F(MqConsumerTest, ASigtermStopsAfterTheEntryInHandNotTheWholeBatch) {
  sigterm_stops_after_the_bookings_under_way({});
}

// The async consumer: its calls whose booking had not started (waiting for one of the 2
// connections) are cancelled, their claims released. It waited for every one of them, up to
// their deadline (the lease: 10 s here).
TEST_F(MqConsumerTest, ASigtermStopsTheAsyncConsumerAfterTheBookingsUnderWay) {
  sigterm_stops_after_the_bookings_under_way(
      {"--async", "--pg-connections", "2", "--lease-ms", "10000"});
}

// The test support (examples_child.cc): wait_exit() returns only after the reader has drained
// the pipe, so a service's last line (a start-up error the tests check for) is never missing.
TEST_F(MqConsumerTest, AnEntryNoRetryCanBookIsDeadLetteredNotRedeliveredForever) {
  bad_entries_are_dead_lettered({});
}

TEST_F(MqConsumerTest, AnEntryNoRetryCanBookIsDeadLetteredNotRedeliveredForeverAsync) {
  bad_entries_are_dead_lettered({"--async"});
}

TEST(ChildProcessTest, WaitExitReturnsAfterTheLastLinesWereRead) {
  ChildProcess child(
      {"/bin/sh", "-c", "head -c 60000 /dev/zero | tr '\\0' x; echo; echo last; exit 3"});
  ASSERT_EQ(child.wait_exit(seconds(10)), 3);
  const std::vector<std::string> lines = child.lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "last");
}

}  // namespace
}  // namespace idem::test
