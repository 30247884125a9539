// The simulator's backends on simulated time: a Redis guard with leases, retention, a restart
// that loses every record and a failover to a replica that lags behind; a PostgreSQL with the
// sink's rows, a business ledger, transactions and row locks. Both keep the contracts of
// idem::Guard and idem::Sink (include/idem/guard.h, sink.h) as RedisGuard and PgSink do; neither
// fails on its own: the simulator decides when a command is refused, times out or is lost.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/guard.h"
#include "idem/record.h"
#include "idem/sink.h"

namespace idem::sim {

/// Simulated time in ms: the servers' clock. Processes read it through clocks of their own.
using Time = std::int64_t;

/// The simulated Redis guard. `now` is the simulation's clock, read at each command.
class SimRedis final : public Guard {
 public:
  struct Options {
    std::chrono::milliseconds lease{1000};
    std::chrono::milliseconds retention{5000};
    /// The longest replication lag a failover can have (writes older than this are on the
    /// replica).
    Time max_lag = 500;
    /// A completed response longer than this keeps only its SHA-256 (RedisGuardOptions::
    /// max_response_bytes): a claim then answers no response, and response_sha256.
    std::size_t max_response_bytes = 64 * 1024;
    // Planted bugs (false plants one):
    /// complete() marks the key's live record COMPLETED whoever owns it.
    bool complete_checks_owner = true;
    /// claim() compares fingerprints (else every repeat matches).
    bool compares_fingerprints = true;
    /// claim() tells REPEAT_SAME from REPEAT_OTHER by the request ID (else every repeat of a
    /// request with an ID is REPEAT_SAME).
    bool tells_requests_apart = true;
    /// complete() keeps only the SHA-256 of a response over max_response_bytes (else all of it).
    bool caps_responses = true;
    /// complete() keeps the record for the retention asked (else only for the lease).
    bool keeps_retention = true;
    /// put_step() journals only while the owner token holds the key's IN_PROGRESS record (else
    /// whoever writes).
    bool journal_checks_owner = true;
  };

  /// A live record, as the invariants see it.
  struct View {
    std::string request_id;
    std::string owner_token;
    RecordState state = RecordState::kInProgress;
    Time expires = 0;
  };

  SimRedis(const Time& now, Options options) : now_(now), options_(options) {}

  // ---- idem::Guard, as lua/*.lua -----------------------------------------------------------
  [[nodiscard]] ClaimResult claim(std::string_view key, std::string_view request_id,
                                  std::string_view fingerprint) override;
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response,
                std::chrono::milliseconds retention) override;
  bool release(std::string_view key, std::string_view owner_token) override;
  bool renew(std::string_view key, std::string_view owner_token,
             std::chrono::milliseconds lease) override;
  /// As lua/journal.lua: a hash beside the record, kept for the retention from its last write
  /// whatever happens to the record.
  [[nodiscard]] StepJournal steps(std::string_view key) override;
  bool put_step(std::string_view key, std::string_view owner_token, std::string_view name,
                const JournaledStep& step) override;
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override { return options_.lease; }

  // ---- faults --------------------------------------------------------------------------------
  /// A restart without persistence: every record is lost. Returns how many live ones were.
  std::size_t restart();
  /// The replica, `lag` ms behind (<= max_lag), takes over: the writes of the last `lag` ms are
  /// lost (a claim vanishes, a completion or release is undone). Returns how many writes.
  std::size_t failover(Time lag);
  /// maxmemory evicts the `n`-th live record (in key order, modulo their number); returns its
  /// key, empty when there is no live record.
  std::string evict(std::size_t n);

