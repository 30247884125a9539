#include "fingerprint/canonical_writer.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fingerprint/number_format.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

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

// The string scan and the key heads read words as little-endian.
static_assert(std::endian::native == std::endian::little,
              "idem's canonical writer assumes a little-endian CPU");

constexpr char kHexDigits[] = "0123456789abcdef";
// Escape scanning, a chunk of bytes at a time: chunk_hits() returns a mask with
// kHitBitsPerByte bits per byte (lowest bits: first byte); the lowest set bit marks the first
// byte that needs an escape in the RFC 8785 form (controls, '"', '\\') or, with `ascii`, the
// ensure_ascii form (also DEL and non-ASCII). Higher bits may be false positives.
#if defined(__SSE2__)
constexpr std::size_t kChunk = 16;
constexpr int kHitBitsPerByte = 1;
template <bool kAscii>
std::uint64_t chunk_hits(const unsigned char* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m128i hits = _mm_or_si128(_mm_cmpeq_epi8(bytes, _mm_set1_epi8('"')),
                              _mm_cmpeq_epi8(bytes, _mm_set1_epi8('\\')));
  hits = _mm_or_si128(hits,
                      _mm_cmpeq_epi8(_mm_min_epu8(bytes, _mm_set1_epi8(0x1F)), bytes));  // <= 0x1F
  if constexpr (kAscii)
    hits = _mm_or_si128(
        hits, _mm_cmpeq_epi8(_mm_max_epu8(bytes, _mm_set1_epi8(0x7F)), bytes));  // >= 0x7F
  return static_cast<std::uint32_t>(_mm_movemask_epi8(hits));
}
#else
constexpr std::size_t kChunk = 8;
constexpr int kHitBitsPerByte = 8;
constexpr std::uint64_t kOnes = 0x0101010101010101;
constexpr std::uint64_t kHighBits = 0x8080808080808080;
constexpr std::uint64_t has_byte(std::uint64_t word, unsigned char byte) {
  const std::uint64_t x = word ^ (kOnes * byte);
  return (x - kOnes) & ~x & kHighBits;
}
template <bool kAscii>
std::uint64_t chunk_hits(const unsigned char* p) {
  std::uint64_t word;
  std::memcpy(&word, p, sizeof word);
  const std::uint64_t hits =
      ((word - kOnes * 0x20) & ~word & kHighBits) | has_byte(word, '"') | has_byte(word, '\\');
  if constexpr (kAscii) return hits | (word & kHighBits) | has_byte(word, 0x7F);
  return hits;
}
#endif

