#include "idem/request_id.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <simdjson.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "common/json_pointer.h"
#include "fingerprint/json_validator.h"
#include "idem/errors.h"

namespace idem {
namespace {

constexpr bool is_request_id_char(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '~' || c == ':' || c == '-';
}

constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }
constexpr bool is_lcalpha(char c) noexcept { return c >= 'a' && c <= 'z'; }
constexpr bool is_alpha(char c) noexcept { return is_lcalpha(c) || (c >= 'A' && c <= 'Z'); }

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

// RFC 9651 §4.2 parser for one Item whose bare item must be a String. The other bare-item
// types are parsed only where parameters may hold them.
class SfItemParser {
 public:
  explicit SfItemParser(std::string_view in) noexcept : in_(in) {}

  std::optional<std::string> string_item() {
    skip_spaces();
    std::optional<std::string> value = string();
    if (!value || !parameters()) return std::nullopt;
    skip_spaces();
    if (pos_ != in_.size()) return std::nullopt;
    return value;
  }

 private:
  [[nodiscard]] bool at(char c) const noexcept { return pos_ < in_.size() && in_[pos_] == c; }
  [[nodiscard]] char peek() const noexcept { return pos_ < in_.size() ? in_[pos_] : '\0'; }
  void skip_spaces() noexcept {
    while (at(' ')) ++pos_;
  }

  // §4.2.5
  std::optional<std::string> string() {
    if (!at('"')) return std::nullopt;
    ++pos_;
    std::string out;
    while (pos_ < in_.size()) {
      const char c = in_[pos_++];
      if (c == '"') return out;
      if (c == '\\') {
        if (!at('"') && !at('\\')) return std::nullopt;
        out.push_back(in_[pos_++]);
      } else if (c < 0x20 || c > 0x7e) {
        return std::nullopt;
      } else {
        out.push_back(c);
      }
    }
    return std::nullopt;  // no closing quote
  }

  // §4.2.3.2
  bool parameters() {
    while (at(';')) {
      ++pos_;
      skip_spaces();
      if (!key()) return false;
      if (at('=')) {
        ++pos_;
        if (!bare_item()) return false;
      }
    }
    return true;
  }

  // §4.2.3.3
  bool key() noexcept {
    if (!is_lcalpha(peek()) && !at('*')) return false;
    while (is_lcalpha(peek()) || is_digit(peek()) || at('_') || at('-') || at('.') || at('*')) {
      ++pos_;
    }
    return true;
  }

  // §4.2.3.1
  bool bare_item() {
    const char c = peek();
    if (c == '-' || is_digit(c)) return number();
    if (c == '"') return string().has_value();
    if (c == '*' || is_alpha(c)) return token();
    if (c == ':') return byte_sequence();
    if (c == '?') return boolean();
    if (c == '@') return date();
    if (c == '%') return display_string();
    return false;
  }

  // §4.2.4: up to 15 integer digits, or up to 12 digits '.' 1–3 digits.
  bool number() noexcept {
    if (at('-')) ++pos_;
    const std::size_t start = pos_;
    while (is_digit(peek())) ++pos_;
    const std::size_t int_digits = pos_ - start;
    if (int_digits == 0) return false;
    if (!at('.')) return int_digits <= 15;
    ++pos_;
    const std::size_t frac_start = pos_;
    while (is_digit(peek())) ++pos_;
    const std::size_t frac_digits = pos_ - frac_start;
    return int_digits <= 12 && frac_digits >= 1 && frac_digits <= 3;
  }

  // §4.2.6: tchar / ":" / "/" after a leading ALPHA or "*".
  bool token() noexcept {
    ++pos_;
    static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~:/";
    while (is_alpha(peek()) || is_digit(peek()) ||
           (pos_ < in_.size() && kExtra.find(in_[pos_]) != std::string_view::npos)) {
      ++pos_;
    }
    return true;
  }

  // §4.2.7
  bool byte_sequence() noexcept {
    ++pos_;
    while (is_alpha(peek()) || is_digit(peek()) || at('+') || at('/') || at('=')) ++pos_;
    if (!at(':')) return false;
    ++pos_;
    return true;
  }

  // §4.2.8
  bool boolean() noexcept {
    ++pos_;
    if (!at('0') && !at('1')) return false;
    ++pos_;
    return true;
  }

  // §4.2.9: "@" and an Integer.
  bool date() noexcept {
    ++pos_;
    const std::size_t start = pos_;
    return number() && in_.substr(start, pos_ - start).find('.') == std::string_view::npos;
  }

