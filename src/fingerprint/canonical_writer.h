// The canonical JSON writer: serializes a simdjson DOM in RFC 8785 or python_json_dumps form.
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fingerprint/selection.h"
#include "idem/fingerprint.h"

namespace idem::detail {

/// Orders `a` before `b` by their UTF-16 code units (RFC 8785 section 3.2.3); both are UTF-8.
[[nodiscard]] bool utf16_less(std::string_view a, std::string_view b) noexcept;

/// Writes a parsed document in canonical form. Keeps its scratch space between calls, so one
/// instance per thread is reused; not thread-safe.
class CanonicalWriter {
 public:
  struct Options {
    CanonicalForm form = CanonicalForm::kRfc8785;
    std::size_t max_depth = 128;
    const Selection* selection = nullptr;  ///< nullptr: the whole document
    bool absent_include_is_error = false;
  };

  /// Appends the canonical form of the selected parts of `root` to `out`. Throws
  /// idem::PayloadError (without offset) on a duplicate member name, nesting deeper than
  /// max_depth, or an absent include pointer when that is an error.
  void write(simdjson::dom::element root, const Options& options, std::string& out);

 private:
  struct Member {
    std::string_view key;
    simdjson::dom::element value;
  };
  enum class Pick { kSkip, kWrite, kProbe };

  Pick pick(const SelectionNode* child, bool selected);
  // Writes `key:` (when not null) and `value` unless the selection drops it; false if dropped.
  bool write_entry(const std::string_view* key, simdjson::dom::element value, std::size_t depth,
                   const SelectionNode* child, bool selected, bool first);
  void write_value(simdjson::dom::element value, std::size_t depth, const SelectionNode* node, bool selected);
  void write_object(simdjson::dom::object object, std::size_t depth, const SelectionNode* node, bool selected);
  void write_array(simdjson::dom::array array, std::size_t depth, const SelectionNode* node, bool selected);
  void write_string(std::string_view text);
  void write_ascii_string(std::string_view text);

  std::vector<Member> members_;  // a stack of the open objects' members
  std::vector<bool> include_hits_;
  std::size_t selected_values_ = 0;
  std::string* out_ = nullptr;
  Options options_;
};

}  // namespace idem::detail
