// The canonical JSON writer: parses a payload with simdjson (DOM, runtime-dispatched SIMD
// kernels) and writes its RFC 8785 or python_json_dumps form.
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fingerprint/selection.h"
#include "idem/fingerprint.h"

namespace idem::detail {

/// Orders `a` before `b` by their UTF-16 code units (RFC 8785 section 3.2.3); both are UTF-8.
[[nodiscard]] bool utf16_less(std::string_view a, std::string_view b) noexcept;

/// Parses and canonicalizes payloads. The writer walks simdjson's DOM tape directly (its format
/// is documented in simdjson's doc/tape.md; pinned to simdjson 3.0.x), which is several times
/// cheaper than the element API. An integer literal simdjson cannot hold (outside [-2^63,
/// 2^64-1]) is quoted before parsing and written back as its digits. Keeps its parser and
/// buffers between calls (one instance per thread, reused, so a payload costs no allocation);
/// not thread-safe.
class CanonicalWriter {
 public:
  struct Options {
    CanonicalForm form = CanonicalForm::kRfc8785;
    std::size_t max_depth = 128;
    const Selection* selection = nullptr;  ///< nullptr: the whole document
    bool absent_include_is_error = false;
  };

  /// The canonical bytes of the selected parts of `json`, valid until the next call. Throws
  /// idem::PayloadError (without offset) when `json` is not valid JSON, has a duplicate member
  /// name or nesting deeper than max_depth, or misses an include pointer that must be present.
  [[nodiscard]] std::string_view write(std::string_view json, const Options& options);

 private:
  // An object member: its key (in the parser's string buffer) and the tape index of its value.
  struct Member {
    std::uint64_t head;  // first 8 key bytes, big-endian: most comparisons stop here
    std::string_view key;
    std::size_t value;
  };
  enum class Pick { kDrop, kWrite, kProbe };

  // Copies `json` into the padded input buffer and parses it.
  simdjson::error_code parse(std::string_view json);
  // Writes into quoted_ `json` with every integer literal outside [-2^63, 2^64-1] (which
  // simdjson rejects) turned into a string of its digits, recording in wide_integers_ the
  // ordinals of those strings among all the document's strings, keys included. False when
  // there is none.
  bool quote_wide_integers(std::string_view json);
  // Replaces the ordinals in wide_integers_ by the strings' offsets in the string buffer
  // (rising, like the ordinals), which identify them on the tape.
  void locate_wide_integers();
  [[nodiscard]] Pick pick(const SelectionNode* child, bool selected);
  // The writers are templates on the form, so that its choices cost nothing per value.
  // Writes `key:` (unless null) and the value at tape index `value` when the selection keeps
  // it; false when dropped.
  template <CanonicalForm kForm>
  bool write_entry(const std::string_view* key, std::size_t value, std::size_t depth,
                   const SelectionNode* child, bool selected, bool first);
  // Checks the value at tape index `index`, which the selection leaves out, as the writers
  // check what they write (the payload as a whole must be valid): its nesting (it sits at
  // `depth`, as write_value() is given it) and its member names. Throws idem::PayloadError.
  void check_unwritten(std::size_t index, std::size_t depth);
  // Each writes the value at tape index `index` and returns the index after it.
  template <CanonicalForm kForm>
  std::size_t write_value(std::size_t index, std::size_t depth, const SelectionNode* node,
                          bool selected);
  template <CanonicalForm kForm>
  std::size_t write_object(std::size_t index, std::size_t depth, const SelectionNode* node,
                           bool selected);
  template <CanonicalForm kForm>
  std::size_t write_array(std::size_t index, std::size_t depth, const SelectionNode* node,
                          bool selected);

  // Where the next output byte goes: write() sizes the buffer for the longest possible output
  // up front, so the writers never check for room.
  char* cursor() { return out_.get() + size_; }
  void commit(const char* end) { size_ = static_cast<std::size_t>(end - out_.get()); }

  simdjson::dom::parser parser_;
  const std::uint64_t* tape_ = nullptr;  // parser_.doc's tape and strings (simdjson doc/tape.md)
  const std::uint8_t* strings_ = nullptr;
  std::unique_ptr<char[]> input_;  // the payload, copied with simdjson's padding
  std::size_t input_capacity_ = 0;
  std::unique_ptr<char[]> out_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  std::vector<Member> members_;               // a stack of the open objects' members
  std::string quoted_;                        // the payload with its wide integers quoted
  std::vector<std::uint64_t> wide_integers_;  // string-buffer offsets of the quoted integers
  std::vector<bool> include_hits_;
  std::size_t selected_values_ = 0;
  Options options_;
};

}  // namespace idem::detail
