#include "fingerprint/number_format.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace idem::detail {
namespace {

// Shortest round-trip decimal digits of a finite, positive `value`: value = 0.DIGITS × 10^point.
struct Decimal {
  char digits[20];
  int count = 0;
  int point = 0;
};

Decimal shortest_decimal(double value) {
  // to_chars in scientific form without precision gives the shortest round trip: d.ddde±xx.
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  Decimal d;
  const char* p = buf;
  for (; p != result.ptr && *p != 'e'; ++p) {
    if (*p != '.') d.digits[d.count++] = *p;
  }
  int exponent = 0;
  std::from_chars(p + 1 + (p[1] == '+'), result.ptr, exponent);
  d.point = exponent + 1;
  return d;
}

void append_digits(std::string& out, const Decimal& d, int from, int to) {
  out.append(d.digits + from, static_cast<std::size_t>(to - from));
}

// "e" sign |exp|, at least `min_digits` digits.
void append_exponent(std::string& out, int exponent, int min_digits) {
  out.push_back('e');
  out.push_back(exponent < 0 ? '-' : '+');
  const int magnitude = std::abs(exponent);
  if (min_digits == 2 && magnitude < 10) out.push_back('0');
  char buf[8];
  const auto result = std::to_chars(buf, buf + sizeof buf, magnitude);
  out.append(buf, result.ptr);
}

// d[.ddd]e±x
void append_scientific(std::string& out, const Decimal& d, int min_exponent_digits) {
  out.push_back(d.digits[0]);
  if (d.count > 1) {
    out.push_back('.');
    append_digits(out, d, 1, d.count);
  }
  append_exponent(out, d.point - 1, min_exponent_digits);
}

// Fixed notation; `integral_suffix` is appended when there is no fractional part (".0" in Python).
void append_fixed(std::string& out, const Decimal& d, const char* integral_suffix) {
  if (d.point <= 0) {
    out.append("0.");
    out.append(static_cast<std::size_t>(-d.point), '0');
    append_digits(out, d, 0, d.count);
  } else if (d.point < d.count) {
    append_digits(out, d, 0, d.point);
    out.push_back('.');
    append_digits(out, d, d.point, d.count);
  } else {
    append_digits(out, d, 0, d.count);
    out.append(static_cast<std::size_t>(d.point - d.count), '0');
    out.append(integral_suffix);
  }
}

}  // namespace

void append_ecmascript_number(std::string& out, double value) {
  if (value == 0) {  // +0 and -0
    out.push_back('0');
    return;
  }
  if (value < 0) {
    out.push_back('-');
    value = -value;
  }
  const Decimal d = shortest_decimal(value);
  // ECMA-262 Number::toString: n = d.point, k = d.count.
  if (d.point > -6 && d.point <= 21) {
    append_fixed(out, d, "");
  } else {
    append_scientific(out, d, 1);
  }
}

void append_python_float(std::string& out, double value) {
  if (value == 0) {
    out.append(std::signbit(value) ? "-0.0" : "0.0");
    return;
  }
  if (value < 0) {
    out.push_back('-');
    value = -value;
  }
  const Decimal d = shortest_decimal(value);
  // CPython float_repr_style "short": fixed notation when -4 < decpt <= 16.
  if (d.point > -4 && d.point <= 16) {
    append_fixed(out, d, ".0");
  } else {
    append_scientific(out, d, 2);
  }
}

void append_integer(std::string& out, std::int64_t value) {
  char buf[24];
  const auto result = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, result.ptr);
}

void append_integer(std::string& out, std::uint64_t value) {
  char buf[24];
  const auto result = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, result.ptr);
}

}  // namespace idem::detail
