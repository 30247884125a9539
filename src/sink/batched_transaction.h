// A libpqxx transaction that spends no round trip of its own: BEGIN waits for the first
// statements sent through it, and COMMIT carries the statements staged for it, each as one
// multi-statement query (docs/pg_sink.md, "What a call costs").
#pragma once

#include <pqxx/pqxx>
#include <string>

namespace idem::detail {

/// A READ COMMITTED transaction on `conn` (a pqxx::dbtransaction, so subtransactions and every
/// libpqxx call work in it). BEGIN is held back until send() or begin_now(); statements of the
/// caller's own (exec_params, exec_prepared) must come after one of them, since libpqxx sends
/// those on the connection directly. commit() sends the staged statements and COMMIT as one
/// query: when a staged statement fails, the server skips the COMMIT, the transaction is rolled
/// back and the statement's error is thrown. Not thread-safe (like any libpqxx transaction).
class BatchedTransaction final : public pqxx::dbtransaction {
 public:
  /// `begin` is the text that opens the transaction: "BEGIN", or "BEGIN; SET LOCAL …".
  BatchedTransaction(pqxx::connection_base& conn, std::string begin);
  ~BatchedTransaction() noexcept override;
  BatchedTransaction(const BatchedTransaction&) = delete;
  BatchedTransaction& operator=(const BatchedTransaction&) = delete;

  /// Runs `statements` (SQL text, one or more statements separated by ';') as one query,
  /// preceded by the held-back BEGIN; returns the last statement's result.
  pqxx::result send(const std::string& statements);
  /// Sends the held-back BEGIN on its own, if it was not sent yet.
  void begin_now();
  /// Stages `statements` to be sent with COMMIT, before it.
  void at_commit(const std::string& statements);
  /// Whether BEGIN was sent.
  [[nodiscard]] bool begun() const noexcept { return begun_; }

 private:
  void do_begin() override {}  // held back: see send()
  void do_commit() override;
  void do_abort() override;

  std::string begin_;
  std::string staged_;  // statements for COMMIT's query, each ending in "; "
  bool begun_ = false;
};

}  // namespace idem::detail
