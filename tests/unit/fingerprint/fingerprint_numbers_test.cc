// Number forms: RFC 8785 Appendix B (ECMAScript Number::toString) and Python's float repr.
#include <gtest/gtest.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "fingerprint/number_format.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

std::string ecmascript(std::uint64_t bits) {
  char text[detail::kMaxNumberText];
  return {text, detail::write_ecmascript_number(text, std::bit_cast<double>(bits))};
}

std::string python(double value) {
  char text[detail::kMaxNumberText];
  return {text, detail::write_python_float(text, value)};
}

TEST(NumberForm, Rfc8785AppendixBExamples) {
  EXPECT_EQ(ecmascript(0x0000000000000000), "0");
  EXPECT_EQ(ecmascript(0x8000000000000000), "0");
  EXPECT_EQ(ecmascript(0x0000000000000001), "5e-324");
  EXPECT_EQ(ecmascript(0x8000000000000001), "-5e-324");
  EXPECT_EQ(ecmascript(0x7fefffffffffffff), "1.7976931348623157e+308");
  EXPECT_EQ(ecmascript(0xffefffffffffffff), "-1.7976931348623157e+308");
  EXPECT_EQ(ecmascript(0x4340000000000000), "9007199254740992");
  EXPECT_EQ(ecmascript(0xc340000000000000), "-9007199254740992");
  EXPECT_EQ(ecmascript(0x4430000000000000), "295147905179352830000");
  EXPECT_EQ(ecmascript(0x44b52d02c7e14af5), "9.999999999999997e+22");
  EXPECT_EQ(ecmascript(0x44b52d02c7e14af6), "1e+23");
  EXPECT_EQ(ecmascript(0x44b52d02c7e14af7), "1.0000000000000001e+23");
  EXPECT_EQ(ecmascript(0x444b1ae4d6e2ef4e), "999999999999999700000");
  EXPECT_EQ(ecmascript(0x444b1ae4d6e2ef4f), "999999999999999900000");
  EXPECT_EQ(ecmascript(0x444b1ae4d6e2ef50), "1e+21");
  EXPECT_EQ(ecmascript(0x3eb0c6f7a0b5ed8c), "9.999999999999997e-7");
  EXPECT_EQ(ecmascript(0x3eb0c6f7a0b5ed8d), "0.000001");
  EXPECT_EQ(ecmascript(0x41b3de4355555553), "333333333.3333332");
  EXPECT_EQ(ecmascript(0x41b3de4355555554), "333333333.33333325");
  EXPECT_EQ(ecmascript(0x41b3de4355555555), "333333333.3333333");
  EXPECT_EQ(ecmascript(0x41b3de4355555556), "333333333.3333334");
  EXPECT_EQ(ecmascript(0x41b3de4355555557), "333333333.33333343");
  EXPECT_EQ(ecmascript(0xbecbf647612f3696), "-0.0000033333333333333333");
  EXPECT_EQ(ecmascript(0x43143ff3c1cb0959), "1424953923781206.2");
}

TEST(Rfc8785, Section324SampleCanonicalization) {
  // The complete example of RFC 8785 section 3.2.4 (input of section 3.2.2).
  const std::string input = R"({
    "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
    "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
    "literals": [null, true, false]
  })";
  EXPECT_EQ(canonicalize_json(input),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
            "\"string\":\"\xE2\x82\xAC$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}");
}

TEST(Rfc8785, Section323SortingExample) {
  const std::string input = R"({
    "\u20ac": "Euro Sign",
    "\r": "Carriage Return",
    "\ufb33": "Hebrew Letter Dalet With Dagesh",
    "1": "One",
    "\ud83d\ude00": "Emoji: Grinning Face",
    "\u0080": "Control",
    "\u00f6": "Latin Small Letter O With Diaeresis"
  })";
  EXPECT_EQ(canonicalize_json(input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xC2\x80\":\"Control\","
            "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\",\"\xE2\x82\xAC\":\"Euro Sign\","
            "\"\xF0\x9F\x98\x80\":\"Emoji: Grinning Face\","
            "\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}");
}

