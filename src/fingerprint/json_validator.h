// A strict, slow JSON scanner that names the first problem of a payload and its byte offset.
// The fast path (the canonical writer) only says that a payload is bad; this says where and why.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace idem::detail {

/// One problem of a payload: what is wrong and the byte offset where it was found.
struct PayloadProblem {
  std::string message;
  std::size_t offset = 0;
};

/// The first problem of `json` in document order under RFC 8259 plus idem's rules: invalid
/// UTF-8, a lone surrogate escape, a duplicate member name (after unescaping), nesting deeper
/// than `max_depth`, a non-integer number beyond the range of a double. std::nullopt when there
/// is none.
[[nodiscard]] std::optional<PayloadProblem> find_payload_problem(std::string_view json,
                                                                 std::size_t max_depth);

/// Throws the idem::PayloadError every layer reports for a bad payload: "idem: <problem> at byte
/// <offset>" with offset(), for the first problem find_payload_problem(json, max_depth) names;
/// "idem: <fallback>" without an offset when it names none.
[[noreturn]] void throw_payload_error(std::string_view json, std::size_t max_depth,
                                      const std::string& fallback);

}  // namespace idem::detail
