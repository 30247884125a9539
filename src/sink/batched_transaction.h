// A libpqxx transaction that spends no round trip of its own: BEGIN waits for the first
// statements sent through it, and COMMIT carries the statements staged for it, each as one
// pipelined flight (docs/pg_sink.md, "What a call costs").
#pragma once

#include <cstddef>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "pg/flight.h"

namespace idem::detail {

/// A READ COMMITTED transaction on `conn` (a pqxx::dbtransaction, so subtransactions and every
/// libpqxx call work in it). BEGIN is held back until send() or begin_now(); statements of the
/// caller's own (exec_params, exec_prepared) must come after one of them, since libpqxx sends
/// those on the connection directly (and before the staged statements, which wait for the next
/// send() or commit()). commit() sends the staged statements and COMMIT as one flight: when a
/// staged statement fails, the server skips the COMMIT, the transaction is rolled back and the
/// statement's error is thrown.
///
/// With no opening statements it is no transaction at all but an autocommit unit (as
/// pqxx::nontransaction, whose connection libpqxx does not hand out): each flight commits at
/// its sync point, commit() and abort() send nothing, and nothing may be staged.
/// Not thread-safe (like any libpqxx transaction).
class BatchedTransaction final : public pqxx::dbtransaction {
 public:
  /// `begin`: the statements that open the transaction, "BEGIN" first (then, e.g., SET LOCAL);
  /// empty for an autocommit unit.
  BatchedTransaction(pqxx::connection_base& conn, std::vector<std::string> begin);
  ~BatchedTransaction() noexcept override;
  BatchedTransaction(const BatchedTransaction&) = delete;
  BatchedTransaction& operator=(const BatchedTransaction&) = delete;

  /// Runs `statements` as one flight (run_flight()), preceded by the held-back BEGIN and the
  /// statements staged so far (which are then no longer staged); returns the last statement's
  /// result, throws as run_flight().
  PgResultPtr send(std::vector<PgFlightStatement> statements);
  /// Sends the held-back BEGIN on its own, if it was not sent yet.
  void begin_now();
  /// Stages `statement` to be sent with the next send() or with COMMIT, ahead of them, in the
  /// order staged. Throws pqxx::usage_error in an autocommit unit.
  void at_commit(PgFlightStatement statement);
  /// The position, among the statements staged for it, of the one whose failure the last
  /// send() or commit() threw; none when that flight's failure was no staged statement's.
  [[nodiscard]] std::optional<std::size_t> failed_staged() const noexcept { return failed_staged_; }
  /// Whether BEGIN was sent.
  [[nodiscard]] bool begun() const noexcept { return begun_; }
  /// Whether it was aborted: by abort(), or by libpqxx when a statement sent with exec() failed
  /// in it (libpqxx then refuses to commit it).
  [[nodiscard]] bool aborted() const noexcept { return aborted_; }

 private:
  void do_begin() override {}  // held back: see send()
  void do_commit() override;
  void do_abort() override;
  // The held-back BEGIN (if it was not sent yet), the staged statements and `tail`, as one
  // flight; records failed_staged().
  PgResultPtr fly(std::vector<PgFlightStatement> tail);

  std::vector<std::string> begin_;
  std::vector<PgFlightStatement> staged_;  // statements for the next flight
  std::optional<std::size_t> failed_staged_;
  bool begun_ = false;
  bool aborted_ = false;
};

}  // namespace idem::detail
