#include "sink/batched_transaction.h"

#include <iterator>
#include <utility>

#include "pg/cancel.h"

namespace idem::detail {

BatchedTransaction::BatchedTransaction(pqxx::connection_base& conn, std::vector<std::string> begin)
    : pqxx::internal::namedclass("BatchedTransaction"),
      pqxx::dbtransaction(conn),
      begin_(std::move(begin)) {
  Begin();
}

BatchedTransaction::~BatchedTransaction() noexcept { End(); }

std::vector<PgFlightStatement> BatchedTransaction::opening(
    std::vector<PgFlightStatement> statements) {
  if (begun_ || begin_.empty()) return statements;
  begun_ = true;  // from here on the server may hold a transaction: abort() rolls it back
  std::vector<PgFlightStatement> flight;
  flight.reserve(begin_.size() + statements.size());
  for (const std::string& sql : begin_) flight.push_back({sql, false, {}});
  flight.insert(flight.end(), std::make_move_iterator(statements.begin()),
                std::make_move_iterator(statements.end()));
  return flight;
}

PgResultPtr BatchedTransaction::send(std::vector<PgFlightStatement> statements) {
  return run_flight(raw_connection(*this), opening(std::move(statements)));
}

void BatchedTransaction::begin_now() {
  if (begun_ || begin_.empty()) return;
  begun_ = true;
  std::string sql;
  for (const std::string& statement : begin_) sql += (sql.empty() ? "" : "; ") + statement;
  exec(sql);
}

void BatchedTransaction::at_commit(PgFlightStatement statement) {
  if (begin_.empty()) throw pqxx::usage_error("idem: a statement staged in an autocommit unit");
  staged_.push_back(std::move(statement));
}

void BatchedTransaction::do_commit() {
  if (!begun_ && staged_.empty()) return;  // nothing was sent: nothing to commit
  std::vector<PgFlightStatement> flight = opening(std::move(staged_));
  staged_.clear();
  flight.push_back({"COMMIT", false, {}});
  try {
    (void)run_flight(raw_connection(*this), flight);
  } catch (const std::exception& error) {
    // As pqxx::transaction's commit: a connection lost meanwhile leaves the outcome unknown.
    if (!conn().is_open()) {
      throw pqxx::in_doubt_error(std::string(error.what()) +
                                 "\nconnection lost while committing: outcome unknown");
    }
    // A staged statement failed, so the server skipped COMMIT: end the transaction here
    // (libpqxx marks it aborted and sends nothing more).
    try {
      direct_exec("ROLLBACK");
    } catch (const std::exception&) {
      // The connection is discarded by the caller when it broke; the error stands.
    }
    throw;
  }
}

void BatchedTransaction::do_abort() {
  reactivation_avoidance_clear();
  if (begun_) direct_exec("ROLLBACK");
}

}  // namespace idem::detail
