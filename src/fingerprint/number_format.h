// Number forms of the canonical writers: ECMAScript Number::toString (RFC 8785 section 3.2.2.3)
// and Python's float repr (the python_json_dumps form).
#pragma once

#include <cstddef>
#include <string_view>

namespace idem::detail {

/// Longest text the writers below produce ("-0.0000033333333333333333",
/// "-1.2345678901234567e+308").
inline constexpr std::size_t kMaxNumberText = 32;

/// Writes `value` (finite) at `out` as ECMAScript Number::toString does: shortest round-trip
/// digits, `-0` as `0`, exponent form `1e+21` / `1e-7` outside [1e-6, 1e21). Returns the end.
char* write_ecmascript_number(char* out, double value);

/// Writes `value` (finite) at `out` as Python's repr(float): shortest round-trip digits, `25.0`,
/// `-0.0`, exponent form `1e-05` / `1.5e+16` outside [1e-4, 1e16). Returns the end.
char* write_python_float(char* out, double value);

}  // namespace idem::detail