  // ---- the truth, for the invariants ---------------------------------------------------------
  /// Whether the live record of `key` is owned by `owner_token` now.
  [[nodiscard]] bool holds(std::string_view key, std::string_view owner_token) const;
  /// The live record of `key`, if any.
  [[nodiscard]] std::optional<View> record(std::string_view key) const;
  /// Whether the live step journal of `key` holds step `name`.
  [[nodiscard]] bool journaled(std::string_view key, std::string_view name) const;
  /// When the live record of `key` owned by `owner_token` expires; nullopt when there is none.
  [[nodiscard]] std::optional<Time> expiry(std::string_view key,
                                           std::string_view owner_token) const;
  /// Whether `owner_token` held `key` at time `at` (<= now) in the history that survived: the
  /// writes a failover undid never happened (a claim they evicted or replaced is back).
  [[nodiscard]] bool held_at(std::string_view key, std::string_view owner_token, Time at) const;

 private:
  struct Record {
    std::string request_id;
    std::string owner_token;
    std::string fingerprint;
    RecordState state = RecordState::kInProgress;
    std::string response;
    bool capped = false;  // over max_response_bytes: only its digest is kept
    Time expires = 0;
  };
  struct Write {
    Time at = 0;
    std::string key;
    std::optional<Record> before;  // what the write replaced (nullopt: no record)
    std::size_t logged = 0;        // its entry in history_[key]
  };
  struct Journal {
    StepJournal steps;
    Time expires = 0;
  };
  struct JournalWrite {
    Time at = 0;
    std::string key;
    std::optional<Journal> before;  // what the write replaced (nullopt: no journal)
  };
  // A write as the key's history keeps it: who owns the key from `at` on, until when.
  struct Logged {
    Time at = 0;
    std::string owner_token;  // empty: no record
    Time expires = 0;
    bool undone = false;  // by a failover
  };

  [[nodiscard]] const Record* live(std::string_view key) const;
  [[nodiscard]] Record* owned(std::string_view key, std::string_view owner_token);
  // Every change goes through here, journaled for failover().
  void write(std::string_view key, std::optional<Record> value);

  const Time& now_;
  Options options_;
  std::map<std::string, Record, std::less<>> records_;
  std::deque<Write> journal_;  // the writes of the last max_lag ms, oldest first
  std::map<std::string, Journal, std::less<>> step_journals_;
  std::deque<JournalWrite> step_writes_;  // the journal writes of the last max_lag ms
  std::map<std::string, std::vector<Logged>, std::less<>> history_;
  std::uint64_t tokens_ = 0;
};

/// A business effect in the ledger table: committed with the sink's row in one transaction
/// (run_transactional()), or on its own by the handler (run()).
struct Effect {
  int logical = 0;         ///< The logical request whose effect it is.
  int call = 0;            ///< The call that wrote it.
  std::string response{};  ///< What that call's handler answered.
  Time committed_at = 0;
  int variant = 0;  ///< Which payload of the request (1: its key reused with another payload).
  /// Written by an execution that held the key (a claim, a sink row, the business constraint);
  /// false for unclaimed runs (a reentrant retry, a pass-through, a run unguarded).
  bool claimed = true;
  std::string key{};  ///< The idempotency key its call claimed (empty when it had none).
  /// Until when the sink's row committed with it answers repeats of its key (kNever when no row
  /// of idem's was committed with it: the business constraint keeps the key for good).
  Time row_expires = INT64_MAX;
};

/// The simulated PostgreSQL: the sink's table (a unique index on the key), a ledger table, and
/// transactions whose uncommitted claim rows lock their key, as INSERT ... ON CONFLICT does.
class SimPostgres final : public Sink {
 public:
  using TxId = int;

  struct Options {
    std::chrono::milliseconds lease{1000};  ///< A run() claim's row lease (PgSinkOptions::lease).
    std::chrono::milliseconds retention{5000};  ///< How long a completed row is kept.
    /// A response longer than this keeps only its SHA-256 (PgSinkOptions::max_response_bytes).
    std::size_t max_response_bytes = 64 * 1024;
  };

  /// A live row, as the invariants see it.
  struct View {
    std::string owner;
    RecordState state = RecordState::kInProgress;
    std::optional<std::string> response;
    Time expires = 0;
  };

  SimPostgres(const Time& now, Options options) : now_(now), options_(options) {}

