// Layer 3, the payload fingerprint: canonical JSON and its hash.
#pragma once

#include <string>
#include <string_view>

namespace idem {

/// Canonical form of a JSON text: object members sorted, no insignificant whitespace, minimal
/// string escaping (RFC 8785 style). Throws idem::PayloadError on invalid JSON.
[[nodiscard]] std::string canonicalize_json(std::string_view json);

/// Lowercase hex SHA-256 (64 hex digits) of the canonical form of `json`.
/// Throws idem::PayloadError on invalid JSON. Thread-safe.
[[nodiscard]] std::string fingerprint(std::string_view json);

}  // namespace idem
