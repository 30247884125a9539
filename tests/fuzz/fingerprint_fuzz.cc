// libFuzzer target for the payload fingerprint. For every input, in both canonical forms:
//   - no crash, no sanitizer report; failures are idem::PayloadError only;
//   - the strict scanner agrees with the fast path: a payload is accepted iff the scanner finds
//     no problem, and a rejected payload's error names a byte offset inside it;
//   - canon(canon(x)) == canon(x);
//   - the canonical bytes parse back to a value equal to the input's.
#include <simdjson.h>

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

// `json` with ".0" after each integer literal of 19 or more digits: RFC 8785 writes doubles in
// (-1e21, -2^63) and [2^64, 1e21) as integers (and accepts them back), which a plain simdjson
// parse rejects.
std::string as_floats(std::string_view json) {
  const auto number_char = [](char c) {
    return std::string_view("0123456789.eE+-").find(c) != std::string_view::npos;
  };
  std::string out;
  bool in_string = false;
  std::size_t digits = 0;  // of the integer part of the number being read, if it starts one
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    out.push_back(c);
    if (in_string) {
      if (c == '\\' && i + 1 < json.size()) out.push_back(json[++i]);
      if (c == '"') in_string = false;
      continue;
    }
    in_string = c == '"';
    const bool starts = i == 0 || !number_char(json[i - 1]);
    if (c >= '0' && c <= '9' &&
        (digits > 0 || starts ||
         (i > 0 && json[i - 1] == '-' && (i == 1 || !number_char(json[i - 2]))))) {
      ++digits;
    } else {
      digits = 0;
    }
    const char next = i + 1 < json.size() ? json[i + 1] : ' ';
    if (digits >= 19 && !number_char(next)) out += ".0";
  }
  return out;
}

void fuzz_form(std::string_view json, idem::CanonicalForm form) {
  const idem::Fingerprinter fingerprinter({.form = form});
  const auto problem = idem::detail::find_payload_problem(json, fingerprinter.options().max_depth,
                                                          form == idem::CanonicalForm::kRfc8785);
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
  check(original_parser.parse(as_floats(json)).get(original) == simdjson::SUCCESS,
        "input does not parse");
  check(canonical_parser.parse(as_floats(canonical)).get(reparsed) == simdjson::SUCCESS,
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
