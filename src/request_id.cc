#include "idem/request_id.h"

#include <openssl/rand.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "idem/errors.h"

namespace idem {
namespace {

constexpr bool is_request_id_char(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '~' || c == ':' || c == '-';
}

constexpr char to_lower_ascii(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (to_lower_ascii(a[i]) != to_lower_ascii(b[i])) return false;
  }
  return true;
}

std::int64_t unix_ms_now() noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool is_valid_request_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > kMaxRequestIdBytes) return false;
  for (const char c : id) {
    if (!is_request_id_char(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

void validate_request_id(std::string_view id) {
  if (is_valid_request_id(id)) return;
  if (id.empty()) throw InvalidRequestId("idem: request ID is empty");
  if (id.size() > kMaxRequestIdBytes) {
    throw InvalidRequestId("idem: request ID is " + std::to_string(id.size()) +
                           " bytes, more than the limit of 64");
  }
  throw InvalidRequestId(
      "idem: request ID holds a byte outside [A-Za-z0-9._~:-] (value not echoed)");
}

std::optional<std::string> parse_sf_string(std::string_view value) {
  std::size_t pos = 0;
  while (pos < value.size() && value[pos] == ' ') ++pos;
  if (pos == value.size() || value[pos] != '"') return std::nullopt;
  ++pos;
  std::string out;
  for (;;) {
    if (pos == value.size()) return std::nullopt;  // no closing quote
    const auto c = static_cast<unsigned char>(value[pos++]);
    if (c == '"') break;
    if (c == '\\') {
      if (pos == value.size()) return std::nullopt;
      const char escaped = value[pos++];
      if (escaped != '"' && escaped != '\\') return std::nullopt;
      out.push_back(escaped);
    } else if (c < 0x20 || c > 0x7e) {
      return std::nullopt;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  while (pos < value.size() && value[pos] == ' ') ++pos;
  if (pos != value.size()) return std::nullopt;
  return out;
}

struct Uuid7Generator::State {
  std::mutex mu;
  std::int64_t last_ms = 0;
  std::uint64_t counter = 0;  // 42 bits: rand_a (12) and the top 30 bits of rand_b
  std::array<unsigned char, 512> random{};
  std::size_t random_pos = 512;

  std::uint64_t random64() {
    if (random_pos + 8 > random.size()) {
      if (RAND_bytes(random.data(), static_cast<int>(random.size())) != 1) {
        throw Error("idem: OpenSSL RAND_bytes failed");
      }
      random_pos = 0;
    }
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | random[random_pos++];
    return v;
  }
};

namespace {
constexpr std::uint64_t kUuidCounterBits = 42;
constexpr std::uint64_t kUuidCounterMax = (std::uint64_t{1} << kUuidCounterBits) - 1;
}  // namespace

Uuid7Generator::Uuid7Generator() : state_(std::make_unique<State>()) {}
Uuid7Generator::~Uuid7Generator() = default;

std::string Uuid7Generator::next() {
  std::array<unsigned char, 16> b{};
  {
    std::lock_guard lock(state_->mu);
    const std::int64_t now = unix_ms_now();
    // A fresh millisecond seeds the counter with random bits but leaves its top bit clear, so
    // at least 2^41 increments fit before it overflows (RFC 9562 §6.2, method 1).
    if (now > state_->last_ms) {
      state_->last_ms = now;
      state_->counter = state_->random64() & (kUuidCounterMax >> 1);
    } else if (state_->counter == kUuidCounterMax) {
      // Counter exhausted (or the clock went back): borrow from the timestamp, never repeat.
      ++state_->last_ms;
      state_->counter = state_->random64() & (kUuidCounterMax >> 1);
    } else {
      ++state_->counter;
    }
    const auto ms = static_cast<std::uint64_t>(state_->last_ms);
    const std::uint64_t counter = state_->counter;
    const std::uint64_t tail = state_->random64();
    for (int i = 0; i < 6; ++i) b[i] = static_cast<unsigned char>(ms >> (40 - 8 * i));
    b[6] = static_cast<unsigned char>(0x70 | ((counter >> 38) & 0x0f));
    b[7] = static_cast<unsigned char>(counter >> 30);
    b[8] = static_cast<unsigned char>(0x80 | ((counter >> 24) & 0x3f));
    b[9] = static_cast<unsigned char>(counter >> 16);
    b[10] = static_cast<unsigned char>(counter >> 8);
    b[11] = static_cast<unsigned char>(counter);
    for (int i = 0; i < 4; ++i) b[12 + i] = static_cast<unsigned char>(tail >> (8 * i));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[b[i] >> 4]);
    out.push_back(kHex[b[i] & 0x0f]);
  }
  return out;
}

std::optional<std::string> request_id_from_headers(const Headers& headers) {
  const std::pair<std::string, std::string>* idempotency_key = nullptr;
  const std::pair<std::string, std::string>* x_request_id = nullptr;
  for (const auto& header : headers) {
    if (iequals(header.first, "Idempotency-Key")) {
      if (idempotency_key != nullptr) {
        throw InvalidRequestId("idem: more than one Idempotency-Key header");
      }
      idempotency_key = &header;
    } else if (x_request_id == nullptr && iequals(header.first, "X-Request-ID")) {
      x_request_id = &header;
    }
  }
  if (idempotency_key != nullptr) {
    auto id = parse_sf_string(idempotency_key->second);
    if (!id) throw InvalidRequestId("idem: Idempotency-Key is not an RFC 8941 sf-string");
    validate_request_id(*id);
    return id;
  }
  if (x_request_id != nullptr) {
    validate_request_id(x_request_id->second);
    return x_request_id->second;
  }
  return std::nullopt;
}

}  // namespace idem
