#include "examples_child.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <pqxx/pqxx>
#include <sstream>

#include "redis_server.h"
#include "test_env.h"

namespace idem::test {

void ExampleServer::start(std::vector<std::string> argv, const std::string& stem,
                          const std::string& server_pg_url) {
  redis_url = service_setting("IDEM_TEST_REDIS_URL");
  pg_url = service_setting("IDEM_TEST_PG_URL");
  if (redis_url.empty() || pg_url.empty()) return;
  schema = unique_name(stem);
  argv.insert(argv.end(), {"--port", "0", "--redis-url", redis_url, "--pg-url",
                           server_pg_url.empty() ? pg_url : server_pg_url});
  argv.insert(argv.end(), {"--schema", schema, "--ns", schema});
  process = std::make_unique<ChildProcess>(std::move(argv));
  const auto line =
      process->wait_for_line("listening on http://127.0.0.1:", std::chrono::seconds(20));
  if (line) port = std::stoi(line->substr(line->rfind(':') + 1));
}

void ExampleServer::stop() {
  if (process == nullptr) return;
  process->signal(SIGTERM);
  EXPECT_EQ(process->wait_exit(std::chrono::seconds(10)), 0) << process->tail();
  process.reset();
  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  tx.exec0("DROP SCHEMA IF EXISTS " + tx.quote_name(schema) + " CASCADE");
  tx.commit();
  for (const auto& key : keys()) redis_cli(redis_url, {"DEL", key});
}

std::vector<std::string> ExampleServer::keys() const {
  std::vector<std::string> out;
  std::istringstream listing(
      redis_cli(redis_url, {"--scan", "--pattern", "idem:" + schema + ":*"}));
  for (std::string line; std::getline(listing, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

long long summary_field(const std::string& line, const std::string& name) {
  const std::size_t at = line.find(" " + name + "=");
  return at == std::string::npos ? 0 : std::stoll(line.substr(at + name.size() + 2));
}

}  // namespace idem::test
