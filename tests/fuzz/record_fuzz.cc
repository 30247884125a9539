// libFuzzer target for the guard's record decoder (src/guard/record.h), which reads whatever
// value sits under an idem key in Redis. For every input:
//   - decode_record() returns a record or throws idem::ForeignRecord; nothing else, no crash,
//     no sanitizer report, no read outside the input;
//   - a decoded record has a 32-hex owner token, and encoding it again decodes to the same
//     record (a completed record the way complete.lua writes it);
//   - split into an owner, a request ID and a fingerprint, the input's bytes survive
//     encode_claim() -> decode_record() unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "guard/record.h"
#include "idem/errors.h"

namespace {

using idem::detail::StoredRecord;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "record_fuzz: %s\n", what);
    std::abort();
  }
}

bool same(const StoredRecord& a, const StoredRecord& b) {
  return a.state == b.state && a.owner_token == b.owner_token && a.request_id == b.request_id &&
         a.fingerprint == b.fingerprint && a.response == b.response &&
         a.response_sha256 == b.response_sha256;
}

// The record as idem writes it: encode_claim(), then for a completed one what complete.lua
// writes ('1C' + owner and fields + the response field).
std::string encode(const StoredRecord& record) {
  std::string claim =
      idem::detail::encode_claim(record.owner_token, record.request_id, record.fingerprint);
  if (record.state == idem::RecordState::kInProgress) return claim;
  claim.pop_back();  // the '-' of "no response"
  std::string response = "-";
  if (record.response) response = "B" + *record.response;
  if (record.response_sha256) response = "H" + *record.response_sha256;
  return "1C" + claim.substr(2) + response;
}

void decode_any(std::string_view input) {
  StoredRecord record;
  try {
    record = idem::detail::decode_record(input);
  } catch (const idem::ForeignRecord&) {
    return;
  }
  check(record.owner_token.size() == idem::detail::kOwnerTokenSize, "owner token size");
  check(record.owner_token.find_first_not_of("0123456789abcdef") == std::string::npos,
        "owner token is lowercase hex");
  check(!(record.response && record.response_sha256), "a body and a hash at once");
  check(record.state == idem::RecordState::kCompleted ||
            (!record.response && !record.response_sha256),
        "an in-progress record with a response");
  check(same(idem::detail::decode_record(encode(record)), record), "re-encoding round trip");
}

void claim_round_trip(std::string_view input) {
  const std::string owner = "00112233445566778899aabbccddeeff";
  const std::size_t half = input.size() / 2;
  const std::string request_id(input.substr(0, half));
  const std::string fingerprint(input.substr(half));
  const StoredRecord record =
      idem::detail::decode_record(idem::detail::encode_claim(owner, request_id, fingerprint));
  check(record.owner_token == owner && record.request_id == request_id &&
            record.fingerprint == fingerprint && record.state == idem::RecordState::kInProgress,
        "encode_claim round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  decode_any(input);
  claim_round_trip(input);
  return 0;
}
