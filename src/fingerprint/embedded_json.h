// Members of a payload whose string value is itself a JSON document (an HTTP-triggered function
// event's `body`, base64 or not): decoded in place before field selection, so that an include
// pointer can reach inside them (FingerprintOptions::embedded_json).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "idem/fingerprint.h"

namespace idem::detail {

/// Replaces, in order, each member of `json` named by `members` whose value is a non-empty
/// string by the JSON document that string holds, base64-decoded first (RFC 4648, standard
/// alphabet) when the member's `base64_flag` names a `true`. An absent member, one that is not a
/// string (an object already, null) or an empty string is left as is; a later member may be
/// inside an earlier one's document. Returns `json` itself when nothing was replaced, else a
/// view of `buffer`, which holds the new document.
///
/// Throws idem::PayloadError naming the pointer when such a string is not valid base64 or does
/// not hold a JSON document (with the problem and its byte offset inside the decoded text).
/// Thread-safe (each thread keeps its own parsers).
[[nodiscard]] std::string_view decode_embedded_json(std::string_view json,
                                                    const std::vector<EmbeddedJson>& members,
                                                    std::size_t max_depth, std::string& buffer);

/// When the canonical writer rejected the payload decode_embedded_json() made of `json`: throws
/// idem::PayloadError naming the member whose document holds the problem (a duplicate member
/// name, nesting deeper than max_depth allows below the member), with its byte offset inside
/// the decoded text. Returns when every document is fine (the problem is in `json` itself).
void throw_embedded_payload_error(std::string_view json, const std::vector<EmbeddedJson>& members,
                                  std::size_t max_depth);

}  // namespace idem::detail
