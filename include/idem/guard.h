// The claim contract of layer 2, kept by every guard: RedisGuard (shared, across processes)
// and InMemoryGuard (one process: tests, single-instance services).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "idem/export.h"
#include "idem/record.h"

namespace idem {

/// What a claim found.
enum class ClaimStatus {
  kFirst,        ///< No record existed: the caller now owns the claim.
  kRepeatSame,   ///< A record exists, created by this same (non-empty) request ID.
  kRepeatOther,  ///< A record exists, created by another request ID (same operation again).
};

/// Answer of Guard::claim().
struct ClaimResult {
  ClaimStatus status = ClaimStatus::kFirst;  ///< What the claim found.
  /// The caller's owner token (32 lowercase hex characters, 128 random bits, unique per
  /// attempt) when status is kFirst; needed for complete/release/renew. Empty otherwise.
  std::string owner_token{};
  /// State of the record found (kInProgress for a fresh claim).
  RecordState state = RecordState::kInProgress;
  /// Whether the stored fingerprint and the caller's say the same payload, by
  /// fingerprints_match() (fingerprint.h). True for a fresh claim, when either side has no
  /// fingerprint (empty string), and when they were made under other fingerprint options.
  bool fingerprint_matches = true;
  /// The stored response of a COMPLETED record, when it was stored verbatim.
  std::optional<std::string> response{};
  /// SHA-256 (lowercase hex) of the stored response of a COMPLETED record whose response was
  /// larger than the guard's response cap (then `response` is empty).
  std::optional<std::string> response_sha256{};
  /// kFirst: whether the claim reached as many replicas as the guard was asked to wait for
  /// (a durability setting, such as Redis' WAIT). False when it was written on the primary only,
  /// so a failover may lose it: the caller owns it and must release it or accept the risk
  /// (the facade releases it and answers Unavailable under RedisFailurePolicy::kFailClosed, and
  /// keeps it under kFailOpen, where the sink keeps the effect single). Always true for a guard
  /// without such a setting.
  bool replicated = true;
};

/// One entry of a call's step journal (Context::step()).
struct JournaledStep {
  /// SHA-256 (64 lowercase hex) of the input the step ran with; empty when it took none.
  std::string input_fingerprint{};
  /// What the step returned.
  std::string result{};
};

/// A call's step journal: each journaled step by name.
using StepJournal = std::map<std::string, JournaledStep, std::less<>>;

/// A guard: claims idempotency keys atomically, and completes, releases or renews a claim only
/// for its owner. Implementations are thread-safe; failures of their backend throw
/// idem::BackendError (RedisGuard: idem::RedisError).
class IDEM_EXPORT Guard {
 public:
  virtual ~Guard() = default;

  /// Atomically claims `key` (an encoded key text, see IdempotencyKey::encode()) for
  /// `request_id`; on kFirst the record is IN_PROGRESS for lease() and the caller owns it.
  /// Throws idem::InvalidKey when `key` fails validate_key_text() (key.h): a raw text with a
  /// brace, space or control byte never reaches the backend.
  [[nodiscard]] virtual ClaimResult claim(std::string_view key, std::string_view request_id,
                                          std::string_view fingerprint) = 0;
  /// Marks the claim COMPLETED with `response` and keeps it for `retention` (ms; 0 means the
  /// guard's configured retention). Acts only when `owner_token` owns the record; returns false
  /// (changing nothing) otherwise. Throws idem::ConfigError when `retention` < 0.
  virtual bool complete(std::string_view key, std::string_view owner_token,
                        std::string_view response, std::chrono::milliseconds retention) = 0;
  /// Deletes the record if and only if `owner_token` owns it and it is IN_PROGRESS. Returns
  /// whether it deleted. Never deletes another owner's claim.
  virtual bool release(std::string_view key, std::string_view owner_token) = 0;
  /// Extends the IN_PROGRESS claim owned by `owner_token` to `lease` (ms, > 0, else
  /// idem::ConfigError; unlike Sink::renew(), 0 does not mean the configured lease) from now.
  /// Returns false when the caller no longer owns it.
  virtual bool renew(std::string_view key, std::string_view owner_token,
                     std::chrono::milliseconds lease) = 0;
  /// The step journal of `key`: the steps that attempts of the call journaled with
  /// put_step(), by name. Empty when there are none (or they expired). Throws idem::ConfigError
  /// from a guard that keeps no journal (this default), idem::InvalidKey as claim() does, and
  /// idem::BackendError (idem::ForeignRecord for an entry idem did not write).
  [[nodiscard]] virtual StepJournal steps(std::string_view key);
  /// Journals `step` as `name` in `key`'s journal, only while `owner_token` owns the key's
  /// IN_PROGRESS claim: an attempt whose lease ran out and whose key another attempt claimed
  /// is fenced out. The journal is kept for retention() from its last write, whatever happens to
  /// the claim (a release keeps it for the retry). Returns false, writing nothing, when
  /// `owner_token` does not own the claim. Throws like steps().
  virtual bool put_step(std::string_view key, std::string_view owner_token, std::string_view name,
                        const JournaledStep& step);
  /// The lease a fresh claim gets, in ms.
  [[nodiscard]] virtual std::chrono::milliseconds lease() const noexcept = 0;
  /// How long a COMPLETED record is kept when complete() is given 0, in ms; 0 when unknown
  /// (the default). The facade's local cache never answers a key longer than the longest
  /// retention of its guard and sink, when both say it.
  [[nodiscard]] virtual std::chrono::milliseconds retention() const noexcept {
    return std::chrono::milliseconds(0);
  }
  /// The largest response complete() keeps, in bytes: a repeat of a larger one is a duplicate
  /// without a response. The facade's local cache then replays none either. Default: no cap
  /// (SIZE_MAX).
  [[nodiscard]] virtual std::size_t max_response_bytes() const noexcept { return SIZE_MAX; }
};

}  // namespace idem
