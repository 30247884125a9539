#include "guard/record.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <charconv>

#include "idem/errors.h"

namespace idem::detail {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

std::string to_hex(const unsigned char* data, std::size_t size) {
  std::string out(size * 2, '\0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = kHexDigits[data[i] >> 4];
    out[2 * i + 1] = kHexDigits[data[i] & 0x0F];
  }
  return out;
}

void append_field(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

[[noreturn]] void malformed(std::string_view why) {
  throw ForeignRecord("idem: the value under the key is not an idem record (" + std::string(why) +
                      ")");
}

bool lower_hex(std::string_view text) {
  return text.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Reads one "<len>:<bytes>" field at `pos`, advancing it.
std::string read_field(std::string_view value, std::size_t& pos) {
  const std::size_t colon = value.find(':', pos);
  if (colon == std::string_view::npos) malformed("missing length");
  std::size_t size = 0;
  const auto [end, ec] = std::from_chars(value.data() + pos, value.data() + colon, size);
  if (ec != std::errc() || end != value.data() + colon || colon == pos) malformed("bad length");
  if (size > value.size() - colon - 1) malformed("truncated field");
  pos = colon + 1 + size;
  return std::string(value.substr(colon + 1, size));
}

// `tag` followed by `body`. (Not `"B" + std::string(...)`: GCC 12 at -O3 reports a false
// -Wrestrict on that form.)
std::string tagged(char tag, std::string_view body) {
  std::string out;
  out.reserve(1 + body.size());
  out.push_back(tag);
  out.append(body);
  return out;
}

}  // namespace

std::string encode_claim(std::string_view owner_token, std::string_view request_id,
                         std::string_view fingerprint) {
  std::string out = "1I";
  out.reserve(2 + owner_token.size() + request_id.size() + fingerprint.size() + 16);
  out += owner_token;
  append_field(out, request_id);
  append_field(out, fingerprint);
  out += '-';
  return out;
}

std::string encode_response(std::string_view response, std::size_t max_bytes) {
  if (response.size() <= max_bytes) return tagged('B', response);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  if (EVP_Digest(response.data(), response.size(), digest.data(), &size, EVP_sha256(), nullptr) !=
      1) {
    throw Error("idem: SHA-256 of the response failed");
  }
  return tagged('H', to_hex(digest.data(), size));
}

StoredRecord decode_record(std::string_view value) {
  constexpr std::size_t kHeader = 2 + kOwnerTokenSize;
  if (value.size() < kHeader || value[0] != '1') malformed("unknown version");
  StoredRecord record;
  if (value[1] == 'I') {
    record.state = RecordState::kInProgress;
  } else if (value[1] == 'C') {
    record.state = RecordState::kCompleted;
  } else {
    malformed("unknown state");
  }
  record.owner_token = std::string(value.substr(2, kOwnerTokenSize));
  if (!lower_hex(record.owner_token)) malformed("bad owner token");
  std::size_t pos = kHeader;
  record.request_id = read_field(value, pos);
  record.fingerprint = read_field(value, pos);
  if (pos >= value.size()) malformed("missing response");
  // idem writes "-" with IN_PROGRESS only, a body or a hash with COMPLETED only.
  if ((value[pos] == '-') != (record.state == RecordState::kInProgress)) {
    malformed("response does not fit the state");
  }
  const std::string_view rest = value.substr(pos + 1);
  switch (value[pos]) {
    case '-':
      if (!rest.empty()) malformed("bytes after the end");
      break;
    case 'B':
      record.response = std::string(rest);
      break;
    case 'H':
      if (rest.size() != 64 || !lower_hex(rest)) malformed("bad response hash");
      record.response_sha256 = std::string(rest);
      break;
    default:
      malformed("unknown response kind");
  }
  return record;
}

std::string encode_step(const JournaledStep& step) {
  std::string out;
  out.reserve(step.input_fingerprint.size() + step.result.size() + 4);
  append_field(out, step.input_fingerprint);
  out += step.result;
  return out;
}

JournaledStep decode_step(std::string_view value) {
  std::size_t pos = 0;
  JournaledStep step;
  step.input_fingerprint = read_field(value, pos);
  step.result = std::string(value.substr(pos));
  return step;
}

namespace {

// Bumped in a forked child, whose copies of the threads' random buffers must never be used:
// parent and child would hand out the same tokens.
std::atomic<std::uint64_t> fork_generation{0};

// Each thread's random bytes, drawn from OpenSSL's CSPRNG a few kilobytes at a time: one
// RAND_bytes per 256 tokens instead of one per token (each costs a DRBG round).
struct RandomBuffer {
  std::array<unsigned char, 4096> bytes{};
  std::size_t used = bytes.size();
  std::uint64_t generation = 0;

  const unsigned char* take(std::size_t n) {
    const std::uint64_t now = fork_generation.load(std::memory_order_relaxed);
    if (used + n > bytes.size() || generation != now) {
      if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
        throw Error("idem: the CSPRNG failed to produce an owner token");
      }
      used = 0;
      generation = now;
    }
    const unsigned char* taken = bytes.data() + used;
    used += n;
    return taken;
  }
};

}  // namespace

std::string new_owner_token() {
  static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr,
                          [] { fork_generation.fetch_add(1, std::memory_order_relaxed); }) == 0;
  }();
  (void)registered;
  thread_local RandomBuffer buffer;
  return to_hex(buffer.take(kOwnerTokenSize / 2), kOwnerTokenSize / 2);
}

}  // namespace idem::detail
