// A map of records that expire, for the in-memory backends (InMemoryGuard, InMemorySink): the
// part of their contract that Redis' TTLs and PostgreSQL's expires_at keep for the real ones.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "idem/errors.h"

namespace idem::detail {

/// Records by key text, each with an expiry (`Record::expires_ms`, in the owner's clock's ms),
/// at most `max_records` at once. Not thread-safe: the owner locks around every call.
template <class Record>
class ExpiringRecords {
 public:
  /// `what` names the owner in the error of a full map ("InMemoryGuard").
  ExpiringRecords(std::size_t max_records, std::string what)
      : max_records_(max_records), what_(std::move(what)) {}

  /// The live record of `key` at `now`; an expired one is dropped and nullptr returned.
  Record* live(std::string_view key, std::int64_t now) {
    const auto it = records_.find(key);
    if (it == records_.end()) return nullptr;
    if (it->second.expires_ms <= now) {
      records_.erase(it);
      return nullptr;
    }
    return &it->second;
  }

  /// Stores `record` under `key`, replacing any. When full, expired records are dropped first;
  /// if none has expired it throws a retryable idem::BackendError: dropping a live record could
  /// let a duplicate through.
  void put(std::string_view key, Record record, std::int64_t now) {
    if (records_.size() >= max_records_ && !records_.contains(key)) {
      std::erase_if(records_, [now](const auto& entry) { return entry.second.expires_ms <= now; });
      if (records_.size() >= max_records_) {
        throw BackendError("idem: " + what_ + " is full (max_records live records)", true);
      }
    }
    records_.insert_or_assign(std::string(key), std::move(record));
  }

  /// Removes `key`, if present.
  void erase(std::string_view key) {
    if (const auto it = records_.find(key); it != records_.end()) records_.erase(it);
  }

  /// Records held, expired ones not yet dropped included.
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }

 private:
  // Hashes std::string and std::string_view alike, so lookups need no temporary string.
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view key) const noexcept {
      return std::hash<std::string_view>{}(key);
    }
  };

  std::size_t max_records_;
  std::string what_;
  std::unordered_map<std::string, Record, KeyHash, std::equal_to<>> records_;
};

}  // namespace idem::detail
