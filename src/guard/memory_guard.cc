#include "idem/memory_guard.h"

#include <openssl/rand.h>

#include <mutex>
#include <optional>
#include <unordered_map>

#include "idem/errors.h"

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

// Hashes std::string and std::string_view alike, so lookups need no temporary string.
struct KeyHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view key) const noexcept {
    return std::hash<std::string_view>{}(key);
  }
};

std::string random_owner_token() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw BackendError("idem: RAND_bytes failed", true);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  token.reserve(32);
  for (const unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 0x0F]);
  }
  return token;
}

}  // namespace

struct InMemoryGuard::State {
  InMemoryGuardOptions options;
  mutable std::mutex mutex;
  std::unordered_map<std::string, Record, KeyHash, std::equal_to<>> records;

  // The live record of `key`, dropping it when expired. Caller holds `mutex`.
  Record* live(std::string_view key, std::int64_t now) {
    const auto it = records.find(key);
    if (it == records.end()) return nullptr;
    if (it->second.expires_ms <= now) {
      records.erase(it);
      return nullptr;
    }
    return &it->second;
  }

  Record* owned(std::string_view key, std::string_view owner_token, std::int64_t now) {
    Record* record = live(key, now);
    return record != nullptr && record->owner_token == owner_token ? record : nullptr;
  }

  void make_room(std::int64_t now) {
    if (records.size() < options.max_records) return;
    std::erase_if(records, [now](const auto& entry) { return entry.second.expires_ms <= now; });
    if (records.size() >= options.max_records) {
      throw BackendError("idem: InMemoryGuard is full (max_records live records)", true);
    }
  }
};

InMemoryGuard::InMemoryGuard(InMemoryGuardOptions options)
    : lease_(options.lease), state_(std::make_unique<State>()) {
  if (options.lease.count() <= 0 || options.retention.count() <= 0 || options.max_records == 0) {
    throw ConfigError("idem: InMemoryGuard needs lease > 0, retention > 0 and max_records >= 1");
  }
  if (!options.clock) options.clock = steady_clock();
  state_->options = std::move(options);
}

InMemoryGuard::~InMemoryGuard() = default;

ClaimResult InMemoryGuard::claim(std::string_view key, std::string_view request_id,
                                 std::string_view fingerprint) {
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  ClaimResult result;
  if (const Record* record = state_->live(key, now)) {
    result.status = !request_id.empty() && record->request_id == request_id
                        ? ClaimStatus::kRepeatSame
                        : ClaimStatus::kRepeatOther;
    result.state = record->state;
    result.fingerprint_matches =
        fingerprint.empty() || record->fingerprint.empty() || record->fingerprint == fingerprint;
    if (record->state == RecordState::kCompleted) result.response = record->response;
    return result;
  }
  state_->make_room(now);
  result.owner_token = random_owner_token();
  state_->records.insert_or_assign(std::string(key), Record{std::string(request_id),
                                                            result.owner_token,
                                                            std::string(fingerprint),
                                                            RecordState::kInProgress,
                                                            {},
                                                            now + lease_.count()});
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
  state_->records.erase(state_->records.find(key));
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

std::size_t InMemoryGuard::size() const {
  std::lock_guard lock(state_->mutex);
  return state_->records.size();
}

}  // namespace idem
