// examples/async_service end to end: a storm of duplicate deliveries on one event loop books each
// order once; a failing handler releases its claim; a cancelled call keeps it until its lease ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <pqxx/pqxx>
#include <string>

#include "examples_child.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem::test {
namespace {

using std::chrono::seconds;

TEST(AsyncServiceExample, EachOrderBookedOnceFailureReleasesCancellationKeeps) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  const std::string name = unique_name("async_service");
  ChildProcess service({IDEM_ASYNC_SERVICE_BIN, "--redis-url", redis_url, "--pg-url", pg_url,
                        "--schema", name, "--ns", name, "--orders", "60", "--copies", "3",
                        "--lease-ms", "1000"});
  EXPECT_EQ(service.wait_exit(seconds(120)), 0) << service.tail(30);
  const auto summary = service.wait_for_line("summary ", seconds(1));
  ASSERT_TRUE(summary.has_value()) << service.tail(30);
  EXPECT_EQ(summary_field(*summary, "ok"), 1) << *summary;
  EXPECT_EQ(summary_field(*summary, "ledger_rows"), 60) << *summary;
  EXPECT_EQ(summary_field(*summary, "duplicate_effects"), 0) << *summary;
  EXPECT_EQ(summary_field(*summary, "released_on_failure"), 1) << *summary;
  EXPECT_EQ(summary_field(*summary, "kept_on_cancel"), 1) << *summary;

  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  tx.exec0("DROP SCHEMA IF EXISTS " + tx.quote_name(name) + " CASCADE");
  tx.commit();
  const std::string keys = redis_cli(redis_url, {"--scan", "--pattern", "idem:" + name + ":*"});
  for (std::size_t start = 0; start < keys.size();) {
    const std::size_t end = std::min(keys.find('\n', start), keys.size());
    if (end > start) redis_cli(redis_url, {"DEL", keys.substr(start, end - start)});
    start = end + 1;
  }
}

}  // namespace
}  // namespace idem::test
