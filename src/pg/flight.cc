#include "pg/flight.h"

#include <pqxx/except>

namespace idem::detail {
namespace {

[[noreturn]] void throw_lost(PGconn* conn) {
  throw pqxx::broken_connection(pq_message(PQerrorMessage(conn)));  // translated by the caller
}

bool send(PGconn* conn, const PgFlightStatement& statement, std::vector<const char*>& values) {
  values.clear();
  for (const auto& param : statement.params) values.push_back(param ? param->c_str() : nullptr);
  const int count = static_cast<int>(values.size());
  if (statement.prepared) {
    return PQsendQueryPrepared(conn, statement.statement.c_str(), count, values.data(), nullptr,
                               nullptr, 0) == 1;
  }
  return PQsendQueryParams(conn, statement.statement.c_str(), count, nullptr, values.data(),
                           nullptr, nullptr, 0) == 1;
}

}  // namespace

PgResultPtr run_flight(PGconn* conn, const std::vector<PgFlightStatement>& statements,
                       std::size_t* failed_index) {
  if (PQenterPipelineMode(conn) != 1) throw_lost(conn);
  std::vector<const char*> values;
  for (const PgFlightStatement& statement : statements) {
    if (!send(conn, statement, values)) throw_lost(conn);
  }
  if (PQpipelineSync(conn) != 1) throw_lost(conn);
  // Each statement's results end with a null; the sync point's result ends the flight. A
  // statement after a failed one gets PGRES_PIPELINE_ABORTED.
  PgResultPtr last;
  PgResultPtr failed;
  std::size_t index = 0;
  for (;;) {
    PgResultPtr result(PQgetResult(conn));
    if (result == nullptr) {
      if (PQstatus(conn) == CONNECTION_BAD) throw_lost(conn);
      ++index;
      continue;
    }
    const ExecStatusType status = PQresultStatus(result.get());
    if (status == PGRES_PIPELINE_SYNC) break;
    if (status == PGRES_FATAL_ERROR && failed == nullptr) {
      if (PQstatus(conn) == CONNECTION_BAD) throw_lost(conn);
      failed = std::move(result);
      if (failed_index != nullptr) *failed_index = index;
    } else if (index + 1 == statements.size()) {
      last = std::move(result);
    }
  }
  if (PQexitPipelineMode(conn) != 1) throw_lost(conn);
  if (failed != nullptr) {
    const char* sqlstate = PQresultErrorField(failed.get(), PG_DIAG_SQLSTATE);
    throw pqxx::sql_error(pq_message(PQresultErrorMessage(failed.get())), "",
                          sqlstate != nullptr ? sqlstate : "");
  }
  return last;
}

}  // namespace idem::detail
