// The canonical JSON writer: serializes a simdjson DOM in RFC 8785 or python_json_dumps form.
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "idem/fingerprint.h"

namespace idem::detail {

/// Orders `a` before `b` by their UTF-16 code units (RFC 8785 section 3.2.3); both are UTF-8.
[[nodiscard]] bool utf16_less(std::string_view a, std::string_view b) noexcept;

/// Writes a parsed document in canonical form. Keeps its scratch space between calls, so one
/// instance per thread is reused; not thread-safe.
class CanonicalWriter {
 public:
  /// Appends the canonical form of `root` to `out`. Throws idem::PayloadError (without offset)
  /// on a duplicate member name or nesting deeper than `max_depth`.
  void write(simdjson::dom::element root, CanonicalForm form, std::size_t max_depth, std::string& out);

 private:
  struct Member {
    std::string_view key;
    simdjson::dom::element value;
  };

  void write_value(simdjson::dom::element value, std::size_t depth);
  void write_object(simdjson::dom::object object, std::size_t depth);
  void write_array(simdjson::dom::array array, std::size_t depth);
  void write_string(std::string_view text);
  void write_ascii_string(std::string_view text);

  std::vector<Member> members_;  // a stack of the open objects' members
  std::string* out_ = nullptr;
  CanonicalForm form_ = CanonicalForm::kRfc8785;
  std::size_t max_depth_ = 0;
};

}  // namespace idem::detail
