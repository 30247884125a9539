// The rules of Context::step(), for every driver: where a call's steps are journaled, which
// journaled step an attempt replays and which it runs, and what makes a step an error. A driver
// reads and writes the journal (Guard::steps(), Guard::put_step()) and runs the step; it decides
// nothing.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/guard.h"

namespace idem::detail {

/// Longest step name, in bytes.
inline constexpr std::size_t kMaxStepNameBytes = 200;

/// One call's view of its step journal: loaded from the guard at the call's first step, then
/// kept in step with its own writes. Not thread-safe: the driver serializes a call's steps.
class StepBook {
 public:
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

 private:
  StepJournal journal_;
  bool loaded_ = false;
};

}  // namespace idem::detail
