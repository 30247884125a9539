#include "backends.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"

namespace idem::sim {

// ---- SimRedis ----------------------------------------------------------------------------------

const SimRedis::Record* SimRedis::live(std::string_view key) const {
  const auto found = records_.find(key);
  return found != records_.end() && found->second.expires > now_ ? &found->second : nullptr;
}

SimRedis::Record* SimRedis::owned(std::string_view key, std::string_view owner_token) {
  const Record* record = live(key);
  return record != nullptr && record->owner_token == owner_token ? const_cast<Record*>(record)
                                                                 : nullptr;
}

void SimRedis::write(std::string_view key, std::optional<Record> value) {
  while (!journal_.empty() && journal_.front().at < now_ - options_.max_lag) journal_.pop_front();
  const auto found = records_.find(key);
  std::vector<Logged>& history = history_[std::string(key)];
  Write entry{now_, std::string(key), std::nullopt, history.size()};
  if (found != records_.end()) entry.before = found->second;
  journal_.push_back(std::move(entry));
  history.push_back(value ? Logged{now_, value->owner_token, value->expires} : Logged{now_, {}, 0});
  if (value) {
    records_.insert_or_assign(std::string(key), *std::move(value));
  } else if (found != records_.end()) {
    records_.erase(found);
  }
}

ClaimResult SimRedis::claim(std::string_view key, std::string_view request_id,
                            std::string_view fingerprint) {
  validate_key_text(key);
  ClaimResult result;
  if (const Record* record = live(key)) {
    const bool same =
        !request_id.empty() && (record->request_id == request_id || !options_.tells_requests_apart);
    result.status = same ? ClaimStatus::kRepeatSame : ClaimStatus::kRepeatOther;
    result.state = record->state;
    result.fingerprint_matches =
        !options_.compares_fingerprints || fingerprints_match(record->fingerprint, fingerprint);
    if (record->state == RecordState::kCompleted) {
      if (record->capped) {
        result.response_sha256 = "sha256-of-a-response-over-the-cap";
      } else {
        result.response = record->response;
      }
    }
    return result;
  }
  char token[33];
  std::snprintf(token, sizeof token, "%032llx", static_cast<unsigned long long>(++tokens_));
  result.owner_token = token;
  write(key, Record{std::string(request_id),
                    result.owner_token,
                    std::string(fingerprint),
                    RecordState::kInProgress,
                    {},
                    false,
                    now_ + options_.lease.count()});
  return result;
}

bool SimRedis::complete(std::string_view key, std::string_view owner_token,
                        std::string_view response, std::chrono::milliseconds retention) {
  if (retention.count() < 0) throw ConfigError("idem: complete: retention must be >= 0");
  if (retention.count() == 0) retention = options_.retention;
  if (!options_.keeps_retention) retention = options_.lease;
  const Record* record = options_.complete_checks_owner ? owned(key, owner_token) : live(key);
  if (record == nullptr) return false;
  Record done = *record;
  done.state = RecordState::kCompleted;
  done.capped = options_.caps_responses && response.size() > options_.max_response_bytes;
  done.response = done.capped ? std::string() : std::string(response);
  done.expires = now_ + retention.count();
  write(key, std::move(done));
  return true;
}

bool SimRedis::release(std::string_view key, std::string_view owner_token) {
  const Record* record = owned(key, owner_token);
  if (record == nullptr || record->state != RecordState::kInProgress) return false;
  write(key, std::nullopt);
  return true;
}

bool SimRedis::renew(std::string_view key, std::string_view owner_token,
                     std::chrono::milliseconds lease) {
  const Record* record = owned(key, owner_token);
  if (record == nullptr || record->state != RecordState::kInProgress) return false;
  Record renewed = *record;
  renewed.expires = now_ + lease.count();
  write(key, std::move(renewed));
  return true;
}

StepJournal SimRedis::steps(std::string_view key) {
  validate_key_text(key);
  const auto found = step_journals_.find(key);
  if (found == step_journals_.end() || found->second.expires <= now_) return {};
  return found->second.steps;
}

bool SimRedis::put_step(std::string_view key, std::string_view owner_token, std::string_view name,
                        const JournaledStep& step) {
  validate_key_text(key);
  if (options_.journal_checks_owner) {
    const Record* record = owned(key, owner_token);
    if (record == nullptr || record->state != RecordState::kInProgress) return false;
  }
  while (!step_writes_.empty() && step_writes_.front().at < now_ - options_.max_lag) {
    step_writes_.pop_front();
  }
  JournalWrite entry{now_, std::string(key), std::nullopt};
  Journal journal;
  if (const auto found = step_journals_.find(key); found != step_journals_.end()) {
    entry.before = found->second;
    if (found->second.expires > now_) journal.steps = found->second.steps;
  }
  step_writes_.push_back(std::move(entry));
  journal.steps.insert_or_assign(std::string(name), step);
  journal.expires = now_ + options_.retention.count();
  step_journals_.insert_or_assign(std::string(key), std::move(journal));
  return true;
}

bool SimRedis::journaled(std::string_view key, std::string_view name) const {
  const auto found = step_journals_.find(key);
  return found != step_journals_.end() && found->second.expires > now_ &&
         found->second.steps.contains(name);
}

std::size_t SimRedis::restart() {
  std::size_t lost = 0;
  for (const auto& [key, record] : records_) {
    lost += record.expires > now_ ? 1 : 0;
    history_[key].push_back(Logged{now_, {}, 0});
  }
  records_.clear();
  journal_.clear();
  step_journals_.clear();
  step_writes_.clear();
  return lost;
}

std::size_t SimRedis::failover(Time lag) {
  std::size_t undone = 0;
  while (!journal_.empty() && journal_.back().at > now_ - lag) {
    Write& last = journal_.back();
    history_[last.key][last.logged].undone = true;
    if (last.before) {
      records_.insert_or_assign(last.key, *std::move(last.before));
    } else {
      records_.erase(last.key);
    }
    journal_.pop_back();
    ++undone;
  }
  journal_.clear();  // the new replica starts from the new master
  while (!step_writes_.empty() && step_writes_.back().at > now_ - lag) {
    JournalWrite& last = step_writes_.back();
    if (last.before) {
      step_journals_.insert_or_assign(last.key, *std::move(last.before));
    } else {
      step_journals_.erase(last.key);
    }
    step_writes_.pop_back();
    ++undone;
  }
  step_writes_.clear();
  return undone;
}

std::string SimRedis::evict(std::size_t n) {
  std::vector<std::string> keys;
  for (const auto& [key, record] : records_) {
    if (record.expires > now_) keys.push_back(key);
  }
  if (keys.empty()) return {};
  std::string key = keys[n % keys.size()];
  write(key, std::nullopt);
  return key;
}

bool SimRedis::holds(std::string_view key, std::string_view owner_token) const {
  const Record* record = live(key);
  return record != nullptr && record->owner_token == owner_token;
}

std::optional<SimRedis::View> SimRedis::record(std::string_view key) const {
  const Record* found = live(key);
  if (found == nullptr) return std::nullopt;
  return View{found->request_id, found->owner_token, found->state, found->expires};
}

bool SimRedis::held_at(std::string_view key, std::string_view owner_token, Time at) const {
  const auto found = history_.find(key);
  if (found == history_.end()) return false;
  for (auto it = found->second.rbegin(); it != found->second.rend(); ++it) {
    if (it->undone || it->at > at) continue;
    return it->owner_token == owner_token && it->expires > at;
  }
  return false;
}

std::optional<Time> SimRedis::expiry(std::string_view key, std::string_view owner_token) const {
  if (!holds(key, owner_token)) return std::nullopt;
  return live(key)->expires;
}

// ---- SimPostgres -------------------------------------------------------------------------------

const SimPostgres::Row* SimPostgres::live(std::string_view key) const {
  const auto found = rows_.find(key);
  return found != rows_.end() && found->second.expires > now_ ? &found->second : nullptr;
}

SinkClaim SimPostgres::duplicate(const Row& row, std::string_view request_id,
                                 std::string_view fingerprint) {
  SinkClaim answer;
  answer.status = SinkStatus::kDuplicate;
  answer.state = row.state;
  answer.fingerprint_matches = fingerprints_match(row.fingerprint, fingerprint);
  answer.same_request = row.request_id == request_id;
  answer.response = row.response;
  if (row.state == RecordState::kCompleted && !row.response) {
    answer.response_sha256 = "sha256-of-a-response-over-the-cap";
  }
  return answer;
}

SinkClaim SimPostgres::claim(std::string_view key, std::string_view request_id,
                             std::string_view fingerprint, std::string_view owner_token) {
  if (const Row* row = live(key)) return duplicate(*row, request_id, fingerprint);
  if (locks_.contains(key)) {
    SinkClaim busy;
    busy.status = SinkStatus::kInProgress;  // the lock_timeout ran out at once
    return busy;
  }
  rows_.insert_or_assign(
      std::string(key),
      Row{std::string(request_id), std::string(owner_token.empty() ? request_id : owner_token),
          std::string(fingerprint), RecordState::kInProgress, std::nullopt,
          now_ + options_.lease.count()});
  return SinkClaim{};
}

bool SimPostgres::complete(std::string_view key, std::string_view owner, std::string_view response,
                           std::chrono::milliseconds retention) {
  const auto found = rows_.find(key);
  if (found == rows_.end() || found->second.expires <= now_ ||
      found->second.state != RecordState::kInProgress || found->second.owner != owner) {
    return false;
  }
  finish(found->second, response, retention);
  return true;
}

void SimPostgres::finish(Row& row, std::string_view response, std::chrono::milliseconds ttl) const {
  row.state = RecordState::kCompleted;
  row.response.reset();
  if (response.size() <= options_.max_response_bytes) row.response = std::string(response);
  row.expires = now_ + (ttl.count() > 0 ? ttl : options_.retention).count();
}

bool SimPostgres::release(std::string_view key, std::string_view owner) {
  const auto found = rows_.find(key);
  if (found == rows_.end() || found->second.expires <= now_ ||
      found->second.state != RecordState::kInProgress || found->second.owner != owner) {
    return false;
  }
  rows_.erase(found);
  return true;
}

bool SimPostgres::renew(std::string_view key, std::string_view owner,
                        std::chrono::milliseconds lease) {
  const auto found = rows_.find(key);
  if (found == rows_.end() || found->second.expires <= now_ ||
      found->second.state != RecordState::kInProgress || found->second.owner != owner) {
    return false;
  }
  const Time until = now_ + (lease.count() > 0 ? lease : options_.lease).count();
  found->second.expires = std::max(found->second.expires, until);
  return true;
}

void SimPostgres::write_effect_now(Effect effect) {
  effect.committed_at = now_;
  ledger_.push_back(std::move(effect));
}

SimPostgres::TxId SimPostgres::begin() {
  const TxId tx = next_tx_++;
  open_.emplace(tx, Tx{});
  return tx;
}

std::optional<SinkClaim> SimPostgres::claim(TxId tx, std::string_view key,
                                            std::string_view request_id,
                                            std::string_view fingerprint,
                                            std::chrono::milliseconds ttl, TxId* blocker) {
  Tx& staged = open_.at(tx);
  if (const auto lock = locks_.find(key); lock != locks_.end() && lock->second != tx) {
    *blocker = lock->second;
    return std::nullopt;
  }
  if (const Row* row = live(key)) return duplicate(*row, request_id, fingerprint);
  (void)ttl;  // the row's retention is set by complete(); an unfinished claim holds the lease
  staged.rows.insert_or_assign(
      std::string(key),
      Row{std::string(request_id), std::string(request_id), std::string(fingerprint),
          RecordState::kInProgress, std::nullopt, now_ + options_.lease.count()});
  locks_.insert_or_assign(std::string(key), tx);
  return SinkClaim{};
}

void SimPostgres::complete(TxId tx, std::string_view key, std::string_view response,
                           std::chrono::milliseconds ttl) {
  Tx& staged = open_.at(tx);
  const auto found = staged.rows.find(key);
  if (found == staged.rows.end()) return;  // PgSink's UPDATE finds no row of this transaction
  finish(found->second, response, ttl);
}

void SimPostgres::write_effect(TxId tx, Effect effect) {
  open_.at(tx).effects.push_back(std::move(effect));
}

SimPostgres::BusinessWrite SimPostgres::write_unique_effect(TxId tx, Effect effect, TxId* blocker) {
  if (const auto lock = effect_locks_.find(effect.logical);
      lock != effect_locks_.end() && lock->second != tx) {
    *blocker = lock->second;
    return BusinessWrite::kBlocked;
  }
  if (!effects_of(effect.logical).empty()) return BusinessWrite::kDuplicate;
  effect_locks_.insert_or_assign(effect.logical, tx);
  write_effect(tx, std::move(effect));
  return BusinessWrite::kWritten;
}

void SimPostgres::unlock(TxId tx, const Tx& staged) {
  for (const Effect& effect : staged.effects) {
    if (const auto lock = effect_locks_.find(effect.logical);
        lock != effect_locks_.end() && lock->second == tx) {
      effect_locks_.erase(lock);
    }
  }
  for (const auto& [key, row] : staged.rows) {
    if (const auto lock = locks_.find(key); lock != locks_.end() && lock->second == tx) {
      locks_.erase(lock);
    }
  }
}

void SimPostgres::commit(TxId tx) {
  auto found = open_.find(tx);
  Tx staged = std::move(found->second);
  open_.erase(found);
  unlock(tx, staged);
  for (Effect& effect : staged.effects) {
    effect.committed_at = now_;
    if (const auto row = staged.rows.find(effect.key); row != staged.rows.end()) {
      effect.row_expires = row->second.expires;
    }
    ledger_.push_back(std::move(effect));
  }
  for (auto& [key, row] : staged.rows) rows_.insert_or_assign(key, std::move(row));
}

void SimPostgres::rollback(TxId tx) {
  const auto found = open_.find(tx);
  if (found == open_.end()) return;
  unlock(tx, found->second);
  open_.erase(found);
}

std::size_t SimPostgres::abort_all() {
  const std::size_t aborted = open_.size();
  open_.clear();
  locks_.clear();
  effect_locks_.clear();
  return aborted;
}

std::optional<SimPostgres::View> SimPostgres::row(std::string_view key) const {
  const Row* found = live(key);
  if (found == nullptr) return std::nullopt;
  return View{found->owner, found->state, found->response, found->expires};
}

std::vector<const Effect*> SimPostgres::effects_of(int logical) const {
  std::vector<const Effect*> found;
  for (const Effect& effect : ledger_) {
    if (effect.logical == logical) found.push_back(&effect);
  }
  return found;
}

}  // namespace idem::sim
