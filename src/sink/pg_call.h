// The statements of one Deduplicator::run_transactional() call on a PgSink: claim-first, with
// the key locked and its record read in BEGIN's round trip, and the record written once in
// COMMIT's (docs/pg_sink.md, "What a call costs"). The blocking driver (src/facade/
// deduplicator.cc) performs the plan's transactional steps with these.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string_view>

#include "idem/pg_sink.h"

namespace idem::detail {

/// Entry points of PgSink for the driver of the call plan. Thread-safe like PgSink; a
/// transaction belongs to the thread that runs its body.
class PgCall {
 public:
  /// Runs `body(tx)` in a transaction on a pooled connection whose BEGIN is held back until
  /// claim() or begin() sends it, and whose COMMIT carries what record() staged; commits when
  /// `body` returns true, rolls back when it returns false or throws. Errors as
  /// PgSink::transact_if() (a staged record that failed, as the commit's error).
  static bool transact(PgSink& sink, const std::function<bool(pqxx::transaction_base&)>& body);

  /// Claims `key` in `tx`: takes the key's advisory lock (waiting for a transaction that holds
  /// it, up to lock_timeout: then kInProgress, and `tx` is aborted) and reads its committed
  /// record; in one round trip with a held-back BEGIN. No record: kClaimed (an expired one is
  /// deleted first). A record: kDuplicate with its state, fingerprint match and response.
  /// Arguments as PgSink::claim(tx, …). Nothing is written: record() writes the record.
  static SinkClaim claim(PgSink& sink, pqxx::transaction_base& tx, std::string_view key,
                         std::string_view request_id, std::string_view fingerprint);

  /// Sends a held-back BEGIN now: before statements of the caller's own when nothing was
  /// claimed in `tx`.
  static void begin(pqxx::transaction_base& tx);

  /// Stages the completed record of `key` (owner `request_id`, `fingerprint`, `response`
  /// size-capped as PgSink::complete(), kept `retention` ms, 0: PgSinkOptions::retention) to be
  /// inserted with COMMIT. On a transaction not opened by transact(), inserts it at once.
  static void record(PgSink& sink, pqxx::transaction_base& tx, std::string_view key,
                     std::string_view request_id, std::string_view fingerprint,
                     std::string_view response, std::chrono::milliseconds retention);

  /// Runs `handler`, turning a unique violation of one of PgSinkOptions::business_constraints
  /// into `false` (the transaction is left aborted: roll it back). Other libpqxx errors become
  /// idem::PostgresError; any other exception passes through.
  static bool business_write(const PgSink& sink, const std::function<void()>& handler);
};

}  // namespace idem::detail
