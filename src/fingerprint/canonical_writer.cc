#include "fingerprint/canonical_writer.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>

#include "fingerprint/number_format.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// For each byte: 0 when it is written raw in RFC 8785 strings, else the letter of its short
// escape (`\n`), or 'u' for `\u00xx`.
constexpr std::array<char, 256> kRfcEscapes = [] {
  std::array<char, 256> table{};
  for (int c = 0; c < 0x20; ++c) table[c] = 'u';
  table['\b'] = 'b';
  table['\f'] = 'f';
  table['\n'] = 'n';
  table['\r'] = 'r';
  table['\t'] = 't';
  table['"'] = '"';
  table['\\'] = '\\';
  return table;
}();

constexpr char kHexDigits[] = "0123456789abcdef";

void append_u_escape(std::string& out, std::uint32_t code_unit) {
  const char escape[6] = {'\\', 'u', kHexDigits[(code_unit >> 12) & 0xF], kHexDigits[(code_unit >> 8) & 0xF],
                          kHexDigits[(code_unit >> 4) & 0xF], kHexDigits[code_unit & 0xF]};
  out.append(escape, sizeof escape);
}

void append_escape(std::string& out, unsigned char byte, char kind) {
  if (kind == 'u') {
    append_u_escape(out, byte);
  } else {
    out.push_back('\\');
    out.push_back(kind);
  }
}

}  // namespace

bool utf16_less(std::string_view a, std::string_view b) noexcept {
  const std::size_t common = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < common && a[i] == b[i]) ++i;
  if (i == common) return a.size() < b.size();
  const auto x = static_cast<unsigned char>(a[i]);
  const auto y = static_cast<unsigned char>(b[i]);
  // UTF-8 byte order is code point order. UTF-16 differs only between a supplementary
  // character (lead byte F0-F4, surrogates D800-DBFF) and U+E000-U+FFFF (lead byte EE-EF),
  // and only when the first difference is at the lead byte of both.
  const bool x_supplementary = x >= 0xF0;
  const bool y_supplementary = y >= 0xF0;
  const bool x_high_bmp = x == 0xEE || x == 0xEF;
  const bool y_high_bmp = y == 0xEE || y == 0xEF;
  if (x_supplementary && y_high_bmp) return true;
  if (y_supplementary && x_high_bmp) return false;
  return x < y;
}

void CanonicalWriter::write(element root, const Options& options, std::string& out) {
  out_ = &out;
  options_ = options;
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
}

// What to do with a member or element whose selection node is `child` (nullptr when no
// pointer goes there), inside a value that is `selected` or not.
CanonicalWriter::Pick CanonicalWriter::pick(const SelectionNode* child, bool selected) {
  if (child == nullptr) return selected ? Pick::kWrite : Pick::kSkip;
  if (child->excluded) return Pick::kSkip;
  if (child->include_id >= 0) {
    include_hits_[static_cast<std::size_t>(child->include_id)] = true;
    return Pick::kWrite;
  }
  return selected ? Pick::kWrite : Pick::kProbe;  // a probed container is kept if it selects something
}

bool CanonicalWriter::write_entry(const std::string_view* key, element value, std::size_t depth,
                                  const SelectionNode* child, bool selected, bool first) {
  const Pick choice = pick(child, selected);
  if (choice == Pick::kSkip) return false;
  if (choice == Pick::kProbe && !value.is_object() && !value.is_array()) return false;
  std::string& out = *out_;
  const std::size_t mark = out.size();
  const std::size_t selected_before = selected_values_;
  if (!first) out.push_back(',');
  if (key != nullptr) {
    write_string(*key);
    out.push_back(':');
  }
  write_value(value, depth, child, choice == Pick::kWrite);
  if (choice == Pick::kProbe && selected_values_ == selected_before) {
    out.resize(mark);
    return false;
  }
  return true;
}

void CanonicalWriter::write_value(element value, std::size_t depth, const SelectionNode* node, bool selected) {
  if (selected) ++selected_values_;
  std::string& out = *out_;
  switch (value.type()) {
    case element_type::OBJECT:
      write_object(value.get_object().value_unsafe(), depth + 1, node, selected);
      break;
    case element_type::ARRAY:
      write_array(value.get_array().value_unsafe(), depth + 1, node, selected);
      break;
    case element_type::STRING:
      write_string(value.get_string().value_unsafe());
      break;
    case element_type::INT64:
      append_integer(out, value.get_int64().value_unsafe());
      break;
    case element_type::UINT64:
      append_integer(out, value.get_uint64().value_unsafe());
      break;
    case element_type::DOUBLE:
      if (options_.form == CanonicalForm::kRfc8785) {
        append_ecmascript_number(out, value.get_double().value_unsafe());
      } else {
        append_python_float(out, value.get_double().value_unsafe());
      }
      break;
    case element_type::BOOL:
      out.append(value.get_bool().value_unsafe() ? "true" : "false");
      break;
    case element_type::NULL_VALUE:
      out.append("null");
      break;
  }
}

