// Number forms of the canonical writers: ECMAScript Number::toString (RFC 8785 section 3.2.2.3)
// and Python's float repr (the python_json_dumps form).
#pragma once

#include <cstdint>
#include <string>

namespace idem::detail {

/// Appends `value` (finite) as ECMAScript Number::toString does: shortest round-trip digits,
/// `-0` as `0`, exponent form `1e+21` / `1e-7` outside [1e-6, 1e21).
void append_ecmascript_number(std::string& out, double value);

/// Appends `value` (finite) as Python's repr(float): shortest round-trip digits, `25.0`,
/// `-0.0`, exponent form `1e-05` / `1.5e+16` outside [1e-4, 1e16).
void append_python_float(std::string& out, double value);

/// Appends the exact decimal digits of an integer.
void append_integer(std::string& out, std::int64_t value);
void append_integer(std::string& out, std::uint64_t value);

}  // namespace idem::detail
