#include "sink/batched_transaction.h"

#include <utility>

namespace idem::detail {

BatchedTransaction::BatchedTransaction(pqxx::connection_base& conn, std::string begin)
    : pqxx::internal::namedclass("BatchedTransaction"),
      pqxx::dbtransaction(conn),
      begin_(std::move(begin)) {
  Begin();
}

BatchedTransaction::~BatchedTransaction() noexcept { End(); }

pqxx::result BatchedTransaction::send(const std::string& statements) {
  if (begun_) return exec(statements);
  begun_ = true;  // from here on the server may hold a transaction: abort() rolls it back
  return exec(begin_ + "; " + statements);
}

void BatchedTransaction::begin_now() {
  if (begun_) return;
  begun_ = true;
  exec(begin_);
}

void BatchedTransaction::at_commit(const std::string& statements) {
  staged_ += statements;
  staged_ += "; ";
}

void BatchedTransaction::do_commit() {
  if (!begun_ && staged_.empty()) return;  // nothing was sent: nothing to commit
  const std::string query = (begun_ ? std::string() : begin_ + "; ") + staged_ + "COMMIT";
  begun_ = true;
  try {
    direct_exec(query.c_str());
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
