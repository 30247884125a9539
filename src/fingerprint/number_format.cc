#include "fingerprint/number_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>

namespace idem::detail {
namespace {

// Shortest round-trip decimal digits of a finite, positive `value`: value = 0.DIGITS × 10^point.
struct Decimal {
  char digits[20];
  int count = 0;
  int point = 0;
};

// The common case without a general shortest-digits search: `value` is m / 10^k for an integer
// m < 10^15 and k <= 22. Both are exact doubles, so the division is correctly rounded, exactly
// as a parser reads the decimal m·10^-k: that decimal round-trips. Two decimals of at most 15
// significant digits (DBL_DIG) never round to one double, so it is also the shortest round trip
// (after dropping trailing zeros). std::nullopt when no such m, k exists.
std::optional<Decimal> short_decimal(double value) {
  static constexpr double kPowersOfTen[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                            1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                            1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  constexpr double kMaxMantissa = 1e15;
  for (int k = 0; k < static_cast<int>(std::size(kPowersOfTen)); ++k) {
    const double scaled = value * kPowersOfTen[k];
    if (scaled >= kMaxMantissa) return std::nullopt;
    const auto mantissa = static_cast<std::uint64_t>(scaled + 0.5);
    if (mantissa == 0 || static_cast<double>(mantissa) / kPowersOfTen[k] != value) continue;
    Decimal d;
    d.count = static_cast<int>(std::to_chars(d.digits, d.digits + sizeof d.digits, mantissa).ptr -
                               d.digits);
    d.point = d.count - k;
    while (d.digits[d.count - 1] == '0') --d.count;
    return d;
  }
  return std::nullopt;
}

Decimal shortest_decimal(double value) {
  if (const auto d = short_decimal(value)) return *d;
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

char* copy(char* out, const char* from, int count) {
  std::memcpy(out, from, static_cast<std::size_t>(count));
  return out + count;
}

char* fill_zeros(char* out, int count) {
  std::memset(out, '0', static_cast<std::size_t>(count));
  return out + count;
}

// d[.ddd]e±x, the exponent with at least `min_exponent_digits` digits.
char* write_scientific(char* out, const Decimal& d, int min_exponent_digits) {
  *out++ = d.digits[0];
  if (d.count > 1) {
    *out++ = '.';
    out = copy(out, d.digits + 1, d.count - 1);
  }
  const int exponent = d.point - 1;
  *out++ = 'e';
  *out++ = exponent < 0 ? '-' : '+';
  const int magnitude = std::abs(exponent);
  if (min_exponent_digits == 2 && magnitude < 10) *out++ = '0';
  return std::to_chars(out, out + 8, magnitude).ptr;
}

// Fixed notation; `integral_suffix` ends a number without fraction digits (".0" in Python).
char* write_fixed(char* out, const Decimal& d, const char* integral_suffix) {
  if (d.point <= 0) {
    *out++ = '0';
    *out++ = '.';
    out = fill_zeros(out, -d.point);
    return copy(out, d.digits, d.count);
  }
  if (d.point < d.count) {
    out = copy(out, d.digits, d.point);
    *out++ = '.';
    return copy(out, d.digits + d.point, d.count - d.point);
  }
  out = copy(out, d.digits, d.count);
  out = fill_zeros(out, d.point - d.count);
  return copy(out, integral_suffix, static_cast<int>(std::strlen(integral_suffix)));
}

}  // namespace

char* write_ecmascript_number(char* out, double value) {
  if (value == 0) {  // +0 and -0
    *out++ = '0';
    return out;
  }
  if (value < 0) {
    *out++ = '-';
    value = -value;
  }
  const Decimal d = shortest_decimal(value);
  // ECMA-262 Number::toString with n = d.point, k = d.count.
  return d.point > -6 && d.point <= 21 ? write_fixed(out, d, "") : write_scientific(out, d, 1);
}

char* write_python_float(char* out, double value) {
  if (value == 0)
    return copy(out, std::signbit(value) ? "-0.0" : "0.0", std::signbit(value) ? 4 : 3);
  if (value < 0) {
    *out++ = '-';
    value = -value;
  }
  const Decimal d = shortest_decimal(value);
  // CPython float_repr_style "short": fixed notation when -4 < decpt <= 16.
  return d.point > -4 && d.point <= 16 ? write_fixed(out, d, ".0") : write_scientific(out, d, 2);
}

}  // namespace idem::detail
