#include "sink/batched_transaction.h"

#include <iterator>
#include <utility>

#include "pg/cancel.h"
#include "pg/errors.h"

namespace idem::detail {

BatchedTransaction::BatchedTransaction(pqxx::connection_base& conn, std::vector<std::string> begin)
    : pqxx::internal::namedclass("BatchedTransaction"),
      pqxx::dbtransaction(conn),
      begin_(std::move(begin)) {
  Begin();
}

BatchedTransaction::~BatchedTransaction() noexcept { End(); }

PgResultPtr BatchedTransaction::fly(std::vector<PgFlightStatement> tail) {
  std::vector<PgFlightStatement> flight;
  std::size_t opening = 0;
  if (!begun_ && !begin_.empty()) {
    begun_ = true;  // from here on the server may hold a transaction: abort() rolls it back
    for (const std::string& sql : begin_) flight.push_back({sql, false, {}});
    opening = flight.size();
  }
  const std::size_t staged = staged_.size();
  flight.insert(flight.end(), std::make_move_iterator(staged_.begin()),
                std::make_move_iterator(staged_.end()));
  staged_.clear();
  flight.insert(flight.end(), std::make_move_iterator(tail.begin()),
                std::make_move_iterator(tail.end()));
  failed_staged_.reset();
  std::size_t failed = flight.size();
  try {
    return run_flight(raw_connection(*this), flight, &failed);
  } catch (const pqxx::sql_error&) {
    if (failed >= opening && failed < opening + staged) failed_staged_ = failed - opening;
    throw;
  }
}

PgResultPtr BatchedTransaction::send(std::vector<PgFlightStatement> statements) {
  return fly(std::move(statements));
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
  PgResultPtr committed;
  try {
    committed = fly({{"COMMIT", false, {}}});
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
  check_committed(PQcmdStatus(committed.get()));
}

void BatchedTransaction::do_abort() {
  aborted_ = true;
  reactivation_avoidance_clear();
  staged_.clear();
  if (begun_) direct_exec("ROLLBACK");
}

}  // namespace idem::detail
