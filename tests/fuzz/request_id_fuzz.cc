// libFuzzer target for the request-ID parsers. For every input:
//   - no crash, no sanitizer report; failures are idem::InvalidRequestId / idem::PayloadError;
//   - as an Idempotency-Key: rejected, or a valid request ID; parse_sf_string output round-trips
//     through format_sf_string;
//   - as an X-Request-ID: always a valid ID, the input itself iff it is valid;
//   - request_id_or_digest is always valid;
//   - as a JSON payload: extraction gives nothing or a valid ID; a successful injection gives a
//     payload whose extraction is the injected ID, with the input's bytes before and after the
//     one edited spot unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "idem/errors.h"
#include "idem/request_id.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "request_id_fuzz: %s\n", what);
    std::abort();
  }
}

void headers(const std::string& input) {
  if (const auto sf = idem::parse_sf_string(input)) {
    check(idem::parse_sf_string(idem::format_sf_string(*sf)) == sf, "sf-string round trip");
  }
  try {
    const auto key = idem::extract_request_id({{"Idempotency-Key", input}});
    check(key && idem::is_valid_request_id(key->id) && !key->replaced, "Idempotency-Key");
  } catch (const idem::InvalidRequestId&) {
  }
  const auto rid = idem::extract_request_id({{"X-Request-ID", input}});
  check(rid && idem::is_valid_request_id(rid->id), "X-Request-ID gives a valid ID");
  check(rid->replaced != idem::is_valid_request_id(input), "replaced iff invalid");
  check(rid->replaced || rid->id == input, "a valid X-Request-ID passes unchanged");
  check(idem::is_valid_request_id(idem::request_id_or_digest(input)), "digest is valid");
}

void json(const std::string& input) {
  try {
    const auto id = idem::request_id_from_json(input);
    check(!id || idem::is_valid_request_id(*id), "extracted ID is valid");
  } catch (const idem::InvalidRequestId&) {
  } catch (const idem::PayloadError&) {
  }
  std::string out;
  try {
    out = idem::inject_request_id_json(input, "fz-1");
  } catch (const idem::PayloadError&) {
    return;
  }
  check(idem::request_id_from_json(out) == "fz-1", "injected ID reads back");
  std::size_t prefix = 0;
  while (prefix < input.size() && prefix < out.size() && input[prefix] == out[prefix]) ++prefix;
  std::size_t suffix = 0;
  while (suffix < input.size() - prefix && suffix < out.size() - prefix &&
         input[input.size() - 1 - suffix] == out[out.size() - 1 - suffix]) {
    ++suffix;
  }
  // One contiguous edit: at most `"requestId":"fz-1",` (19 bytes) is new; the rest is the
  // input's bytes before and after the spot.
  check(out.size() - prefix - suffix <= 19, "one contiguous edit");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  headers(input);
  json(input);
  return 0;
}