TEST(NumberForm, Rfc8785NumbersThroughTheParser) {
  // The same values written as JSON float literals reach the same form end to end.
  EXPECT_EQ(
      canonicalize_json("[-0.0, 4.9406564584124654e-324, 2.9514790517935283e20, 1e23, 1E-6, "
                        "9.9999999999999974e-7, -3.3333333333333333e-6, 1.4249539237812062e15]"),
      "[0,5e-324,295147905179352830000,1e+23,0.000001,9.999999999999997e-7,"
      "-0.0000033333333333333333,1424953923781206.2]");
}

TEST(NumberForm, CanonicalTextOfLargeDoublesCanBeCanonicalizedAgain) {
  // Doubles in [2^53, 1e21) come out as integer digits; read back, an integer literal keeps
  // those digits, so canonical text is a fixed point.
  const std::string canonical = canonicalize_json("[1e20,-1.5e20,123e18,18446744073709551616.0]");
  EXPECT_EQ(
      canonical,
      "[100000000000000000000,-150000000000000000000,123000000000000000000,18446744073709552000]");
  EXPECT_EQ(canonicalize_json(canonical), canonical);
  EXPECT_EQ(canonicalize_json("[-0.097691e20]"), "[-9769100000000000000]");
}

// Integer literals outside [-2^63, 2^64-1] (beyond the parser's own range) keep their exact
// digits: two such order numbers are fingerprinted, and apart.
TEST(NumberForm, IntegerLiteralsOfAnyLengthKeepTheirExactDigits) {
  const std::string wide =
      "[18446744073709551616,-9223372036854775809,"
      "123456789012345678901234567890,-0,100000000000000000001]";
  const std::string expected =
      "[18446744073709551616,-9223372036854775809,"
      "123456789012345678901234567890,0,100000000000000000001]";
  EXPECT_EQ(canonicalize_json(wide), expected);
  // Python's int keeps them too.
  EXPECT_EQ(Fingerprinter({.form = CanonicalForm::kPythonJsonDumps}).canonicalize(wide), expected);
  // Only the number becomes digits: a string holding the same digits stays a string, also
  // after strings with escaped quotes, and excluded members do not shift which is which.
  EXPECT_EQ(Fingerprinter({.exclude = {"/x"}})
                .canonicalize(R"({"s":"a\"b[1,","x":-99999999999999999999,"k":[1,"x"],)"
                              R"("n":123456789012345678901234567890,)"
                              R"("m":"123456789012345678901234567890"})"),
            R"({"k":[1,"x"],"m":"123456789012345678901234567890",)"
            R"("n":123456789012345678901234567890,"s":"a\"b[1,"})");
  // Two order numbers that one double would hold stay two fingerprints (C08 beyond 2^64).
  EXPECT_NE(fingerprint("{\"order\":123456789012345678901234567890}"),
            fingerprint("{\"order\":123456789012345678901234567891}"));
}

TEST(NumberForm, PythonFloatRepr) {
  EXPECT_EQ(python(1e16), "1e+16");
  EXPECT_EQ(python(1.5e16), "1.5e+16");
  EXPECT_EQ(python(1e-05), "1e-05");
  EXPECT_EQ(python(0.0001), "0.0001");
  EXPECT_EQ(python(25.0), "25.0");
  EXPECT_EQ(python(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python(1e22), "1e+22");
  EXPECT_EQ(python(123456789012345.6), "123456789012345.6");
  EXPECT_EQ(python(5e-324), "5e-324");
  EXPECT_EQ(python(1.7976931348623157e+308), "1.7976931348623157e+308");
  EXPECT_EQ(python(-0.0), "-0.0");
  EXPECT_EQ(python(1e15), "1000000000000000.0");
  EXPECT_EQ(python(9999999999999998.0), "9999999999999998.0");
  EXPECT_EQ(python(1e100), "1e+100");
  EXPECT_EQ(python(-1.5e-7), "-1.5e-07");
  EXPECT_EQ(python(0.001234), "0.001234");
}

// The significant digits of a number's text, without sign, point, exponent, leading or
// trailing zeros: "-0.00120e-5" -> "12".
std::string significant_digits(std::string_view text) {
  std::string digits;
  for (const char c : text.substr(0, text.find_first_of("eE"))) {
    if (c >= '0' && c <= '9' && !(digits.empty() && c == '0')) digits.push_back(c);
  }
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  return digits;
}

// Short decimals (m / 10^k) take a fast path; it must give the digits of the general shortest
// round trip (std::to_chars) and read back to the same double, in both forms.
TEST(NumberForm, ShortestDigitsMatchToChars) {
  std::mt19937_64 random(20261130);
  std::uniform_int_distribution<int> exponent(0, 24);
  constexpr double kPowers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,
                                1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17,
                                1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24};
  for (int i = 0; i < 200000; ++i) {
    double value = 0;
    switch (i % 3) {
      case 0:  // a short decimal
        value = static_cast<double>(random() % 1000000000000000) / kPowers[exponent(random)];
        break;
      case 1:  // up to 17 digits
        value = static_cast<double>(random() % 100000000000000000) / kPowers[exponent(random)];
        break;
      default:  // any finite double
        value = std::bit_cast<double>(random());
        if (!std::isfinite(value)) continue;
    }
    if (value == 0) continue;
    char expected[64];
    const auto end =
        std::to_chars(expected, expected + sizeof expected, value, std::chars_format::scientific);
    const std::string want = significant_digits(std::string_view(expected, end.ptr));
    for (const std::string& text :
         {ecmascript(std::bit_cast<std::uint64_t>(value)), python(value)}) {
      ASSERT_EQ(significant_digits(text), want) << text;
      double read = 0;
      std::from_chars(text.data(), text.data() + text.size(), read);
      ASSERT_EQ(read, value) << text;
    }
  }
}

