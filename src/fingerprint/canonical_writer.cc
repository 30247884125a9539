#include "fingerprint/canonical_writer.h"

#include <algorithm>
#include <array>
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

void CanonicalWriter::write(element root, CanonicalForm form, std::size_t max_depth, std::string& out) {
  out_ = &out;
  form_ = form;
  max_depth_ = max_depth;
  members_.clear();
  write_value(root, 0);
}

void CanonicalWriter::write_value(element value, std::size_t depth) {
  std::string& out = *out_;
  switch (value.type()) {
    case element_type::OBJECT:
      write_object(value.get_object().value_unsafe(), depth + 1);
      break;
    case element_type::ARRAY:
      write_array(value.get_array().value_unsafe(), depth + 1);
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
      if (form_ == CanonicalForm::kRfc8785) {
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

void CanonicalWriter::write_object(simdjson::dom::object object, std::size_t depth) {
  if (depth > max_depth_) throw PayloadError("idem: JSON nesting deeper than the limit");
  const std::size_t begin = members_.size();
  for (const simdjson::dom::key_value_pair field : object) members_.push_back(Member{field.key, field.value});
  const std::size_t end = members_.size();
  const auto first = members_.begin() + static_cast<std::ptrdiff_t>(begin);
  const auto last = members_.begin() + static_cast<std::ptrdiff_t>(end);
  if (form_ == CanonicalForm::kRfc8785) {
    std::sort(first, last, [](const Member& a, const Member& b) { return utf16_less(a.key, b.key); });
  } else {  // Python sorts by code point, which is UTF-8 byte order
    std::sort(first, last, [](const Member& a, const Member& b) { return a.key < b.key; });
  }
  if (std::adjacent_find(first, last, [](const Member& a, const Member& b) { return a.key == b.key; }) != last) {
    throw PayloadError("idem: duplicate JSON member name");
  }
  std::string& out = *out_;
  out.push_back('{');
  for (std::size_t i = begin; i < end; ++i) {
    if (i != begin) out.push_back(',');
    const Member member = members_[i];  // members_ may grow while the value is written
    write_string(member.key);
    out.push_back(':');
    write_value(member.value, depth);
  }
  out.push_back('}');
  members_.resize(begin);
}

void CanonicalWriter::write_array(simdjson::dom::array array, std::size_t depth) {
  if (depth > max_depth_) throw PayloadError("idem: JSON nesting deeper than the limit");
  std::string& out = *out_;
  out.push_back('[');
  bool first = true;
  for (const element item : array) {
    if (!first) out.push_back(',');
    first = false;
    write_value(item, depth);
  }
  out.push_back(']');
}

void CanonicalWriter::write_string(std::string_view text) {
  if (form_ == CanonicalForm::kPythonJsonDumps) {
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
