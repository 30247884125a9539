#include "fingerprint/canonical_writer.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>

#include "fingerprint/number_format.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// For each byte, how the string writer of each form writes it: 0 raw, else the letter of its
// short escape (`\n`), or 'u' for `\u00xx`. Python's ensure_ascii also escapes DEL and
// everything above it ('U': decode UTF-8, write UTF-16 units).
constexpr std::array<char, 256> escape_table(bool ascii) {
  std::array<char, 256> table{};
  for (int c = 0; c < 0x20; ++c) table[c] = 'u';
  table['\b'] = 'b';
  table['\f'] = 'f';
  table['\n'] = 'n';
  table['\r'] = 'r';
  table['\t'] = 't';
  table['"'] = '"';
  table['\\'] = '\\';
  if (ascii) {
    table[0x7F] = 'u';
    for (int c = 0x80; c < 0x100; ++c) table[c] = 'U';
  }
  return table;
}
constexpr std::array<char, 256> kRfcEscapes = escape_table(false);
constexpr std::array<char, 256> kAsciiEscapes = escape_table(true);

constexpr char kHexDigits[] = "0123456789abcdef";
constexpr std::uint64_t kOnes = 0x0101010101010101;
constexpr std::uint64_t kHighBits = 0x8080808080808080;

// SWAR: nonzero when some byte of `word` equals `byte` / is below 0x20 (exact as a whole).
constexpr std::uint64_t has_byte(std::uint64_t word, unsigned char byte) {
  const std::uint64_t x = word ^ (kOnes * byte);
  return (x - kOnes) & ~x & kHighBits;
}
constexpr std::uint64_t has_control(std::uint64_t word) { return (word - kOnes * 0x20) & ~word & kHighBits; }
// Nonzero when one of the 8 bytes needs an escape in the RFC 8785 / the ensure_ascii form.
constexpr std::uint64_t needs_escape(std::uint64_t word, bool ascii) {
  const std::uint64_t special = has_control(word) | has_byte(word, '"') | has_byte(word, '\\');
  return ascii ? special | (word & kHighBits) | has_byte(word, 0x7F) : special;
}

char* write_u_escape(char* out, std::uint32_t unit) {
  const char escape[6] = {'\\', 'u', kHexDigits[unit >> 12 & 0xF], kHexDigits[unit >> 8 & 0xF],
                          kHexDigits[unit >> 4 & 0xF], kHexDigits[unit & 0xF]};
  std::memcpy(out, escape, sizeof escape);
  return out + sizeof escape;
}