// Decimal literals of up to 17 digits before and after the point, through the parser: each
// comes out as the form of its double (read here with std::from_chars).
TEST(NumberForm, DecimalLiteralsComeOutInTheFormOfTheirDouble) {
  std::mt19937_64 random(5);
  const Fingerprinter python_form({.form = CanonicalForm::kPythonJsonDumps});
  for (int i = 0; i < 100000; ++i) {
    std::string literal = random() % 4 == 0 ? "-" : "";
    const std::size_t integer_digits = random() % 18;
    literal += integer_digits == 0 ? "0" : std::to_string(1 + random() % 9);
    for (std::size_t d = 1; d < integer_digits; ++d)
      literal += static_cast<char>('0' + random() % 10);
    literal += '.';
    const std::size_t zeros = random() % 4 == 0 ? random() % 9 : 0;  // 0.000ddd
    literal += std::string(zeros, '0');
    for (std::size_t d = 0, n = 1 + random() % 17; d < n; ++d)
      literal += static_cast<char>('0' + random() % 10);
    double value = 0;
    std::from_chars(literal.data() + (literal[0] == '-'), literal.data() + literal.size(), value);
    if (literal[0] == '-') value = -value;
    ASSERT_EQ(canonicalize_json(literal), ecmascript(std::bit_cast<std::uint64_t>(value)))
        << literal;
    ASSERT_EQ(python_form.canonicalize(literal), python(value)) << literal;
  }
}

TEST(NumberForm, UnderflowIsZeroAndOverflowAnError) {
  EXPECT_EQ(canonicalize_json("[1e-400,-0.001e-400,0.0e99999999999999999999,100e-326]"),
            "[0,0,0,0]");
  EXPECT_EQ(Fingerprinter({.form = CanonicalForm::kPythonJsonDumps}).canonicalize("[-1e-400]"),
            "[-0.0]");
  EXPECT_EQ(canonicalize_json("[5e-324,123.5e-2]"), "[5e-324,1.235]");
  EXPECT_THROW((void)canonicalize_json("[-0.0001e313]"), PayloadError);
  EXPECT_THROW((void)canonicalize_json("[1e99999999999999999999]"), PayloadError);
}

TEST(NumberForm, LongestTextsFitTheBuffer) {
  EXPECT_LE(ecmascript(0xbecbf647612f3696).size(), detail::kMaxNumberText);
  EXPECT_LE(python(-1.2345678901234567e-300).size(), detail::kMaxNumberText);
  EXPECT_LE(python(-0.00012345678901234567).size(), detail::kMaxNumberText);
  EXPECT_EQ(python(-0.00012345678901234567), "-0.00012345678901234567");
  EXPECT_EQ(ecmascript(std::bit_cast<std::uint64_t>(-1.2345678901234567e-7)),
            "-1.2345678901234566e-7");  // shortest round trip, as Python's repr
}

}  // namespace
}  // namespace idem
