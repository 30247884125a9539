#include "idem/memory_guard.h"

#include <mutex>
#include <optional>

#include "common/expiring_records.h"
#include "guard/record.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"

namespace idem {

namespace {

struct Record {
  std::string request_id;
  std::string owner_token;
  std::string fingerprint;
  RecordState state = RecordState::kInProgress;
  std::string response;
  std::int64_t expires_ms = 0;
};

struct Journal {
  StepJournal steps;
  std::int64_t expires_ms = 0;
};

}  // namespace

struct InMemoryGuard::State {
  explicit State(InMemoryGuardOptions opts)
      : options(std::move(opts)),
        records(options.max_records, "InMemoryGuard"),
        journals(options.max_records, "InMemoryGuard step journals") {}

  InMemoryGuardOptions options;
  mutable std::mutex mutex;
  detail::ExpiringRecords<Record> records;
  detail::ExpiringRecords<Journal> journals;

  // The live record of `key` if `owner_token` owns it. Caller holds `mutex`.
  Record* owned(std::string_view key, std::string_view owner_token, std::int64_t now) {
    Record* record = records.live(key, now);
    return record != nullptr && record->owner_token == owner_token ? record : nullptr;
  }
};

InMemoryGuard::InMemoryGuard(InMemoryGuardOptions options) : lease_(options.lease) {
  if (options.lease.count() <= 0 || options.retention.count() <= 0 || options.max_records == 0) {
    throw ConfigError("idem: InMemoryGuard needs lease > 0, retention > 0 and max_records >= 1");
  }
  if (!options.clock) options.clock = steady_clock();
  state_ = std::make_unique<State>(std::move(options));
}

InMemoryGuard::~InMemoryGuard() = default;

ClaimResult InMemoryGuard::claim(std::string_view key, std::string_view request_id,
                                 std::string_view fingerprint) {
  validate_key_text(key);
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  ClaimResult result;
  if (const Record* record = state_->records.live(key, now)) {
    result.status = !request_id.empty() && record->request_id == request_id
                        ? ClaimStatus::kRepeatSame
                        : ClaimStatus::kRepeatOther;
    result.state = record->state;
    result.fingerprint_matches = fingerprints_match(record->fingerprint, fingerprint);
    if (record->state == RecordState::kCompleted) result.response = record->response;
    return result;
  }
  result.owner_token = detail::new_owner_token();
  state_->records.put(key,
                      Record{std::string(request_id),
                             result.owner_token,
                             std::string(fingerprint),
                             RecordState::kInProgress,
                             {},
                             now + lease_.count()},
                      now);
  return result;
}

bool InMemoryGuard::complete(std::string_view key, std::string_view owner_token,
                             std::string_view response, std::chrono::milliseconds retention) {
  if (retention.count() < 0) throw ConfigError("idem: complete: retention must be >= 0");
  if (retention.count() == 0) retention = state_->options.retention;
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  Record* record = state_->owned(key, owner_token, now);
  if (record == nullptr) return false;
  record->state = RecordState::kCompleted;
  record->response = response;
  record->expires_ms = now + retention.count();
  return true;
}

bool InMemoryGuard::release(std::string_view key, std::string_view owner_token) {
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  const Record* record = state_->owned(key, owner_token, now);
  if (record == nullptr || record->state != RecordState::kInProgress) return false;
  state_->records.erase(key);
  return true;
}

bool InMemoryGuard::renew(std::string_view key, std::string_view owner_token,
                          std::chrono::milliseconds lease) {
  if (lease.count() <= 0) throw ConfigError("idem: renew needs a lease > 0");
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  Record* record = state_->owned(key, owner_token, now);
  if (record == nullptr || record->state != RecordState::kInProgress) return false;
  record->expires_ms = now + lease.count();
  return true;
}

StepJournal InMemoryGuard::steps(std::string_view key) {
  validate_key_text(key);
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  const Journal* journal = state_->journals.live(key, now);
  return journal != nullptr ? journal->steps : StepJournal{};
}

bool InMemoryGuard::put_step(std::string_view key, std::string_view owner_token,
                             std::string_view name, const JournaledStep& step) {
  validate_key_text(key);
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  const Record* record = state_->owned(key, owner_token, now);
  if (record == nullptr || record->state != RecordState::kInProgress) return false;
  Journal journal;
  if (Journal* live = state_->journals.live(key, now)) journal.steps = std::move(live->steps);
  journal.steps.insert_or_assign(std::string(name), step);
  journal.expires_ms = now + state_->options.retention.count();
  state_->journals.put(key, std::move(journal), now);
  return true;
}

std::chrono::milliseconds InMemoryGuard::retention() const noexcept {
  return state_->options.retention;
}

std::size_t InMemoryGuard::size() const {
  std::lock_guard lock(state_->mutex);
  return state_->records.size();
}

}  // namespace idem