char* write_u_escape(char* out, std::uint32_t unit) {
  const char escape[6] = {'\\',
                          'u',
                          kHexDigits[unit >> 12 & 0xF],
                          kHexDigits[unit >> 8 & 0xF],
                          kHexDigits[unit >> 4 & 0xF],
                          kHexDigits[unit & 0xF]};
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

// simdjson's DOM tape (doc/tape.md): each word is a type character in the top byte and a
// 56-bit payload. Strings point into the string buffer (a 32-bit length, then the bytes);
// numbers keep their value in the next word; '{' and '[' hold the index after their end.
char tape_type(std::uint64_t word) { return static_cast<char>(word >> 56); }
std::uint64_t tape_payload(std::uint64_t word) { return word & 0x00FFFFFFFFFFFFFF; }
std::string_view tape_string(const std::uint8_t* strings, std::uint64_t word) {
  const std::uint8_t* at = strings + tape_payload(word);
  std::uint32_t length;
  std::memcpy(&length, at, sizeof length);
  return {reinterpret_cast<const char*>(at + sizeof length), length};
}
// The tape index after the value at `index`.
std::size_t tape_after(const std::uint64_t* tape, std::size_t index) {
  switch (tape_type(tape[index])) {
    case '{':
    case '[':
      return tape_payload(tape[index]) & 0xFFFFFFFF;
    case 'l':
    case 'u':
    case 'd':
      return index + 2;
    default:
      return index + 1;
  }
}

// The first 8 bytes of `key`, big-endian, zero padded: comparing heads compares prefixes.
// For RFC 8785 the lead bytes EE and EF (U+E000-U+FFFF) become FE and FF (never in UTF-8), so
// that they sort after F0-F4 (supplementary characters, UTF-16 surrogates D800-DBFF): then
// comparing heads compares UTF-16 code units. `key` lies in simdjson's padded string buffer,
// so 8 bytes are always readable.
template <CanonicalForm kForm>
std::uint64_t key_head(std::string_view key) {
  std::uint64_t word;
  std::memcpy(&word, key.data(), sizeof word);
  if (key.size() < 8) word &= (std::uint64_t{1} << (8 * key.size())) - 1;
  if constexpr (kForm == CanonicalForm::kRfc8785) {
    constexpr std::uint64_t kLow7 = 0x7F7F7F7F7F7F7F7F;
    const std::uint64_t x = (word & 0xFEFEFEFEFEFEFEFE) ^ 0xEEEEEEEEEEEEEEEE;  // 0 where EE or EF
    const std::uint64_t nonzero = (((x & kLow7) + kLow7) | x) & ~kLow7;        // exact, per byte
    word += ((~nonzero & ~kLow7) >> 7) * 0x10;
  }
  return __builtin_bswap64(word);
}

// UTF-8 byte order is code point order. UTF-16 order differs only between a supplementary
// character (lead byte F0-F4, surrogates D800-DBFF) and U+E000-U+FFFF (lead byte EE-EF); those
// bytes are never continuation bytes, so the first differing bytes decide.
bool utf16_byte_less(unsigned char x, unsigned char y) {
  if (x >= 0xF0 && (y == 0xEE || y == 0xEF)) return true;
  if (y >= 0xF0 && (x == 0xEE || x == 0xEF)) return false;
  return x < y;
}

// Orders members by key in the form's order (heads first, see key_head()).
template <CanonicalForm kForm>
struct KeyLess {
  bool operator()(const auto& a, const auto& b) const {
    if (a.head != b.head) return a.head < b.head;
    if constexpr (kForm == CanonicalForm::kRfc8785) {
      return utf16_less(a.key, b.key);
    } else {
      return a.key < b.key;  // Python: code point order, which is UTF-8 byte order
    }
  }
};

// Sorts `members` by key (insertion sort for the usual small objects: no work when they are
// in order already); throws on a duplicate name.
template <CanonicalForm kForm, class Iterator>
void sort_members(Iterator first, Iterator last) {
  constexpr std::ptrdiff_t kInsertionSortMax = 24;
  const KeyLess<kForm> less;
  if (last - first > kInsertionSortMax) {
    std::sort(first, last, less);
  } else {
    for (auto i = first + 1; i < last; ++i) {
      if (less(*(i - 1), *i)) continue;
      const auto member = *i;
      auto j = i;
      do {
        *j = *(j - 1);
        --j;
      } while (j != first && less(member, *(j - 1)));
      *j = member;
    }
  }
  if (std::adjacent_find(first, last, [](const auto& a, const auto& b) {
        return a.head == b.head && a.key == b.key;
      }) != last) {
    throw PayloadError("duplicate JSON member name");
  }
}

// True for a JSON integer literal (RFC 8259 grammar) that simdjson cannot hold: outside
// [-2^63, 2^64-1].
bool wide_integer(std::string_view token) {
  const bool negative = token.front() == '-';
  const std::string_view digits = token.substr(negative ? 1 : 0);
  if (digits.empty() || (digits.front() == '0' && digits.size() > 1) ||
      digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return false;  // not an integer literal: simdjson judges it
  }
  const char* const end = token.data() + token.size();
  std::int64_t signed_value;
  std::uint64_t unsigned_value;
  return negative ? std::from_chars(token.data(), end, signed_value).ec != std::errc()
                  : std::from_chars(token.data(), end, unsigned_value).ec != std::errc();
}

// Writes `text` quoted, in the form's escaping, at `out` (room for 6 * size + 2 + kChunk
// bytes); returns the end. Works a chunk at a time: `text` lies in simdjson's string buffer,
// where every string ends with a NUL byte (doc/tape.md) followed by readable padding, so the
// scan needs no length checks: the NUL is the first "control character" at or after the end.
// The bytes a chunk copies past it are overwritten.
template <CanonicalForm kForm>
char* write_string(char* out, std::string_view text) {
  constexpr bool kAscii = kForm == CanonicalForm::kPythonJsonDumps;
  const std::array<char, 256>& escapes = kAscii ? kAsciiEscapes : kRfcEscapes;
  *out++ = '"';
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* const end = p + text.size();
  for (;;) {
    std::memcpy(out, p, kChunk);
    const std::uint64_t hits = chunk_hits<kAscii>(p);
    if (hits == 0) {
      out += kChunk;
      p += kChunk;
      continue;
    }
    const auto clean = static_cast<std::size_t>(std::countr_zero(hits) / kHitBitsPerByte);
    out += clean;
    p += clean;
    if (p == end) break;
    out = write_escape(out, p, escapes[*p]);
  }
  *out++ = '"';
  return out;
}

}  // namespace

