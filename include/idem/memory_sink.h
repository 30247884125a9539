// An in-process sink: the record contract of layer 4 without a server, for tests and for
// single-process services. Rows live in this process only: another process (or a restart) does
// not see them, so it does not replace PgSink across instances, and it has no transaction to
// share with business writes (Deduplicator::run_transactional() needs a PgSink).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/export.h"
#include "idem/record.h"
#include "idem/sink.h"

namespace idem {

/// Options of an InMemorySink; validated by its constructor (idem::ConfigError).
struct InMemorySinkOptions {
  /// How long an IN_PROGRESS row lives, in ms, before another claim may take the key over (the
  /// owner crashed). Must be > 0. Default 30 s, as PgSinkOptions::lease.
  std::chrono::milliseconds lease{std::chrono::seconds(30)};
  /// How long a COMPLETED row is kept, in ms, when complete() is given 0. Must be > 0.
  /// Default 24 h, as PgSinkOptions::retention.
  std::chrono::milliseconds retention{std::chrono::hours(24)};
  /// Largest response stored as is, in bytes; of a larger one only its SHA-256 is kept.
  /// Default 64 KiB, as PgSinkOptions::max_response_bytes.
  std::size_t max_response_bytes = std::size_t{64} * 1024;
  /// Most rows held. When full, expired rows are dropped first; if none has expired, a claim of
  /// a new key throws idem::BackendError (retryable). Must be ≥ 1.
  std::size_t max_records = 100000;
  /// Time source for leases and retention; null means steady_clock() (monotonic).
  std::shared_ptr<Clock> clock{};
};

/// Sink over a mutex-protected hash map. Same answers as PgSink's non-transactional form for
/// the same calls (see Sink). Thread-safe.
class IDEM_EXPORT InMemorySink final : public Sink {
 public:
  /// Throws idem::ConfigError when a duration is ≤ 0 or max_records is 0.
  explicit InMemorySink(InMemorySinkOptions options = {});
  ~InMemorySink() override;
  InMemorySink(const InMemorySink&) = delete;
  InMemorySink& operator=(const InMemorySink&) = delete;

  [[nodiscard]] SinkClaim claim(std::string_view key, std::string_view request_id,
                                std::string_view fingerprint,
                                std::string_view owner_token = {}) override;
  bool complete(std::string_view key, std::string_view owner, std::string_view response,
                std::chrono::milliseconds retention) override;
  bool release(std::string_view key, std::string_view owner) override;
  bool renew(std::string_view key, std::string_view owner,
             std::chrono::milliseconds lease) override;
  /// InMemorySinkOptions::max_response_bytes.
  [[nodiscard]] std::size_t max_response_bytes() const noexcept override;
  /// InMemorySinkOptions::retention.
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override;

  /// The live row of `key` (expired rows are not returned), for tests and tools: owner_token is
  /// the row's owner (its token, or its request ID), ttl is by this sink's clock.
  [[nodiscard]] std::optional<RecordInfo> inspect(std::string_view key) const;

  /// Rows held now, expired ones not yet dropped included.
  [[nodiscard]] std::size_t size() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace idem
