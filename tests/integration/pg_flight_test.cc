// The blocking sink's pipelined flights (src/pg/flight.h) against a real server, through a
// counting proxy: a flight is one round trip whose prepared statements are never parsed again,
// it answers with its last statement's result, a failed statement throws its SQLSTATE and skips
// the statements after it while the connection stays usable, and a lost connection is a
// pqxx::broken_connection. A BatchedTransaction with no opening statements is an autocommit unit:
// its flights commit at their sync point and its end sends nothing.
#include <gtest/gtest.h>

#include <memory>
#include <pqxx/pqxx>
#include <string>

#include "counting_proxy.h"
#include "pg/flight.h"
#include "pg_server.h"
#include "sink/batched_transaction.h"
#include "test_env.h"

namespace idem::detail {
namespace {

struct ConnDeleter {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
using Conn = std::unique_ptr<PGconn, ConnDeleter>;

class PgFlightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
    url_ = url;
    const test::PgAddress address = test::parse_pg_url(url);
    if (address.port == 0) GTEST_SKIP() << "IDEM_TEST_PG_URL is not postgresql://user@host:port/db";
    proxy_ = std::make_unique<test::CountingProxy>(test::CountingProxy::Protocol::kPostgres,
                                                   address.host, address.port);
    proxied_ = "host=127.0.0.1 port=" + std::to_string(proxy_->port()) +
               " dbname=" + address.database + " user=" + address.user +
               " sslmode=disable gssencmode=disable";
    conn_.reset(PQconnectdb(proxied_.c_str()));
    ASSERT_EQ(PQstatus(conn_.get()), CONNECTION_OK) << PQerrorMessage(conn_.get());
    exec("CREATE TEMP TABLE flight_rows (n int)");
    exec("PREPARE flight_add(int) AS INSERT INTO flight_rows VALUES ($1) RETURNING n * 2");
    proxy_->reset();
  }

  void exec(const std::string& sql) {
    const PgResultPtr result(PQexec(conn_.get(), sql.c_str()));
    ASSERT_LT(PQresultStatus(result.get()), PGRES_BAD_RESPONSE) << PQerrorMessage(conn_.get());
  }

  std::string one(const std::string& sql) {
    const PgResultPtr result(PQexec(conn_.get(), sql.c_str()));
    return PQntuples(result.get()) == 1 ? PQgetvalue(result.get(), 0, 0) : "?";
  }

  std::string url_;
  std::string proxied_;  // conninfo through the proxy
  std::unique_ptr<test::CountingProxy> proxy_;
  Conn conn_;
};

TEST_F(PgFlightTest, AFlightIsOneRoundTripAndAnswersWithItsLastStatementsResult) {
  const PgResultPtr last = run_flight(conn_.get(), {{"BEGIN", false, {}},
                                                    {"flight_add", true, pg_params("20")},
                                                    {"flight_add", true, pg_params("21")}});
  EXPECT_EQ(proxy_->round_trips(), 1u);
  EXPECT_EQ(proxy_->messages()['Q'], 0u);  // no simple query
  EXPECT_EQ(proxy_->messages()['P'], 1u);  // BEGIN's Parse; the prepared ones go by name
  ASSERT_EQ(PQntuples(last.get()), 1);
  EXPECT_STREQ(PQgetvalue(last.get(), 0, 0), "42");
  (void)run_flight(conn_.get(), {{"SELECT $1::int IS NULL", false, pg_params(std::nullopt)},
                                 {"COMMIT", false, {}}});
  EXPECT_EQ(one("SELECT count(*) FROM flight_rows"), "2");
}

TEST_F(PgFlightTest, AFailedStatementThrowsItsSqlstateSkipsTheRestAndLeavesTheConnectionUsable) {
  try {
    (void)run_flight(conn_.get(), {{"flight_add", true, pg_params("1")},
                                   {"SELECT 1 / $1::int", false, pg_params("0")},
                                   {"flight_add", true, pg_params("2")}});
    ADD_FAILURE() << "a division by zero must fail the flight";
  } catch (const pqxx::sql_error& error) {
    EXPECT_EQ(error.sqlstate(), "22012");
    EXPECT_NE(std::string(error.what()).find("division by zero"), std::string::npos);
  }
  EXPECT_EQ(PQpipelineStatus(conn_.get()), PQ_PIPELINE_OFF);
  // Outside BEGIN, the statements up to a sync point are one implicit transaction: the failure
  // rolls back the first INSERT, and the third never ran.
  EXPECT_EQ(one("SELECT count(*) FROM flight_rows"), "0");
  const PgResultPtr after = run_flight(conn_.get(), {{"flight_add", true, pg_params("3")}});
  EXPECT_STREQ(PQgetvalue(after.get(), 0, 0), "6");
}

TEST_F(PgFlightTest, ALostConnectionIsABrokenConnection) {
  const std::string pid = one("SELECT pg_backend_pid()");
  {
    const Conn admin(PQconnectdb(url_.c_str()));
    const PgResultPtr killed(
        PQexec(admin.get(), ("SELECT pg_terminate_backend(" + pid + ", 5000)").c_str()));
    ASSERT_STREQ(PQgetvalue(killed.get(), 0, 0), "t");
  }
  EXPECT_THROW((void)run_flight(conn_.get(), {{"flight_add", true, pg_params("4")}}),
               pqxx::broken_connection);
}

TEST_F(PgFlightTest, AnAutocommitUnitCommitsEachFlightAtItsSyncAndSendsNothingAtItsEnd) {
  // A table of the test's own, so that another session can look at it.
  const std::string table = "idem_flight_unit_" + one("SELECT pg_backend_pid()");
  exec("CREATE TABLE " + table + " (n int)");
  pqxx::connection conn(proxied_);
  const auto count = [&] {
    pqxx::connection other(url_);
    pqxx::nontransaction look(other);
    return look.exec1("SELECT count(*) FROM " + table)[0].as<int>();
  };
  {
    BatchedTransaction unit(conn, {});
    proxy_->reset();
    (void)unit.send({{"INSERT INTO " + table + " VALUES (1)", false, {}}});
    EXPECT_EQ(proxy_->round_trips(), 1u);
    EXPECT_EQ(count(), 1);  // committed before the unit ends
    EXPECT_THROW(unit.at_commit({"SELECT 1", false, {}}), pqxx::usage_error);
    unit.commit();
  }
  {
    BatchedTransaction unit(conn, {});
    (void)unit.send({{"INSERT INTO " + table + " VALUES (2)", false, {}}});
  }                                      // ended without commit(): nothing to roll back
  EXPECT_EQ(proxy_->round_trips(), 2u);  // the two flights, no COMMIT or ROLLBACK
  EXPECT_EQ(count(), 2);
  exec("DROP TABLE " + table);
}

}  // namespace
}  // namespace idem::detail