bool utf16_less(std::string_view a, std::string_view b) noexcept {
  const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  if (mismatch.second == b.end()) return false;
  if (mismatch.first == a.end()) return true;
  return utf16_byte_less(static_cast<unsigned char>(*mismatch.first),
                         static_cast<unsigned char>(*mismatch.second));
}

std::string_view CanonicalWriter::write(std::string_view json, const Options& options) {
  options_ = options;
  wide_integers_.clear();
  auto error = parse(json);
  if (error == simdjson::NUMBER_ERROR && quote_wide_integers(json)) error = parse(quoted_);
  if (error != simdjson::SUCCESS)
    throw PayloadError(std::string("invalid JSON: ") + simdjson::error_message(error));
  tape_ = parser_.doc.tape.get();
  strings_ = parser_.doc.string_buf.get();
  if (!wide_integers_.empty()) locate_wide_integers();
  // The canonical text is at most 6 bytes per input byte (a raw DEL becomes \u007f in the
  // python form; numbers grow less: 1e20 becomes 21 digits), plus the string writer's chunk.
  const std::size_t max_output = 6 * json.size() + 2 * kChunk;
  if (capacity_ < max_output) {
    capacity_ = std::max<std::size_t>(max_output, 4096);
    out_ = std::make_unique_for_overwrite<char[]>(capacity_);
  }
  size_ = 0;
  members_.clear();
  const Selection* selection = options.selection;
  include_hits_.assign(selection != nullptr ? selection->include_count() : 0, false);
  const SelectionNode* node = selection != nullptr ? &selection->root() : nullptr;
  const bool selected =
      selection == nullptr || !selection->has_includes() || pick(node, false) == Pick::kWrite;
  if (options.form == CanonicalForm::kRfc8785) {  // tape[0] is the root word
    write_value<CanonicalForm::kRfc8785>(1, 0, node, selected);
  } else {
    write_value<CanonicalForm::kPythonJsonDumps>(1, 0, node, selected);
  }
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

simdjson::error_code CanonicalWriter::parse(std::string_view json) {
  if (input_capacity_ < json.size() + simdjson::SIMDJSON_PADDING) {
    input_capacity_ = std::max<std::size_t>(json.size() * 2, 4096) + simdjson::SIMDJSON_PADDING;
    input_ = std::make_unique<char[]>(input_capacity_);
  }
  std::memcpy(input_.get(), json.data(), json.size());
  return parser_.parse(input_.get(), json.size(), false).error();
}

bool CanonicalWriter::quote_wide_integers(std::string_view json) {
  const auto number_char = [](char c) {
    return std::string_view("0123456789.eE+-").find(c) != std::string_view::npos;
  };
  quoted_.clear();
  std::size_t strings = 0;  // strings so far, keys included: their order on the tape
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string || (c != '-' && (c < '0' || c > '9'))) {
      quoted_.push_back(c);
      if (in_string && c == '\\' && i + 1 < json.size()) quoted_.push_back(json[++i]);
      if (c == '"') {
        strings += in_string ? 0 : 1;
        in_string = !in_string;
      }
      continue;
    }
    std::size_t end = i + 1;
    while (end < json.size() && number_char(json[end])) ++end;
    const std::string_view token = json.substr(i, end - i);
    if (wide_integer(token)) {
      wide_integers_.push_back(strings++);
      quoted_.append("\"").append(token).append("\"");
    } else {
      quoted_.append(token);
    }
    i = end - 1;
  }
  return !wide_integers_.empty();
}