// Writes the escape of the byte(s) at `p` of kind `kind`; returns the end of the output and
// advances `p` past the input it consumed.
char* write_escape(char* out, const unsigned char*& p, char kind) {
  if (kind == 'u') return write_u_escape(out, *p++);
  if (kind != 'U') {
    ++p;
    *out++ = '\\';
    *out++ = kind;
    return out;
  }
  const unsigned char lead = *p;  // valid UTF-8 (the parser checked)
  std::uint32_t code_point = 0;
  if (lead < 0xE0) {
    code_point = (lead & 0x1Fu) << 6 | (p[1] & 0x3Fu);
    p += 2;
  } else if (lead < 0xF0) {
    code_point = (lead & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
    p += 3;
  } else {
    code_point = (lead & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
    p += 4;
  }
  if (code_point < 0x10000) return write_u_escape(out, code_point);
  code_point -= 0x10000;
  out = write_u_escape(out, 0xD800 + (code_point >> 10));
  return write_u_escape(out, 0xDC00 + (code_point & 0x3FF));
}

// The first 8 bytes of `key`, big-endian, zero padded: comparing heads compares prefixes.
std::uint64_t key_head(std::string_view key) {
  std::uint64_t word = 0;
  std::memcpy(&word, key.data(), std::min<std::size_t>(key.size(), 8));
  return std::endian::native == std::endian::little ? __builtin_bswap64(word) : word;
}

// UTF-8 byte order is code point order. UTF-16 order differs only between a supplementary
// character (lead byte F0-F4, surrogates D800-DBFF) and U+E000-U+FFFF (lead byte EE-EF); those
// bytes are never continuation bytes, so the first differing bytes decide.
bool utf16_byte_less(unsigned char x, unsigned char y) {
  if (x >= 0xF0 && (y == 0xEE || y == 0xEF)) return true;
  if (y >= 0xF0 && (x == 0xEE || x == 0xEF)) return false;
  return x < y;
}

// Orders members by key in the form's order.
template <CanonicalForm kForm>
struct KeyLess {
  bool operator()(const auto& a, const auto& b) const {
    if (a.head == b.head) {
      if constexpr (kForm == CanonicalForm::kRfc8785) {
        return utf16_less(a.key, b.key);
      } else {
        return a.key < b.key;  // Python: code point order, which is UTF-8 byte order
      }
    } else if constexpr (kForm == CanonicalForm::kRfc8785) {
      const int shift = 56 - std::countl_zero(a.head ^ b.head) / 8 * 8;
      return utf16_byte_less(static_cast<unsigned char>(a.head >> shift), static_cast<unsigned char>(b.head >> shift));
    } else {
      return a.head < b.head;
    }
  }
};

// Sorts `members` by key unless they are in strictly increasing order already; throws on a
// duplicate name.
template <CanonicalForm kForm, class Iterator>
void sort_members(Iterator first, Iterator last) {
  const KeyLess<kForm> less;
  if (std::adjacent_find(first, last, [&](const auto& a, const auto& b) { return !less(a, b); }) == last) return;
  std::sort(first, last, less);
  if (std::adjacent_find(first, last, [](const auto& a, const auto& b) { return a.key == b.key; }) != last) {
    throw PayloadError("duplicate JSON member name");
  }
}

}  // namespace

bool utf16_less(std::string_view a, std::string_view b) noexcept {
  const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  if (mismatch.second == b.end()) return false;
  if (mismatch.first == a.end()) return true;
  return utf16_byte_less(static_cast<unsigned char>(*mismatch.first), static_cast<unsigned char>(*mismatch.second));
}

void CanonicalWriter::grow(std::size_t needed) {
  const std::size_t capacity = std::max(needed, capacity_ * 2);
  auto bigger = std::make_unique<char[]>(capacity);
  if (size_ != 0) std::memcpy(bigger.get(), out_.get(), size_);
  out_ = std::move(bigger);
  capacity_ = capacity;
}

std::string_view CanonicalWriter::write(std::string_view json, const Options& options) {
  options_ = options;
  if (input_capacity_ < json.size() + simdjson::SIMDJSON_PADDING) {
    input_capacity_ = std::max<std::size_t>(json.size() * 2, 4096) + simdjson::SIMDJSON_PADDING;
    input_ = std::make_unique<char[]>(input_capacity_);
  }
  std::memcpy(input_.get(), json.data(), json.size());
  element root;
  if (const auto error = parser_.parse(input_.get(), json.size(), false).get(root); error != simdjson::SUCCESS) {
    throw PayloadError(std::string("invalid JSON: ") + simdjson::error_message(error));
  }
  size_ = 0;
  reserve(json.size() + 64);
  members_.clear();
  const Selection* selection = options.selection;
  include_hits_.assign(selection != nullptr ? selection->include_count() : 0, false);
  const SelectionNode* node = selection != nullptr ? &selection->root() : nullptr;
  const bool selected = selection == nullptr || !selection->has_includes() || pick(node, false) == Pick::kWrite;
  write_value(root, 0, node, selected);
  if (options.absent_include_is_error) {
    for (std::size_t id = 0; id < include_hits_.size(); ++id) {
      if (!include_hits_[id]) {
        throw PayloadError("include pointer \"" + selection->include_pointer(static_cast<int>(id)) +
                           "\" matches nothing in the payload");
      }
    }
  }
  return {out_.get(), size_};
}

// What to do with a member or element whose selection node is `child` (nullptr when no
// pointer goes there), inside a value that is `selected` or not.
CanonicalWriter::Pick CanonicalWriter::pick(const SelectionNode* child, bool selected) {
  if (child == nullptr) return selected ? Pick::kWrite : Pick::kDrop;
  if (child->excluded) return Pick::kDrop;
  if (child->include_id >= 0) {
    include_hits_[static_cast<std::size_t>(child->include_id)] = true;
    return Pick::kWrite;
  }
  return selected ? Pick::kWrite : Pick::kProbe;  // kept if something inside is selected
}

bool CanonicalWriter::write_entry(const std::string_view* key, element value, std::size_t depth,
                                  const SelectionNode* child, bool selected, bool first) {
  const Pick choice = pick(child, selected);
  if (choice == Pick::kDrop) return false;
  if (choice == Pick::kProbe && !value.is_object() && !value.is_array()) return false;
  const std::size_t mark = size_;
  const std::size_t selected_before = selected_values_;
  char* out = reserve(key != nullptr ? 6 * key->size() + 4 : 1);
  if (!first) *out++ = ',';
  if (key != nullptr) {
    out = write_string(out, *key);
    *out++ = ':';
  }
  commit(out);
  write_value(value, depth, child, choice == Pick::kWrite);
  if (choice == Pick::kProbe && selected_values_ == selected_before) {
    size_ = mark;
    return false;
  }
  return true;
}

void CanonicalWriter::write_value(element value, std::size_t depth, const SelectionNode* node, bool selected) {
  if (selected) ++selected_values_;
  switch (value.type()) {
    case element_type::OBJECT:
      write_object(value.get_object().value_unsafe(), depth + 1, node, selected);
      return;
    case element_type::ARRAY:
      write_array(value.get_array().value_unsafe(), depth + 1, node, selected);
      return;
    case element_type::STRING: {
      const std::string_view text = value.get_string().value_unsafe();
      commit(write_string(reserve(6 * text.size() + 2), text));
      return;
    }
    case element_type::INT64: {
      char* out = reserve(24);
      commit(std::to_chars(out, out + 24, value.get_int64().value_unsafe()).ptr);
      return;
    }
    case element_type::UINT64: {
      char* out = reserve(24);
      commit(std::to_chars(out, out + 24, value.get_uint64().value_unsafe()).ptr);
      return;
    }
    case element_type::DOUBLE: {
      char* out = reserve(kMaxNumberText);
      const double number = value.get_double().value_unsafe();
      commit(options_.form == CanonicalForm::kRfc8785 ? write_ecmascript_number(out, number)
                                                      : write_python_float(out, number));
      return;
    }
    case element_type::BOOL: {
      const std::string_view text = value.get_bool().value_unsafe() ? "true" : "false";
      commit(std::copy(text.begin(), text.end(), reserve(text.size())));
      return;
    }
    case element_type::NULL_VALUE:
      commit(std::copy_n("null", 4, reserve(4)));
      return;
  }
}

void CanonicalWriter::write_object(simdjson::dom::object object, std::size_t depth, const SelectionNode* node,
                                   bool selected) {
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  const std::size_t begin = members_.size();
  for (const simdjson::dom::key_value_pair field : object) members_.push_back({key_head(field.key), field.key, field.value});
  const auto first = members_.begin() + static_cast<std::ptrdiff_t>(begin);
  if (options_.form == CanonicalForm::kRfc8785) {
    sort_members<CanonicalForm::kRfc8785>(first, members_.end());
  } else {
    sort_members<CanonicalForm::kPythonJsonDumps>(first, members_.end());
  }
  *reserve(1) = '{', ++size_;
  bool empty = true;
  for (std::size_t i = begin; i < members_.size(); ++i) {
    const Member member = members_[i];  // members_ may grow while the value is written
    if (node == nullptr) {  // no selection below here: write everything
      char* out = reserve(6 * member.key.size() + 4);
      if (!empty) *out++ = ',';
      out = write_string(out, member.key);
      *out++ = ':';
      commit(out);
      write_value(member.value, depth, nullptr, true);
      empty = false;
    } else if (write_entry(&member.key, member.value, depth, node->child(member.key), selected, empty)) {
      empty = false;
    }
  }
  *reserve(1) = '}', ++size_;
  members_.resize(begin);
}

void CanonicalWriter::write_array(simdjson::dom::array array, std::size_t depth, const SelectionNode* node,
                                  bool selected) {
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  *reserve(1) = '[', ++size_;
  bool empty = true;
  std::size_t index = 0;
  for (const element item : array) {
    if (node == nullptr) {  // no selection below here: write everything
      if (!empty) *reserve(1) = ',', ++size_;
      write_value(item, depth, nullptr, true);
      empty = false;
      continue;
    }
    char token[24];
    const auto end = std::to_chars(token, token + sizeof token, index++).ptr;
    const SelectionNode* child = node->child(std::string_view(token, static_cast<std::size_t>(end - token)));
    if (write_entry(nullptr, item, depth, child, selected, empty)) empty = false;
  }
  *reserve(1) = ']', ++size_;
}

// Writes `text` quoted, in the form's escaping, at `out` (room for 6 * size + 2 bytes); returns
// the end. Copies 8 bytes at a time while none needs an escape.
char* CanonicalWriter::write_string(char* out, std::string_view text) const {
  const bool ascii = options_.form == CanonicalForm::kPythonJsonDumps;
  const std::array<char, 256>& escapes = ascii ? kAsciiEscapes : kRfcEscapes;
  *out++ = '"';
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* const end = p + text.size();
  while (end - p >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, sizeof word);
    if (needs_escape(word, ascii) == 0) {
      std::memcpy(out, &word, sizeof word);
      out += 8;
      p += 8;
    } else if (const char kind = escapes[*p]; kind != 0) {
      out = write_escape(out, p, kind);
    } else {
      *out++ = static_cast<char>(*p++);
    }
  }
  if (const auto rest = static_cast<std::size_t>(end - p); rest >= 4) {
    // 4 to 7 bytes: two overlapping 4-byte words cover them.
    std::uint32_t low;
    std::uint32_t high;
    std::memcpy(&low, p, 4);
    std::memcpy(&high, end - 4, 4);
    if (needs_escape(low | std::uint64_t{high} << 32, ascii) == 0) {
      std::memcpy(out, &low, 4);
      std::memcpy(out + rest - 4, &high, 4);
      out += rest;
      p = end;
    }
  }
  while (p != end) {
    if (const char kind = escapes[*p]; kind != 0) {
      out = write_escape(out, p, kind);
    } else {
      *out++ = static_cast<char>(*p++);
    }
  }
  *out++ = '"';
  return out;
}

}  // namespace idem::detail
