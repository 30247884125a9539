// Layer 4, the Postgres sink: the idempotency key under a UNIQUE index, inserted in the same
// transaction as the business write.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/record.h"

namespace pqxx {
class transaction_base;  // libpqxx's transaction; include <pqxx/pqxx> to use it.
}

namespace idem {

/// Options of a PgSink.
struct PgSinkOptions {
  /// libpq connection string: a `postgresql://` URL or `key=value` keywords. Required.
  std::string conninfo;
  /// Schema and table of the records; quoted as identifiers, so any name is safe.
  std::string schema = "public";
  std::string table = "idem_records";
  /// Namespace (service or tenant) stored with each row; part of the unique key.
  std::string ns = "default";
  /// Most connections open at once. Must be ≥ 1.
  std::size_t pool_size = 8;
  /// How long a completed row is kept before purge, in seconds.
  std::chrono::seconds retention{std::chrono::hours(24)};
};

/// What a sink claim found.
enum class SinkStatus {
  kClaimed,    ///< The row was inserted in the caller's transaction: go on with the business write.
  kDuplicate,  ///< A committed row already holds the key.
};

/// Answer of PgSink::claim().
struct SinkClaim {
  SinkStatus status = SinkStatus::kClaimed;
  /// State of the existing row (kInProgress for a fresh claim).
  RecordState state = RecordState::kInProgress;
  /// Whether the stored fingerprint equals the caller's.
  bool fingerprint_matches = true;
  /// Stored response of a COMPLETED row.
  std::optional<std::string> response;
};

/// The Postgres sink. Thread-safe: one instance serves all threads through its connection
/// pool. Methods throw idem::PostgresError when PostgreSQL fails.
class PgSink {
 public:
  /// Throws idem::ConfigError on invalid options. Does not connect until first use.
  explicit PgSink(PgSinkOptions options);
  ~PgSink();
  PgSink(const PgSink&) = delete;
  PgSink& operator=(const PgSink&) = delete;

  /// Creates the schema objects if missing. Idempotent.
  void migrate();

  /// Borrows a pooled connection, opens a transaction, runs `body` in it and commits when
  /// `body` returns; rolls back and rethrows when it throws.
  void transact(const std::function<void(pqxx::transaction_base&)>& body);

  /// Inserts the claim row for `key` inside `tx` (`INSERT … ON CONFLICT DO NOTHING
  /// RETURNING`), before the caller's business write. A conflict never aborts `tx`.
  [[nodiscard]] SinkClaim claim(pqxx::transaction_base& tx, std::string_view key,
                                std::string_view request_id, std::string_view fingerprint);

  /// Marks the row of `key` COMPLETED with `response`, inside `tx`, before commit.
  void complete(pqxx::transaction_base& tx, std::string_view key, std::string_view response);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
