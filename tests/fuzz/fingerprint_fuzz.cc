// libFuzzer target for the payload fingerprint. For every input, in both canonical forms:
//   - no crash, no sanitizer report; failures are idem::PayloadError only;
//   - the strict scanner agrees with the fast path: a payload is accepted iff the scanner finds
//     no problem, and a rejected payload's error names a byte offset inside it;
//   - canon(canon(x)) == canon(x);
//   - the canonical bytes parse back to a value equal to the input's.
#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fingerprint/json_validator.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fingerprint_fuzz: %s\n", what);
    std::abort();
  }
}

bool is_number(element_type type) {
  return type == element_type::INT64 || type == element_type::UINT64 ||
         type == element_type::DOUBLE;
}

// `json` with each integer literal of 19 or more digits (beyond what simdjson holds) turned into
// a string of kWideInteger and its digits: canonical bytes keep those digits exactly.
constexpr std::string_view kWideInteger = "\\u0001wide:";  // "\x01wide:" once parsed

std::string quote_wide_integers(std::string_view json) {
  const auto number_char = [](char c) {
    return std::string_view("0123456789.eE+-").find(c) != std::string_view::npos;
  };
  std::string out;
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < json.size()) out.push_back(json[++i]);
      if (c == '"') in_string = false;
      continue;
    }
    in_string = c == '"';
    if (!(c == '-' || (c >= '0' && c <= '9')) || (i > 0 && number_char(json[i - 1]))) {
      out.push_back(c);
      continue;
    }
    std::size_t end = i + 1;
    while (end < json.size() && number_char(json[end])) ++end;
    const std::string_view token = json.substr(i, end - i);
    const std::size_t digits = token.size() - (token[0] == '-' ? 1 : 0);
    if (digits >= 19 && token.find_first_of(".eE+", 1) == std::string_view::npos) {
      out += "\"" + std::string(kWideInteger) + std::string(token) + "\"";
    } else {
      out += token;
    }
    i = end - 1;
  }
  return out;
}

// A wide integer (see quote_wide_integers) and a double: equal when the digits read as it.
bool wide_integer_equals(element wide, element number) {
  if (wide.type() != element_type::STRING || number.type() != element_type::DOUBLE) return false;
  std::string_view text = wide.get_string().value_unsafe();
  if (text.substr(0, 6) != "\x01wide:") return false;
  text.remove_prefix(6);
  double value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value == number.get_double().value_unsafe();
}

// The number as a double and, when it is an integer, exactly.
bool same_number(element a, element b) {
  if (a.type() != element_type::DOUBLE && b.type() != element_type::DOUBLE) {
    const bool a_negative = a.type() == element_type::INT64 && a.get_int64().value_unsafe() < 0;
    const bool b_negative = b.type() == element_type::INT64 && b.get_int64().value_unsafe() < 0;
    if (a_negative || b_negative)
      return a_negative && b_negative &&
             a.get_int64().value_unsafe() == b.get_int64().value_unsafe();
    return a.get_uint64().value_unsafe() == b.get_uint64().value_unsafe();
  }
  return a.get_double().value_unsafe() ==
         b.get_double().value_unsafe();  // -0 == 0, as RFC 8785 writes it
}

// Structural equality of two parsed values (objects as unordered maps without duplicates).
bool same_value(element a, element b) {
  if (is_number(a.type()) && is_number(b.type())) return same_number(a, b);
  if (wide_integer_equals(a, b) || wide_integer_equals(b, a)) return true;
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case element_type::OBJECT: {
      const auto x = a.get_object().value_unsafe();
      const auto y = b.get_object().value_unsafe();
      if (x.size() != y.size()) return false;
      for (const auto field : x) {
        element other;
        if (y.at_key(field.key).get(other) != simdjson::SUCCESS || !same_value(field.value, other))
          return false;
      }
      return true;
    }
    case element_type::ARRAY: {
      const auto x = a.get_array().value_unsafe();
      const auto y = b.get_array().value_unsafe();
      if (x.size() != y.size()) return false;
      auto it = y.begin();
      for (const element item : x) {
        if (!same_value(item, *it)) return false;
        ++it;
      }
      return true;
    }
    case element_type::STRING:
      return a.get_string().value_unsafe() == b.get_string().value_unsafe();
    case element_type::BOOL:
      return a.get_bool().value_unsafe() == b.get_bool().value_unsafe();
    default:
      return true;  // null
  }
}

void fuzz_form(std::string_view json, idem::CanonicalForm form) {
  const idem::Fingerprinter fingerprinter({.form = form});
  const auto problem = idem::detail::find_payload_problem(json, fingerprinter.options().max_depth);
  std::string canonical;
  try {
    canonical = fingerprinter.canonicalize(json);
  } catch (const idem::PayloadError& error) {
    check(problem.has_value(), "rejected a payload the strict scanner accepts");
    check(error.offset().has_value() && *error.offset() <= json.size(),
          "error without an offset in the payload");
    return;
  }
  check(!problem.has_value(), "accepted a payload the strict scanner rejects");
  check(fingerprinter.canonicalize(canonical) == canonical, "canon(canon(x)) != canon(x)");
  (void)fingerprinter.fingerprint(json, "scope");

  simdjson::dom::parser original_parser;
  simdjson::dom::parser canonical_parser;
  element original;
  element reparsed;
  check(original_parser.parse(quote_wide_integers(json)).get(original) == simdjson::SUCCESS,
        "input does not parse");
  check(canonical_parser.parse(quote_wide_integers(canonical)).get(reparsed) == simdjson::SUCCESS,
        "canonical bytes do not parse");
  check(same_value(original, reparsed), "canonical bytes parse to another value");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  fuzz_form(json, idem::CanonicalForm::kRfc8785);
  fuzz_form(json, idem::CanonicalForm::kPythonJsonDumps);
  return 0;
}
