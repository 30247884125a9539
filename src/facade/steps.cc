#include "facade/steps.h"

#include "common/sha256.h"
#include "idem/errors.h"

namespace idem::detail {

void StepBook::validate_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxStepNameBytes) {
    throw InvalidKey("idem: a step name must be 1.." + std::to_string(kMaxStepNameBytes) +
                     " bytes");
  }
  for (const char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) throw InvalidKey("idem: a step name holds a control byte");
  }
}

std::string StepBook::input_fingerprint(std::string_view input) {
  return input.empty() ? std::string() : sha256_hex(input);
}

void StepBook::unguarded(std::string_view name) const {
  validate_name(name);
  count(StepEnding::kUnguarded);
}

void StepBook::load(StepJournal journal) {
  journal_ = std::move(journal);
  loaded_ = true;
}

StepBook::Next StepBook::next(std::string_view name, std::string_view input) const {
  validate_name(name);
  Next next{std::nullopt, input_fingerprint(input)};
  const auto it = journal_.find(name);
  if (it == journal_.end()) return next;
  if (it->second.input_fingerprint != next.fingerprint) {
    throw StepInputMismatch("idem: step '" + std::string(name) +
                            "' was journaled with another input; nothing ran");
  }
  next.replay = it->second.result;
  count(StepEnding::kReplayed);
  return next;
}

std::string StepBook::journaled(std::string_view name, JournaledStep step, bool owned) {
  if (!owned) {
    count(StepEnding::kClaimLost);
    throw ClaimLost("idem: step '" + std::string(name) +
                    "' ran but was not journaled: this attempt's lease ran out and another "
                    "attempt claimed the key");
  }
  count(StepEnding::kJournaled);
  return remember(name, std::move(step));
}

std::optional<StepEnding> StepBook::unjournaled(const JournaledStep& step,
                                                bool wrote_through_transaction) const noexcept {
  if (wrote_through_transaction) return StepEnding::kInTransaction;
  if (step.result.size() > max_result_bytes_) return StepEnding::kTooLarge;
  return std::nullopt;
}

std::string StepBook::kept(std::string_view name, JournaledStep step, StepEnding why) {
  count(why);
  return remember(name, std::move(step));
}

std::string StepBook::remember(std::string_view name, JournaledStep step) {
  std::string result = step.result;
  journal_.insert_or_assign(std::string(name), std::move(step));
  return result;
}

}  // namespace idem::detail
