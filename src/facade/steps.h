// The rules of Context::step(), for every driver: where a call's steps are journaled, which
// journaled step an attempt replays and which it runs, and what makes a step an error. A driver
// reads and writes the journal (Guard::steps(), Guard::put_step()), runs the step and, in a
// transactional call, reads what the step wrote through the transaction; it decides nothing.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "idem/guard.h"
#include "idem/metrics.h"

namespace idem::detail {

/// Longest step name, in bytes.
inline constexpr std::size_t kMaxStepNameBytes = 200;

/// One call's view of its step journal: loaded from the guard at the call's first step, then
/// kept in step with its own writes. Not thread-safe: the driver serializes a call's steps.
class StepBook {
 public:
  /// `metrics` (may be null) counts how each step ends (Metrics::record_step()); it must
  /// outlive the book. Results over `max_result_bytes` (DeduplicatorOptions::
  /// max_step_result_bytes) are not journaled.
  StepBook(Metrics* metrics, std::size_t max_result_bytes) noexcept
      : metrics_(metrics), max_result_bytes_(max_result_bytes) {}

  /// What an attempt does at a step: replay its journaled result, or run it and journal it
  /// with `fingerprint`.
  struct Next {
    std::optional<std::string> replay;
    std::string fingerprint;
  };

  /// Throws idem::InvalidKey unless `name` is 1..kMaxStepNameBytes bytes with no control byte.
  static void validate_name(std::string_view name);
  /// The fingerprint an input is journaled with: SHA-256 (lowercase hex) of its bytes; empty
  /// for an empty input.
  [[nodiscard]] static std::string input_fingerprint(std::string_view input);

  /// A step of a call that holds no guard claim (CallPlan::step_journal() gave none): checks its
  /// name (validate_name()); the driver then runs it, every time.
  void unguarded(std::string_view name) const;

  /// Whether the journal was loaded (load() happened).
  [[nodiscard]] bool loaded() const noexcept { return loaded_; }
  /// The journal as the guard holds it.
  void load(StepJournal journal);
  /// Step `name` with `input`, once loaded: its journaled result when it was journaled with the
  /// same input, else run it. Throws idem::InvalidKey for a bad name (validate_name()) and
  /// idem::StepInputMismatch when it was journaled with another input.
  [[nodiscard]] Next next(std::string_view name, std::string_view input) const;
  /// The guard's answer to journaling `step` as `name` after it ran: throws idem::ClaimLost when
  /// the guard refused it (`owned` false: the claim is another attempt's now); else remembers
  /// it and returns its result.
  std::string journaled(std::string_view name, JournaledStep step, bool owned);

  /// Why a step that ran is not journaled in the guard, or nullopt when it is:
  /// StepEnding::kInTransaction when it wrote through the call's transaction (its effect then
  /// commits once with the call's record, or rolls back with the attempt, so a later attempt
  /// must run it again: a journaled result would skip a write that never committed), and
  /// StepEnding::kTooLarge when its result is over the book's size cap.
  [[nodiscard]] std::optional<StepEnding> unjournaled(
      const JournaledStep& step, bool wrote_through_transaction) const noexcept;
  /// Remembers, for this attempt only, a step that unjournaled() keeps out of the journal for
  /// `why`, and returns its result: reaching its name again in this attempt replays it.
  std::string kept(std::string_view name, JournaledStep step, StepEnding why);

 private:
  std::string remember(std::string_view name, JournaledStep step);
  void count(StepEnding ending) const noexcept {
    if (metrics_ != nullptr) metrics_->record_step(ending);
  }

  Metrics* metrics_;
  std::size_t max_result_bytes_;
  StepJournal journal_;
  bool loaded_ = false;
};

}  // namespace idem::detail