void CanonicalWriter::write_object(simdjson::dom::object object, std::size_t depth, const SelectionNode* node,
                                   bool selected) {
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  const std::size_t begin = members_.size();
  for (const simdjson::dom::key_value_pair field : object) members_.push_back(Member{field.key, field.value});
  const std::size_t end = members_.size();
  const auto first = members_.begin() + static_cast<std::ptrdiff_t>(begin);
  const auto last = members_.begin() + static_cast<std::ptrdiff_t>(end);
  if (options_.form == CanonicalForm::kRfc8785) {
    std::sort(first, last, [](const Member& a, const Member& b) { return utf16_less(a.key, b.key); });
  } else {  // Python sorts by code point, which is UTF-8 byte order
    std::sort(first, last, [](const Member& a, const Member& b) { return a.key < b.key; });
  }
  if (std::adjacent_find(first, last, [](const Member& a, const Member& b) { return a.key == b.key; }) != last) {
    throw PayloadError("duplicate JSON member name");
  }
  out_->push_back('{');
  bool empty = true;
  for (std::size_t i = begin; i < end; ++i) {
    const Member member = members_[i];  // members_ may grow while the value is written
    const SelectionNode* child = node != nullptr ? node->child(member.key) : nullptr;
    if (write_entry(&member.key, member.value, depth, child, selected, empty)) empty = false;
  }
  out_->push_back('}');
  members_.resize(begin);
}

void CanonicalWriter::write_array(simdjson::dom::array array, std::size_t depth, const SelectionNode* node,
                                  bool selected) {
  if (depth > options_.max_depth) throw PayloadError("JSON nesting deeper than the limit");
  out_->push_back('[');
  bool empty = true;
  std::size_t index = 0;
  for (const element item : array) {
    const SelectionNode* child = nullptr;
    if (node != nullptr) {
      char token[24];
      const auto result = std::to_chars(token, token + sizeof token, index);
      child = node->child(std::string_view(token, static_cast<std::size_t>(result.ptr - token)));
    }
    if (write_entry(nullptr, item, depth, child, selected, empty)) empty = false;
    ++index;
  }
  out_->push_back(']');
}

void CanonicalWriter::write_string(std::string_view text) {
  if (options_.form == CanonicalForm::kPythonJsonDumps) {
    write_ascii_string(text);
    return;
  }
  std::string& out = *out_;
  out.push_back('"');
  const char* run = text.data();
  const char* const end = text.data() + text.size();
  for (const char* p = run; p != end; ++p) {
    const auto byte = static_cast<unsigned char>(*p);
    if (const char kind = kRfcEscapes[byte]; kind != 0) {
      out.append(run, p);
      append_escape(out, byte, kind);
      run = p + 1;
    }
  }
  out.append(run, end);
  out.push_back('"');
}

// Python json.dumps with ensure_ascii: printable ASCII raw, the short escapes, everything else
// as lowercase \uXXXX (UTF-16 surrogate pairs above U+FFFF). `text` is valid UTF-8.
void CanonicalWriter::write_ascii_string(std::string_view text) {
  std::string& out = *out_;
  out.push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* const end = p + text.size();
  const auto* run = p;
  while (p != end) {
    const unsigned char byte = *p;
    if (byte >= 0x20 && byte < 0x7F && byte != '"' && byte != '\\') {
      ++p;
      continue;
    }
    out.append(reinterpret_cast<const char*>(run), reinterpret_cast<const char*>(p));
    if (byte < 0x80) {
      const char kind = kRfcEscapes[byte];
      append_escape(out, byte, kind == 0 ? 'u' : kind);  // kind 0 here is DEL (0x7F)
      ++p;
    } else {
      std::uint32_t code_point = 0;
      if (byte < 0xE0) {
        code_point = (byte & 0x1Fu) << 6 | (p[1] & 0x3Fu);
        p += 2;
      } else if (byte < 0xF0) {
        code_point = (byte & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
        p += 3;
      } else {
        code_point = (byte & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
        p += 4;
      }
      if (code_point >= 0x10000) {
        code_point -= 0x10000;
        append_u_escape(out, 0xD800 + (code_point >> 10));
        append_u_escape(out, 0xDC00 + (code_point & 0x3FF));
      } else {
        append_u_escape(out, code_point);
      }
    }
    run = p;
  }
  out.append(reinterpret_cast<const char*>(run), reinterpret_cast<const char*>(end));
  out.push_back('"');
}

}  // namespace idem::detail