  // §4.2.10: '%' '"', printable ASCII with '%' and '"' written as %xx (lowercase hex), '"'; the
  // bytes it decodes to are UTF-8.
  bool display_string() {
    ++pos_;
    if (!at('"')) return false;
    ++pos_;
    std::string bytes;
    const auto hex = [](char c) -> int {
      if (is_digit(c)) return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    while (pos_ < in_.size()) {
      const char c = in_[pos_++];
      if (c == '"') return simdjson::validate_utf8(bytes.data(), bytes.size());
      if (c < 0x20 || c > 0x7e) return false;
      if (c != '%') {
        bytes.push_back(c);
        continue;
      }
      if (pos_ + 2 > in_.size()) return false;
      const int high = hex(in_[pos_]);
      const int low = hex(in_[pos_ + 1]);
      if (high < 0 || low < 0) return false;
      bytes.push_back(static_cast<char>(high << 4 | low));
      pos_ += 2;
    }
    return false;  // no closing quote
  }

  std::string_view in_;
  std::size_t pos_ = 0;
};

constexpr std::array<RequestIdHeader, 4> kHeaderPrecedence = {
    RequestIdHeader::kIdempotencyKey, RequestIdHeader::kXIdempotencyKey,
    RequestIdHeader::kXRequestId, RequestIdHeader::kFcRequestId};

std::string default_generate() {
  static Uuid7Generator generator;
  return generator.next();
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

std::string request_id_or_digest(std::string_view raw) {
  if (is_valid_request_id(raw)) return std::string(raw);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int digest_len = 0;
  if (EVP_Digest(raw.data(), raw.size(), digest.data(), &digest_len, EVP_sha256(), nullptr) != 1) {
    throw Error("idem: OpenSSL SHA-256 failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256~";
  for (std::size_t i = 0; i < 16; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0x0f]);
  }
  return out;
}

std::optional<std::string> parse_sf_string(std::string_view value) {
  return SfItemParser(value).string_item();
}

std::string format_sf_string(std::string_view value) {
  std::string out = "\"";
  for (const char c : value) {
    if (c < 0x20 || c > 0x7e) {
      throw InvalidRequestId("idem: an sf-string holds only bytes 0x20-0x7E (value not echoed)");
    }
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

struct Uuid7Generator::State {
  explicit State(std::shared_ptr<Clock> c) : clock(c ? std::move(c) : system_clock()) {}

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

  std::shared_ptr<Clock> clock;
  std::mutex mu;
  std::int64_t last_ms = 0;
  std::uint64_t counter = 0;  // 42 bits: rand_a (12) and the top 30 bits of rand_b
  std::array<unsigned char, 512> random{};
  std::size_t random_pos = random.size();
};

namespace {
constexpr std::uint64_t kUuidCounterMax = (std::uint64_t{1} << 42) - 1;
}  // namespace

Uuid7Generator::Uuid7Generator(std::shared_ptr<Clock> clock)
    : state_(std::make_unique<State>(std::move(clock))) {}
Uuid7Generator::~Uuid7Generator() = default;

std::string Uuid7Generator::next() {
  std::array<unsigned char, 16> b{};
  {
    std::lock_guard lock(state_->mu);
    const std::int64_t now = state_->clock->now_ms();
    // A fresh millisecond seeds the counter with random bits but leaves its top bit clear, so
    // at least 2^41 increments fit before it overflows (RFC 9562 §6.2, method 1).
    if (now > state_->last_ms) {
      state_->last_ms = now;
      state_->counter = state_->random64() & (kUuidCounterMax >> 1);
    } else if (state_->counter == kUuidCounterMax) {
      ++state_->last_ms;  // carry into the timestamp rather than repeat or go back
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

std::string_view header_name(RequestIdHeader header) noexcept {
  switch (header) {
    case RequestIdHeader::kIdempotencyKey:
      return "Idempotency-Key";
    case RequestIdHeader::kXIdempotencyKey:
      return "X-Idempotency-Key";
    case RequestIdHeader::kXRequestId:
      return "X-Request-ID";
    case RequestIdHeader::kFcRequestId:
      return "x-fc-request-id";
  }
  return "";
}

std::optional<InboundRequestId> extract_request_id(const Headers& headers,
                                                   const std::function<std::string()>& generate) {
  for (const RequestIdHeader source : kHeaderPrecedence) {
    const std::string_view name = header_name(source);
    const std::string* value = nullptr;
    int fields = 0;
    for (const auto& header : headers) {
      if (iequals(header.first, name)) {
        value = &header.second;
        ++fields;
      }
    }
    if (fields == 0) continue;
    if (source == RequestIdHeader::kXRequestId) {
      if (fields == 1 && is_valid_request_id(*value))
        return InboundRequestId{*value, source, false};
      std::string id = generate ? generate() : default_generate();
      if (!is_valid_request_id(id)) {  // the server's generator, not the client, is at fault
        throw ConfigError(
            "idem: the generate callback of extract_request_id() returned an "
            "invalid request ID (value not echoed)");
      }
      return InboundRequestId{std::move(id), source, true};
    }
    if (fields > 1) {
      throw InvalidRequestId("idem: more than one " + std::string(name) + " header");
    }
    if (source == RequestIdHeader::kIdempotencyKey) {
      std::optional<std::string> id = parse_sf_string(*value);
      if (!id) throw InvalidRequestId("idem: Idempotency-Key is not an RFC 9651 sf-string");
      validate_request_id(*id);
      return InboundRequestId{std::move(*id), source, false};
    }
    validate_request_id(*value);
    return InboundRequestId{*value, source, false};
  }
  return std::nullopt;
}

std::optional<std::string> request_id_from_headers(const Headers& headers) {
  std::optional<InboundRequestId> inbound = extract_request_id(headers);
  if (!inbound) return std::nullopt;
  return std::move(inbound->id);
}

void inject_request_id(Headers& headers, std::string_view id, RequestIdHeader header) {
  validate_request_id(id);
  const std::string_view name = header_name(header);
  std::erase_if(headers, [name](const auto& field) { return iequals(field.first, name); });
  headers.emplace_back(std::string(name), header == RequestIdHeader::kIdempotencyKey
                                              ? format_sf_string(id)
                                              : std::string(id));
}

// ---- JSON payloads -------------------------------------------------------------------------

namespace {

namespace ondemand = simdjson::ondemand;

// RFC 6901 reference tokens of `pointer`, unescaped; the whole document ("") is no request ID.
std::vector<std::string> pointer_tokens(std::string_view pointer) {
  if (pointer.empty()) {
    throw ConfigError("idem: a request-ID JSON Pointer must start with '/' (RFC 6901)");
  }
  return detail::parse_json_pointer(pointer);
}

// What sits at a JSON Pointer, with byte offsets into the payload.
struct JsonTarget {
  enum class Kind {
    kAbsent,         // the path does not exist
    kMissingMember,  // the parent object exists, the last member does not
    kScalar,         // a string, number, boolean or null
    kContainer,      // an object or array
  };
  Kind kind = Kind::kAbsent;
  std::size_t begin = 0;      // kScalar: first byte; kMissingMember: just after the '{'
  std::size_t end = 0;        // kScalar: one past the last byte
  bool empty_parent = false;  // kMissingMember: the parent object has no member
  bool is_null = false;
  std::optional<std::string> string;  // the unescaped value when it is a string
};

// Walks a JSON Pointer with simdjson On Demand, reading every member of each object on the
// path so a duplicate name is an error rather than a silent first-wins.
class JsonLocator {
 public:
  JsonLocator(const simdjson::padded_string& json, const std::vector<std::string>& tokens)
      : json_(json), tokens_(tokens) {}

  JsonTarget locate(ondemand::document& doc) {
    const auto root_start =
        std::string_view(json_.data(), json_.size()).find_first_not_of(" \t\r\n");
    switch (doc.type()) {
      case ondemand::json_type::object:
        return in_object(doc.get_object(), root_start, 0);
      case ondemand::json_type::array:
        return in_array(doc.get_array(), 0);
      default:
        return {};
    }
  }

 private:
  std::size_t offset(std::string_view token) const noexcept {
    return static_cast<std::size_t>(token.data() - json_.data());
  }

  JsonTarget in_value(ondemand::value value, std::size_t depth) {
    if (depth == tokens_.size()) return leaf(value);
    switch (value.type()) {
      case ondemand::json_type::object: {
        const std::size_t open = offset(value.raw_json_token());
        return in_object(value.get_object(), open, depth);
      }
      case ondemand::json_type::array:
        return in_array(value.get_array(), depth);
      default:
        return {};
    }
  }

  JsonTarget in_object(ondemand::object object, std::size_t open, std::size_t depth) {
    JsonTarget found;
    bool matched = false;
    bool empty = true;
    for (auto field : object) {
      empty = false;
      if (std::string_view(field.unescaped_key()) != tokens_[depth]) continue;
      if (matched) throw PayloadError("duplicate member name on the request-ID path");
      matched = true;
      found = in_value(field.value(), depth + 1);
    }
    if (!matched && depth + 1 == tokens_.size()) {
      found.kind = JsonTarget::Kind::kMissingMember;
      found.begin = open + 1;
      found.empty_parent = empty;
    }
    return found;
  }

  JsonTarget in_array(ondemand::array array, std::size_t depth) {
    const std::string& token = tokens_[depth];
    const bool is_index = !token.empty() &&
                          token.find_first_not_of("0123456789") == std::string::npos &&
                          (token == "0" || token.front() != '0');
    JsonTarget found;
    std::size_t index = 0;
    for (auto element : array) {
      if (is_index && token == std::to_string(index)) found = in_value(element.value(), depth + 1);
      ++index;
    }
    return found;
  }

  JsonTarget leaf(ondemand::value value) {
    JsonTarget target;
    const ondemand::json_type type = value.type();
    if (type == ondemand::json_type::object || type == ondemand::json_type::array) {
      target.kind = JsonTarget::Kind::kContainer;
      return target;
    }
    std::string_view token = value.raw_json_token();
    token = token.substr(0, token.find_last_not_of(" \t\r\n") + 1);
    target.kind = JsonTarget::Kind::kScalar;
    target.begin = offset(token);
    target.end = target.begin + token.size();
    target.is_null = type == ondemand::json_type::null;
    if (type == ondemand::json_type::string)
      target.string = std::string(std::string_view(value.get_string()));
    return target;
  }

  const simdjson::padded_string& json_;
  const std::vector<std::string>& tokens_;
};

// simdjson's default nesting limit: deeper payloads are invalid here.
constexpr std::size_t kMaxJsonDepth = 1024;

// Validates `payload` in full (DOM parse) and locates `pointer` in it. A payload that is not
// valid JSON, or has a duplicate member name on the path, throws the idem::PayloadError the
// fingerprint layer (and so the facade) throws for it: the same message and byte offset.
JsonTarget locate_in_json(std::string_view payload, std::string_view pointer) {
  const std::vector<std::string> tokens = pointer_tokens(pointer);
  const simdjson::padded_string json(payload);
  thread_local simdjson::dom::parser validator;
  thread_local ondemand::parser parser;
  if (const auto error = validator.parse(json).error()) {
    detail::throw_payload_error(
        payload, kMaxJsonDepth,
        std::string("invalid JSON payload: ") + simdjson::error_message(error));
  }
  try {
    ondemand::document doc = parser.iterate(json);
    return JsonLocator(json, tokens).locate(doc);
  } catch (const simdjson::simdjson_error& e) {
    detail::throw_payload_error(payload, kMaxJsonDepth,
                                std::string("invalid JSON payload: ") + e.what());
  } catch (const PayloadError& e) {  // the locator knows what, not where
    detail::throw_payload_error(payload, kMaxJsonDepth, e.what());
  }
}

// `text` as a JSON string literal (RFC 8259 §7); bytes >= 0x80 pass through.
std::string json_quote(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte < 0x20) {
      out += "\\u00";
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0x0f]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace

std::optional<std::string> request_id_from_json(std::string_view payload,
                                                std::string_view pointer) {
  JsonTarget target = locate_in_json(payload, pointer);
  if (target.kind == JsonTarget::Kind::kAbsent || target.kind == JsonTarget::Kind::kMissingMember ||
      target.is_null) {
    return std::nullopt;
  }
  if (!target.string) throw InvalidRequestId("idem: the request-ID member is not a string");
  validate_request_id(*target.string);
  return std::move(target.string);
}

std::string inject_request_id_json(std::string_view payload, std::string_view id,
                                   std::string_view pointer) {
  validate_request_id(id);
  const JsonTarget target = locate_in_json(payload, pointer);
  const std::string value = json_quote(id);
  std::string out;
  out.reserve(payload.size() + value.size() + 16);
  switch (target.kind) {
    case JsonTarget::Kind::kScalar:
      out.append(payload.substr(0, target.begin)).append(value).append(payload.substr(target.end));
      return out;
    case JsonTarget::Kind::kMissingMember: {
      const std::vector<std::string> tokens = pointer_tokens(pointer);
      out.append(payload.substr(0, target.begin))
          .append(json_quote(tokens.back()))
          .append(":")
          .append(value)
          .append(target.empty_parent ? "" : ",")
          .append(payload.substr(target.begin));
      return out;
    }
    case JsonTarget::Kind::kContainer:
      throw PayloadError("idem: the request-ID member holds an object or array");
    case JsonTarget::Kind::kAbsent:
      break;
  }
  throw PayloadError("idem: the request-ID member's parent is not in the payload");
}

}  // namespace idem
