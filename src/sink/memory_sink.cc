#include "idem/memory_sink.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "common/expiring_records.h"
#include "common/sha256.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "sink/claim_check.h"

namespace idem {
namespace {

struct Row {
  std::string request_id;
  std::string owner;  // the claim's owner token, or its request ID
  std::string fingerprint;
  RecordState state = RecordState::kInProgress;
  std::optional<std::string> response{};
  std::string response_sha256{};
  std::int64_t expires_ms = 0;
};

}  // namespace

struct InMemorySink::State {
  explicit State(InMemorySinkOptions opts)
      : options(std::move(opts)), rows(options.max_records, "InMemorySink") {}

  // The live IN_PROGRESS row of `key` owned by `request_id`. Caller holds `mutex`.
  Row* owned(std::string_view key, std::string_view owner, std::int64_t now) {
    Row* row = rows.live(key, now);
    return row != nullptr && row->state == RecordState::kInProgress && row->owner == owner
               ? row
               : nullptr;
  }

  InMemorySinkOptions options;
  mutable std::mutex mutex;
  detail::ExpiringRecords<Row> rows;
};

InMemorySink::InMemorySink(InMemorySinkOptions options) {
  if (options.lease.count() <= 0 || options.retention.count() <= 0 || options.max_records == 0) {
    throw ConfigError("idem: InMemorySink needs lease > 0, retention > 0 and max_records >= 1");
  }
  if (!options.clock) options.clock = steady_clock();
  state_ = std::make_unique<State>(std::move(options));
}

InMemorySink::~InMemorySink() = default;

SinkClaim InMemorySink::claim(std::string_view key, std::string_view request_id,
                              std::string_view fingerprint, std::string_view owner_token) {
  detail::validate_sink_claim(key, request_id, owner_token);
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  SinkClaim answer;
  if (const Row* row = state_->rows.live(key, now)) {
    answer.status = SinkStatus::kDuplicate;
    answer.state = row->state;
    answer.fingerprint_matches = fingerprints_match(row->fingerprint, fingerprint);
    answer.same_request = row->request_id == request_id;
    answer.response = row->response;
    answer.response_sha256 = row->response_sha256;
    return answer;
  }
  state_->rows.put(key,
                   Row{.request_id = std::string(request_id),
                       .owner = std::string(owner_token.empty() ? request_id : owner_token),
                       .fingerprint = std::string(fingerprint),
                       .state = RecordState::kInProgress,
                       .response = std::nullopt,
                       .response_sha256 = {},
                       .expires_ms = now + state_->options.lease.count()},
                   now);
  return answer;
}

bool InMemorySink::complete(std::string_view key, std::string_view owner, std::string_view response,
                            std::chrono::milliseconds retention) {
  if (retention.count() < 0) throw ConfigError("idem: a sink retention must not be negative");
  if (retention.count() == 0) retention = state_->options.retention;
  const bool capped = response.size() > state_->options.max_response_bytes;
  std::string sha = capped ? detail::sha256_hex(response) : std::string();
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  Row* row = state_->owned(key, owner, now);
  if (row == nullptr) return false;
  row->state = RecordState::kCompleted;
  if (capped) {
    row->response.reset();
  } else {
    row->response = std::string(response);
  }
  row->response_sha256 = std::move(sha);
  row->expires_ms = now + retention.count();
  return true;
}

bool InMemorySink::release(std::string_view key, std::string_view owner) {
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  if (state_->owned(key, owner, now) == nullptr) return false;
  state_->rows.erase(key);
  return true;
}

std::size_t InMemorySink::max_response_bytes() const noexcept {
  return state_->options.max_response_bytes;
}

std::chrono::milliseconds InMemorySink::retention() const noexcept {
  return state_->options.retention;
}

bool InMemorySink::renew(std::string_view key, std::string_view owner,
                         std::chrono::milliseconds lease) {
  if (lease.count() < 0) throw ConfigError("idem: a sink lease must not be negative");
  if (lease.count() == 0) lease = state_->options.lease;
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  Row* row = state_->owned(key, owner, now);
  if (row == nullptr) return false;
  row->expires_ms = std::max(row->expires_ms, now + lease.count());
  return true;
}

std::optional<RecordInfo> InMemorySink::inspect(std::string_view key) const {
  const std::int64_t now = state_->options.clock->now_ms();
  std::lock_guard lock(state_->mutex);
  const Row* row = state_->rows.live(key, now);
  if (row == nullptr) return std::nullopt;
  RecordInfo info;
  info.state = row->state;
  info.request_id = row->request_id;
  info.owner_token = row->owner;
  info.fingerprint = row->fingerprint;
  info.ttl = std::chrono::milliseconds(row->expires_ms - now);
  if (row->response) info.response_bytes = row->response->size();
  if (!row->response_sha256.empty()) info.response_sha256 = row->response_sha256;
  return info;
}

std::size_t InMemorySink::size() const {
  std::lock_guard lock(state_->mutex);
  return state_->rows.size();
}

}  // namespace idem
