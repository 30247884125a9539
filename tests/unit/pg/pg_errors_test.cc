// How a libpqxx failure becomes an idem::PostgresError: no server needed.
#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <memory>
#include <pqxx/except>
#include <string>

#include "idem/errors.h"
#include "pg/errors.h"
#include "pg/flight.h"

namespace idem::detail {
namespace {

// The PostgresError throw_translated() makes of `error`.
PostgresError translated(const pqxx::failure& error) {
  try {
    throw_translated(error);
  } catch (const PostgresError& e) {
    return e;
  }
  ADD_FAILURE() << "no PostgresError";
  return PostgresError("", false);
}

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// libpq ends its messages with a newline; a log line or an HTTP answer made of what() must not
// carry it.
TEST(PgErrors, AServerErrorKeepsItsTextWithoutTheTrailingNewline) {
  const PostgresError e =
      translated(pqxx::sql_error("ERROR:  division by zero\n", "SELECT 1/0", "22012"));
  EXPECT_EQ(std::string(e.what()), "idem: postgres: ERROR:  division by zero");
  EXPECT_EQ(e.sqlstate(), "22012");
  EXPECT_FALSE(e.retryable());
}

// A flight on a connection that is gone throws pqxx::broken_connection, which the sink
// translates: its message carries the prefix once ("idem: postgres: idem: postgres: ..." before).
TEST(PgErrors, AConnectionLostInAFlightIsPrefixedOnce) {
  const std::unique_ptr<PGconn, decltype(&PQfinish)> conn(
      PQconnectdb("host=127.0.0.1 port=1 connect_timeout=2"), &PQfinish);
  ASSERT_EQ(PQstatus(conn.get()), CONNECTION_BAD);
  try {
    (void)run_flight(conn.get(), {PgFlightStatement{.statement = "SELECT 1", .params = {}}});
    ADD_FAILURE() << "no error";
  } catch (const pqxx::broken_connection& lost) {
    const PostgresError e = translated(lost);
    const std::string what = e.what();
    EXPECT_EQ(count(what, "idem: postgres:"), 1u) << what;
    EXPECT_NE(what.back(), '\n') << what;
    EXPECT_TRUE(e.retryable());
  }
}

}  // namespace
}  // namespace idem::detail
