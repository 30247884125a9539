#include "idem/snowflake.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <array>
#include <charconv>

#include "idem/errors.h"
#include "idem/worker_lease.h"

namespace idem {
namespace {

constexpr int kSequenceBits = 12;
constexpr int kWorkerBits = 10;
constexpr std::uint64_t kSequenceMask = (std::uint64_t{1} << kSequenceBits) - 1;
constexpr std::int64_t kTimestampLimit = std::int64_t{1} << 41;  // exclusive

constexpr std::string_view kCrockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

// Value of a Crockford base32 character, or -1.
constexpr int crockford_value(char c) noexcept {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  if (c == 'O') return 0;
  if (c == 'I' || c == 'L') return 1;
  const auto pos = kCrockford.find(c);
  return pos == std::string_view::npos ? -1 : static_cast<int>(pos);
}

// Appends `chars` base32 characters of the low 5*chars bits of `value`, most significant first.
void append_base32(std::string& out, std::uint64_t value, int chars) {
  for (int i = chars - 1; i >= 0; --i) out.push_back(kCrockford[(value >> (5 * i)) & 0x1f]);
}

}  // namespace

namespace {

std::int32_t leased_worker_id(const SnowflakeOptions& options) {
  if (options.lease == nullptr || options.worker_id == options.lease->worker_id()) {
    return options.worker_id;
  }
  if (options.worker_id != -1) {
    throw ConfigError("idem: Snowflake worker_id differs from its lease's worker ID");
  }
  return options.lease->worker_id();
}

}  // namespace

SnowflakeGenerator::SnowflakeGenerator(SnowflakeOptions options)
    : worker_id_(leased_worker_id(options)),
      epoch_(options.epoch),
      max_backward_wait_(options.max_backward_wait),
      clock_(options.clock ? std::move(options.clock) : system_clock()),
      lease_(std::move(options.lease)) {
  if (worker_id_ < 0 || worker_id_ > kMaxSnowflakeWorkerId) {
    throw ConfigError("idem: Snowflake worker_id must be given, in 0..1023");
  }
  if (max_backward_wait_.count() < 0) {
    throw ConfigError("idem: Snowflake max_backward_wait must not be negative");
  }
  const std::int64_t since_epoch = clock_->now_ms() - epoch_.count();
  if (epoch_.count() < 0 || since_epoch < 0 || since_epoch >= kTimestampLimit) {
    throw ConfigError(
        "idem: Snowflake epoch must be >= 0, not in the future, and less than 2^41 ms ago");
  }
  // Last: a generator refused for another reason leaves the lease free for a correct one.
  if (lease_ != nullptr && !lease_->bind_generator()) {
    throw ConfigError(
        "idem: this WorkerIdLease already serves a SnowflakeGenerator: two generators on one "
        "worker ID issue the same IDs");
  }
}

std::uint64_t SnowflakeGenerator::next() {
  bool waited_for_clock = false;
  // The state is loaded before the clock is read, so a reading behind the state means the
  // clock really stepped back, not that another thread got a newer reading first.
  std::uint64_t last = last_.load(std::memory_order_acquire);
  for (;;) {
    const std::int64_t now_unix = clock_->now_ms();
    if (lease_ != nullptr && now_unix >= lease_->valid_until_ms()) {
      const bool lost = lease_->valid_until_ms() == 0;
      throw RedisError(lost ? "idem: the worker-ID lease was taken by another owner"
                            : "idem: the worker-ID lease was not renewed in time",
                       !lost);
    }
    const std::int64_t now = now_unix - epoch_.count();
    const auto last_ms = static_cast<std::int64_t>(last >> kSequenceBits);
    std::uint64_t candidate = 0;
    if (now > last_ms) {
      if (now >= kTimestampLimit) throw Error("idem: Snowflake 41-bit timestamp exhausted");
      candidate = static_cast<std::uint64_t>(now) << kSequenceBits;
    } else if (now == last_ms && (last & kSequenceMask) != kSequenceMask) {
      candidate = last + 1;
    } else if (now == last_ms) {  // 4096 IDs this millisecond: wait for the next one
      clock_->wait_until_ms(epoch_.count() + last_ms + 1);
      last = last_.load(std::memory_order_acquire);
      continue;
    } else {
      if (waited_for_clock || last_ms - now > max_backward_wait_.count()) {
        throw ClockMovedBackwards("idem: clock is " + std::to_string(last_ms - now) +
                                  " ms behind the last Snowflake ID (tolerance " +
                                  std::to_string(max_backward_wait_.count()) + " ms)");
      }
      clock_->wait_until_ms(epoch_.count() + last_ms);
      waited_for_clock = true;
      last = last_.load(std::memory_order_acquire);
      continue;
    }
    if (last_.compare_exchange_weak(last, candidate, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      const std::uint64_t ms = candidate >> kSequenceBits;
      return (ms << (kWorkerBits + kSequenceBits)) |
             (static_cast<std::uint64_t>(worker_id_) << kSequenceBits) |
             (candidate & kSequenceMask);
    }
  }
}

SnowflakeParts SnowflakeGenerator::decompose(std::uint64_t id,
                                             std::chrono::milliseconds epoch) noexcept {
  return SnowflakeParts{
      .unix_ms = static_cast<std::int64_t>(id >> (kWorkerBits + kSequenceBits)) + epoch.count(),
      .worker_id = static_cast<std::int32_t>((id >> kSequenceBits) & 0x3ff),
      .sequence = static_cast<std::uint32_t>(id & kSequenceMask)};
}

std::string snowflake_to_decimal(std::uint64_t id) { return std::to_string(id); }

std::optional<std::uint64_t> snowflake_from_decimal(std::string_view text) noexcept {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::string snowflake_to_base32(std::uint64_t id) {
  std::string out;
  out.reserve(kSnowflakeBase32Length);
  append_base32(out, id, static_cast<int>(kSnowflakeBase32Length));
  return out;
}

std::optional<std::uint64_t> snowflake_from_base32(std::string_view text) noexcept {
  if (text.size() != kSnowflakeBase32Length) return std::nullopt;
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int digit = crockford_value(text[i]);
    if (digit < 0 || (i == 0 && digit > 0xf)) return std::nullopt;  // 13 chars hold 65 bits
    value = (value << 5) | static_cast<std::uint64_t>(digit);
  }
  return value;
}

SeedIdFormat::SeedIdFormat(std::string key) : key_(std::move(key)) {
  if (key_.size() < kMinKeyBytes) {
    throw ConfigError("idem: SeedIdFormat key must be at least 16 bytes");
  }
}

std::string SeedIdFormat::format(std::uint64_t snowflake, std::string_view user_id) const {
  const std::string_view tail =
      user_id.substr(user_id.size() - std::min<std::size_t>(8, user_id.size()));
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
           reinterpret_cast<const unsigned char*>(tail.data()), tail.size(), mac.data(),
           &mac_len) == nullptr) {
    throw Error("idem: OpenSSL HMAC-SHA-256 failed");
  }
  std::uint64_t user_bits = 0;  // the first 40 bits of the MAC
  for (int i = 0; i < 5; ++i) user_bits = (user_bits << 8) | mac[i];
  std::string out = snowflake_to_base32(snowflake);
  out.reserve(kLength);
  append_base32(out, user_bits, 8);
  return out;
}

}  // namespace idem
