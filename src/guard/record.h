// The value stored under a guard key: one Redis string, so that `SET … NX GET` and the Lua
// scripts see the same record.
//
//   record    = version state owner request-id fingerprint response
//   version   = "1"
//   state     = "I" / "C"                       ; IN_PROGRESS / COMPLETED
//   owner     = 32LOWHEX                        ; 128-bit owner token of the claiming attempt
//   request-id, fingerprint = len ":" *OCTET    ; len = decimal byte count
//   response  = "-"                             ; none (IN_PROGRESS)
//             / "B" *OCTET                      ; the response, verbatim, to the end
//             / "H" 64LOWHEX                    ; SHA-256 of a response over the size cap
//
// The Lua scripts rely on the owner at bytes 3..34 (1-based) and on the length prefixes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/guard.h"
#include "idem/record.h"

namespace idem::detail {

/// Length of an owner token in hex characters.
inline constexpr std::size_t kOwnerTokenSize = 32;

/// A decoded record.
struct StoredRecord {
  RecordState state = RecordState::kInProgress;
  std::string owner_token;
  std::string request_id;
  std::string fingerprint;
  std::optional<std::string> response;         ///< Verbatim response.
  std::optional<std::string> response_sha256;  ///< Hash of a response over the cap.
};

/// Encodes a fresh IN_PROGRESS record. `owner_token` must be kOwnerTokenSize characters.
[[nodiscard]] std::string encode_claim(std::string_view owner_token, std::string_view request_id,
                                       std::string_view fingerprint);

/// The response field (see the grammar): verbatim when `response.size() <= max_bytes`, else
/// "H" + SHA-256 hex.
[[nodiscard]] std::string encode_response(std::string_view response, std::size_t max_bytes);

/// Decodes a record; throws idem::ForeignRecord when `value` is not one (another writer's value,
/// a truncated or otherwise damaged record). Never reads outside `value`; fuzzed by
/// tests/fuzz/record_fuzz.cc.
[[nodiscard]] StoredRecord decode_record(std::string_view value);

/// A step journal entry, as the journal hash keeps it: `len ":" input-fingerprint result`.
[[nodiscard]] std::string encode_step(const JournaledStep& step);
/// Decodes a journal entry; throws idem::ForeignRecord when `value` is not one.
[[nodiscard]] JournaledStep decode_step(std::string_view value);

/// A fresh owner token: 128 bits from OpenSSL's CSPRNG (drawn a few kilobytes at a time per
/// thread; a forked child draws afresh), lowercase hex. Thread-safe.
[[nodiscard]] std::string new_owner_token();

}  // namespace idem::detail
