#include "fingerprint/embedded_json.h"

#include <openssl/evp.h>
#include <simdjson.h>

#include <algorithm>
#include <optional>
#include <string>

#include "fingerprint/json_validator.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The bytes `text` encodes in base64 (RFC 4648 section 4, padding required; line breaks are
// tolerated, as OpenSSL's decoder does). Throws idem::PayloadError naming `pointer`.
std::string base64_decode(std::string_view text, const std::string& pointer) {
  std::string out(text.size() / 4 * 3 + 3, '\0');
  EVP_ENCODE_CTX* ctx = EVP_ENCODE_CTX_new();
  if (ctx == nullptr) throw Error("idem: out of memory decoding base64");
  EVP_DecodeInit(ctx);
  int written = 0;
  int tail = 0;
  const bool ok =
      EVP_DecodeUpdate(ctx, reinterpret_cast<unsigned char*>(out.data()), &written,
                       reinterpret_cast<const unsigned char*>(text.data()),
                       static_cast<int>(text.size())) >= 0 &&
      EVP_DecodeFinal(ctx, reinterpret_cast<unsigned char*>(out.data()) + written, &tail) == 1;
  EVP_ENCODE_CTX_free(ctx);
  if (!ok || text.size() % 4 != 0) {
    throw PayloadError("idem: the member " + pointer +
                       " is flagged base64 but is not valid base64 (RFC 4648)");
  }
  out.resize(static_cast<std::size_t>(written + tail));
  return out;
}

// The location of the string value at `pointer` in `padded` (its raw token, quotes included),
// and its unescaped text; false when the member is absent or not a non-empty string.
bool find_string(simdjson::ondemand::parser& parser, const simdjson::padded_string& padded,
                 const std::string& pointer, std::string_view& raw, std::string_view& text) {
  simdjson::ondemand::document doc;
  if (parser.iterate(padded).get(doc) != simdjson::SUCCESS) return false;  // the writer says why
  simdjson::ondemand::value value;
  if (doc.at_pointer(pointer).get(value) != simdjson::SUCCESS) return false;
  simdjson::ondemand::json_type type;
  if (value.type().get(type) != simdjson::SUCCESS || type != simdjson::ondemand::json_type::string)
    return false;
  raw = value.raw_json_token();
  while (!raw.empty() && is_json_space(raw.back())) raw.remove_suffix(1);
  if (value.get_string().get(text) != simdjson::SUCCESS) return false;
  return !text.empty();
}

// Whether the member at `flag` (empty: none) is `true`.
bool flagged(simdjson::ondemand::parser& parser, const simdjson::padded_string& padded,
             const std::string& flag) {
  if (flag.empty()) return false;
  simdjson::ondemand::document doc;
  if (parser.iterate(padded).get(doc) != simdjson::SUCCESS) return false;
  bool value = false;
  return doc.at_pointer(flag).get_bool().get(value) == simdjson::SUCCESS && value;
}

// How deep the document at `pointer` may nest: what max_depth leaves below the member (an
// object there is as deep as the pointer has segments, plus one).
std::size_t depth_left(const std::string& pointer, std::size_t max_depth) {
  const auto segments = static_cast<std::size_t>(std::count(pointer.begin(), pointer.end(), '/'));
  return max_depth > segments ? max_depth - segments : 0;
}

[[noreturn]] void throw_not_a_document(const std::string& pointer,
                                       const std::optional<PayloadProblem>& problem) {
  throw PayloadError(
      "idem: the string at " + pointer + " does not hold a JSON document: " +
      (problem ? problem->message + " at byte " + std::to_string(problem->offset) + " of it"
               : std::string("it does not parse")));
}

// Replaces each listed member holding a string by its document, as decode_embedded_json()
// says, after `check(member, document)` accepted the document (it throws when not).
template <class Check>
std::string_view replace_members(std::string_view json, const std::vector<EmbeddedJson>& members,
                                 std::string& buffer, Check&& check) {
  thread_local simdjson::ondemand::parser parser;
  std::string_view current = json;
  std::string next;
  for (const EmbeddedJson& member : members) {
    const simdjson::padded_string padded(current);
    std::string_view raw;
    std::string_view text;
    if (!find_string(parser, padded, member.pointer, raw, text)) continue;
    std::string document = flagged(parser, padded, member.base64_flag)
                               ? base64_decode(text, member.pointer)
                               : std::string(text);
    check(member, document);
    const std::size_t at = static_cast<std::size_t>(raw.data() - padded.data());
    next.clear();
    next.reserve(current.size() - raw.size() + document.size());
    next.append(current.substr(0, at)).append(document).append(current.substr(at + raw.size()));
    buffer.swap(next);
    current = buffer;
  }
  return current;
}

}  // namespace

std::string_view decode_embedded_json(std::string_view json,
                                      const std::vector<EmbeddedJson>& members,
                                      std::size_t max_depth, std::string& buffer) {
  thread_local simdjson::dom::parser validator;
  return replace_members(
      json, members, buffer, [&](const EmbeddedJson& member, const std::string& document) {
        simdjson::dom::element ignored;
        if (validator.parse(document).get(ignored) != simdjson::SUCCESS) {
          throw_not_a_document(
              member.pointer,
              find_payload_problem(document, depth_left(member.pointer, max_depth)));
        }
      });
}

void throw_embedded_payload_error(std::string_view json, const std::vector<EmbeddedJson>& members,
                                  std::size_t max_depth) {
  std::string buffer;
  (void)replace_members(json, members, buffer,
                        [&](const EmbeddedJson& member, const std::string& document) {
                          const std::optional<PayloadProblem> problem =
                              find_payload_problem(document, depth_left(member.pointer, max_depth));
                          if (problem) throw_not_a_document(member.pointer, problem);
                        });
}

}  // namespace idem::detail