void CanonicalWriter::locate_wide_integers() {
  // The tape holds strings in document order; numbers take two words (doc/tape.md).
  const std::size_t end = tape_payload(tape_[0]) & 0xFFFFFFFF;
  std::size_t ordinal = 0;
  auto next = wide_integers_.begin();
  for (std::size_t i = 1; i < end && next != wide_integers_.end();) {
    const char type = tape_type(tape_[i]);
    if (type == '"') {
      if (ordinal++ == *next) *next++ = tape_payload(tape_[i]);
    }
    i += type == 'l' || type == 'u' || type == 'd' ? 2 : 1;
  }
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

template <CanonicalForm kForm>
bool CanonicalWriter::write_entry(const std::string_view* key, std::size_t value, std::size_t depth,
                                  const SelectionNode* child, bool selected, bool first) {
  const Pick choice = pick(child, selected);
  if (choice == Pick::kDrop) {
    check_unwritten(value, depth);
    return false;
  }
  const char type = tape_type(tape_[value]);
  if (choice == Pick::kProbe && type != '{' && type != '[') return false;
  const std::size_t mark = size_;
  const std::size_t selected_before = selected_values_;
  char* out = cursor();
  if (!first) *out++ = ',';
  if (key != nullptr) {
    out = write_string<kForm>(out, *key);
    *out++ = ':';
  }
  commit(out);
  write_value<kForm>(value, depth, child, choice == Pick::kWrite);
  if (choice == Pick::kProbe && selected_values_ == selected_before) {
    size_ = mark;
    return false;
  }
  return true;
}

void CanonicalWriter::check_unwritten(std::size_t index, std::size_t depth) {
  const char type = tape_type(tape_[index]);
  if (type != '{' && type != '[') return;
  ++depth;  // as write_value() counts it
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  const std::size_t end = tape_payload(tape_[index]) & 0xFFFFFFFF;
  if (type == '[') {
    for (std::size_t i = index + 1; i + 1 < end; i = tape_after(tape_, i))
      check_unwritten(i, depth);
    return;
  }
  const std::size_t begin = members_.size();
  for (std::size_t i = index + 1; i + 1 < end; i = tape_after(tape_, i + 1)) {
    const std::string_view key = tape_string(strings_, tape_[i]);
    members_.push_back({key_head<CanonicalForm::kRfc8785>(key), key, i + 1});
  }
  // Any form's order finds the duplicates: the writers' own check.
  sort_members<CanonicalForm::kRfc8785>(members_.begin() + static_cast<std::ptrdiff_t>(begin),
                                        members_.end());
  for (std::size_t i = begin; i < members_.size(); ++i) check_unwritten(members_[i].value, depth);
  members_.resize(begin);
}

template <CanonicalForm kForm>
std::size_t CanonicalWriter::write_value(std::size_t index, std::size_t depth,
                                         const SelectionNode* node, bool selected) {
  if (selected) ++selected_values_;
  const std::uint64_t word = tape_[index];
  switch (tape_type(word)) {
    case '{':
      return write_object<kForm>(index, depth + 1, node, selected);
    case '[':
      return write_array<kForm>(index, depth + 1, node, selected);
    case '"': {
      const std::string_view text = tape_string(strings_, word);
      if (!wide_integers_.empty() &&
          std::binary_search(wide_integers_.begin(), wide_integers_.end(), tape_payload(word))) {
        commit(std::copy(text.begin(), text.end(), cursor()));  // its exact digits
      } else {
        commit(write_string<kForm>(cursor(), text));
      }
      return index + 1;
    }
    case 'l': {
      char* out = cursor();
      commit(std::to_chars(out, out + 24, static_cast<std::int64_t>(tape_[index + 1])).ptr);
      return index + 2;
    }
    case 'u': {
      char* out = cursor();
      commit(std::to_chars(out, out + 24, tape_[index + 1]).ptr);
      return index + 2;
    }
    case 'd': {
      char* out = cursor();
      const auto number = std::bit_cast<double>(tape_[index + 1]);
      commit(kForm == CanonicalForm::kRfc8785 ? write_ecmascript_number(out, number)
                                              : write_python_float(out, number));
      return index + 2;
    }
    case 't':
      commit(std::copy_n("true", 4, cursor()));
      return index + 1;
    case 'f':
      commit(std::copy_n("false", 5, cursor()));
      return index + 1;
    default:  // 'n'
      commit(std::copy_n("null", 4, cursor()));
      return index + 1;
  }
}

template <CanonicalForm kForm>
std::size_t CanonicalWriter::write_object(std::size_t index, std::size_t depth,
                                          const SelectionNode* node, bool selected) {
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  const std::size_t end = tape_payload(tape_[index]) & 0xFFFFFFFF;  // index after the matching '}'
  const std::size_t begin = members_.size();
  for (std::size_t i = index + 1; i + 1 < end; i = tape_after(tape_, i + 1)) {
    const std::string_view key = tape_string(strings_, tape_[i]);
    members_.push_back({key_head<kForm>(key), key, i + 1});
  }
  const auto first = members_.begin() + static_cast<std::ptrdiff_t>(begin);
  sort_members<kForm>(first, members_.end());
  *cursor() = '{', ++size_;
  bool empty = true;
  for (std::size_t i = begin; i < members_.size(); ++i) {
    const Member member = members_[i];  // members_ may grow while the value is written
    if (node == nullptr) {              // no selection below here: write everything
      char* out = cursor();
      if (!empty) *out++ = ',';
      out = write_string<kForm>(out, member.key);
      *out++ = ':';
      commit(out);
      write_value<kForm>(member.value, depth, nullptr, true);
      empty = false;
    } else if (write_entry<kForm>(&member.key, member.value, depth, node->child(member.key),
                                  selected, empty)) {
      empty = false;
    }
  }
  *cursor() = '}', ++size_;
  members_.resize(begin);
  return end;
}

template <CanonicalForm kForm>
std::size_t CanonicalWriter::write_array(std::size_t index, std::size_t depth,
                                         const SelectionNode* node, bool selected) {
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  const std::size_t end = tape_payload(tape_[index]) & 0xFFFFFFFF;  // index after the matching ']'
  *cursor() = '[', ++size_;
  bool empty = true;
  std::size_t position = 0;
  for (std::size_t i = index + 1; i + 1 < end; ++position) {
    if (node == nullptr) {  // no selection below here: write everything
      if (!empty) *cursor() = ',', ++size_;
      i = write_value<kForm>(i, depth, nullptr, true);
      empty = false;
      continue;
    }
    char token[24];
    const auto token_end = std::to_chars(token, token + sizeof token, position).ptr;
    const SelectionNode* child =
        node->child(std::string_view(token, static_cast<std::size_t>(token_end - token)));
    if (write_entry<kForm>(nullptr, i, depth, child, selected, empty)) empty = false;
    i = tape_after(tape_, i);
  }
  *cursor() = ']', ++size_;
  return end;
}

}  // namespace idem::detail
