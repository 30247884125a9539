// What the blocking PgSink and the async driver's sink (src/sink/async_pg_sink.h) share: the
// options' validation, the SQL of the statements both run on the records table, and the answer
// an existing row gives. One table and one set of statements, two transports (libpqxx on the
// caller's thread, libpq's pipeline mode on a loop). Defined in pg_sink.cc.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/pg_sink.h"
#include "idem/sink.h"
#include "pg/result.h"

namespace idem::detail {

/// Throws idem::ConfigError when `options` cannot work (PgSink's constructor runs it too).
void validate_sink_options(const PgSinkOptions& options);

/// The lease a renewal extends a row to: `lease`, or the configured one when 0 (< 0:
/// idem::ConfigError).
[[nodiscard]] std::chrono::milliseconds sink_lease(const PgSinkOptions& options,
                                                   std::chrono::milliseconds lease);

/// How long a completed record is kept: `retention`, or the configured one when 0 (< 0:
/// idem::ConfigError).
[[nodiscard]] std::chrono::milliseconds sink_retention(const PgSinkOptions& options,
                                                       std::chrono::milliseconds retention);

/// The text of PgSink's statements for the records table of `options` (parameters as PgSink
/// binds them: $1 ns, $2 key, ...).
struct SinkStatements {
  std::string claim;      ///< $3 request_id, $4 fingerprint, $5 expiry in ms, $6 owner token:
                          ///< RETURNING 1 or none.
  std::string lookup;     ///< state, fingerprint, request_id, response, response_sha256, expired.
  std::string take_over;  ///< Deletes the key's row when it expired.
  std::string complete;   ///< $3 response, $4 response_sha256, $5 retention ms, $6 owner or NULL.
  std::string release;    ///< $3 owner token: deletes its IN_PROGRESS row.
  std::string renew;      ///< $3 owner token, $4 lease ms: extends its IN_PROGRESS row.
  std::string lock;       ///< Takes the key's transaction-scoped advisory lock (run_transactional).
  std::string record;     ///< $3 request_id, $4 fingerprint, $5 response, $6 response_sha256,
                          ///< $7 retention ms: the completed record, inserted with COMMIT.
  std::string writes;     ///< No parameter: what the open transaction wrote (TransactionWrites).
};
[[nodiscard]] SinkStatements sink_statements(const PgSinkOptions& options);

/// What an open transaction has written so far, as its session sees it: whether it was given a
/// transaction ID (PostgreSQL assigns one at its first write of any kind), and the rows it
/// inserted, updated or deleted in user tables (pg_stat_xact_user_tables; read only once an ID
/// is assigned, so a transaction that wrote nothing pays a cheap read).
struct TransactionWrites {
  bool id_assigned = false;
  std::int64_t rows = 0;
};

/// Whether the transaction wrote between two readings of its writes: it got its ID in between,
/// or its row count moved. A write that assigns no ID and changes no user table's rows (a
/// sequence's nextval(), an advisory lock) is not a write here.
[[nodiscard]] inline bool wrote_between(const TransactionWrites& before,
                                        const TransactionWrites& after) noexcept {
  return (!before.id_assigned && after.id_assigned) || before.rows != after.rows;
}

/// The columns of a lookup row, as text (the response decoded from bytea).
struct StoredRow {
  std::string_view state;
  std::string_view fingerprint;
  std::string_view request_id;
  std::optional<std::string> response;
  std::optional<std::string> response_sha256;
};

/// The answer to a claim of `request_id` with `fingerprint` that met the committed `row`.
[[nodiscard]] SinkClaim existing_claim(StoredRow row, std::string_view request_id,
                                       std::string_view fingerprint);
/// The same for the first row of a `lookup` result (text format, SinkStatements::lookup's
/// columns); throws idem::PostgresError when its response cannot be decoded.
[[nodiscard]] SinkClaim existing_claim(const PGresult* lookup, std::string_view request_id,
                                       std::string_view fingerprint);

/// `bytes` as PostgreSQL's text input of a bytea: "\x" and hex.
[[nodiscard]] std::string bytea_literal(std::string_view bytes);
/// A bytea column of a text-format result, decoded; nullopt for NULL. Throws
/// idem::PostgresError when the value cannot be decoded.
[[nodiscard]] std::optional<std::string> bytea_value(const PGresult* result, int row, int column);

/// The parameters of SinkStatements::record: the completed record of `key`, its response as
/// bytea (or, over options.max_response_bytes, NULL and the response's SHA-256), kept for
/// `retention` (ms, > 0).
[[nodiscard]] PgParams record_params(const PgSinkOptions& options, std::string_view key,
                                     std::string_view request_id, std::string_view fingerprint,
                                     std::string_view response,
                                     std::chrono::milliseconds retention);
/// The parameters of SinkStatements::complete: the response as record_params() has it, kept for
/// `retention` (ms, > 0), by the claim of `owner` (nullopt: the claim in the same transaction).
[[nodiscard]] PgParams complete_params(const PgSinkOptions& options, std::string_view key,
                                       std::string_view response,
                                       std::chrono::milliseconds retention,
                                       std::optional<std::string> owner);

}  // namespace idem::detail