  // ---- idem::Sink: each call commits on its own (run()) -------------------------------------
  [[nodiscard]] SinkClaim claim(std::string_view key, std::string_view request_id,
                                std::string_view fingerprint,
                                std::string_view owner_token) override;
  bool complete(std::string_view key, std::string_view owner, std::string_view response,
                std::chrono::milliseconds retention) override;
  bool release(std::string_view key, std::string_view owner) override;
  bool renew(std::string_view key, std::string_view owner,
             std::chrono::milliseconds lease) override;
  /// run(): the handler's business write, committed on its own.
  void write_effect_now(Effect effect);

  // ---- transactions (run_transactional) -------------------------------------------------------
  [[nodiscard]] TxId begin();
  /// Whether `tx` is open (not committed, rolled back or aborted by the server).
  [[nodiscard]] bool is_open(TxId tx) const { return open_.contains(tx); }
  /// The claim row, inserted in `tx`. nullopt when another open transaction holds an
  /// uncommitted claim of `key`: the statement waits for it (`*blocker` says which).
  [[nodiscard]] std::optional<SinkClaim> claim(TxId tx, std::string_view key,
                                               std::string_view request_id,
                                               std::string_view fingerprint,
                                               std::chrono::milliseconds ttl, TxId* blocker);
  /// Marks the row `tx` claimed COMPLETED with `response`, kept `ttl` (0: the retention).
  void complete(TxId tx, std::string_view key, std::string_view response,
                std::chrono::milliseconds ttl);
  /// The handler's business write, in `tx`.
  void write_effect(TxId tx, Effect effect);
  /// What a business write under a UNIQUE constraint on the logical request found
  /// (TransactionalClaim::kBusinessKey: the constraint is the claim).
  enum class BusinessWrite {
    kWritten,    ///< Staged in `tx`.
    kDuplicate,  ///< A committed effect holds the key: unique violation (23505).
    kBlocked,    ///< Another open transaction wrote the key: the INSERT waits for it.
  };
  /// The business write under that constraint; kBlocked sets `*blocker`.
  [[nodiscard]] BusinessWrite write_unique_effect(TxId tx, Effect effect, TxId* blocker);
  /// Applies everything `tx` wrote at once.
  void commit(TxId tx);
  /// Drops what `tx` wrote (also what the server does to a transaction whose connection died).
  void rollback(TxId tx);
  /// A crash, restart or failover of the server: every open transaction is rolled back.
  std::size_t abort_all();

  // ---- the truth ---------------------------------------------------------------------------
  /// Committed effects, in commit order.
  [[nodiscard]] const std::vector<Effect>& ledger() const noexcept { return ledger_; }
  /// The committed effects of `logical`.
  [[nodiscard]] std::vector<const Effect*> effects_of(int logical) const;
  /// The live committed row of `key`, if any.
  [[nodiscard]] std::optional<View> row(std::string_view key) const;

 private:
  struct Row {
    std::string request_id;
    std::string owner;  // the claim's owner token (its request ID without one)
    std::string fingerprint;
    RecordState state = RecordState::kInProgress;
    std::optional<std::string> response;  // nullopt: none yet, or over the cap
    Time expires = 0;
  };
  struct Tx {
    std::map<std::string, Row, std::less<>> rows;
    std::vector<Effect> effects;
  };

  [[nodiscard]] const Row* live(std::string_view key) const;
  [[nodiscard]] static SinkClaim duplicate(const Row& row, std::string_view request_id,
                                           std::string_view fingerprint);
  void unlock(TxId tx, const Tx& staged);
  // Marks `row` COMPLETED with `response` (its digest alone when over the cap), kept `ttl` (0:
  // the retention).
  void finish(Row& row, std::string_view response, std::chrono::milliseconds ttl) const;

  const Time& now_;
  Options options_;
  std::map<std::string, Row, std::less<>> rows_;
  std::map<std::string, TxId, std::less<>> locks_;  // key -> the open transaction claiming it
  std::map<int, TxId> effect_locks_;  // logical request -> the open transaction that wrote it
  std::map<TxId, Tx> open_;
  std::vector<Effect> ledger_;
  TxId next_tx_ = 1;
};

}  // namespace idem::sim
