// Every payload problem is an idem::PayloadError with the byte offset where it applies.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

// The offset of the PayloadError `json` raises (nullopt when it has none); fails when nothing
// is thrown or the message lacks `what`.
std::optional<std::size_t> error_offset(const std::string& json, const std::string& what,
                                        const FingerprintOptions& options = {}) {
  try {
    (void)Fingerprinter(options).canonicalize(json);
  } catch (const PayloadError& error) {
    EXPECT_NE(std::string(error.what()).find(what), std::string::npos) << error.what();
    return error.offset();
  }
  ADD_FAILURE() << "no PayloadError for " << json;
  return std::nullopt;
}

TEST(PayloadErrors, InvalidJsonNamesTheOffset) {
  EXPECT_EQ(error_offset(R"({"a":1,})", "unexpected character '}'"), 7u);
  EXPECT_EQ(error_offset(R"([1,2)", "unexpected end"), 4u);
  EXPECT_EQ(error_offset(R"({"a":01})", "unexpected character '1'"), 6u);
  EXPECT_EQ(error_offset(R"({"a":1} x)", "trailing content"), 8u);
  EXPECT_EQ(error_offset("\"a\tb\"", "control character"), 2u);
  EXPECT_EQ(error_offset(R"("\x")", "invalid escape"), 1u);
  EXPECT_EQ(error_offset("", "unexpected end"), 0u);
}

TEST(PayloadErrors, MessagesNeverCarryARawNonPrintableByte) {
  EXPECT_EQ(error_offset("\xEF\xBB\xBF{}", "unexpected byte 0xEF"), 0u);  // a UTF-8 BOM
  EXPECT_EQ(error_offset("[\x01]", "unexpected byte 0x01"), 1u);
}

TEST(PayloadErrors, InvalidUtf8NamesTheOffset) {
  EXPECT_EQ(error_offset("{\"a\":\"ok\xC3\"}", "invalid UTF-8"), 8u);
  EXPECT_EQ(error_offset("\"\xED\xA0\x80\"", "invalid UTF-8"), 1u);      // an encoded surrogate
  EXPECT_EQ(error_offset("\"\xC0\xAF\"", "invalid UTF-8"), 1u);          // overlong
  EXPECT_EQ(error_offset("\"\xF4\x90\x80\x80\"", "invalid UTF-8"), 1u);  // above U+10FFFF
}

TEST(PayloadErrors, LoneSurrogateEscapes) {
  EXPECT_EQ(error_offset(R"(["\uD800"])", "lone surrogate"), 2u);
  EXPECT_EQ(error_offset(R"(["ab\uDC00"])", "lone surrogate"), 4u);
  EXPECT_EQ(error_offset(R"(["\uD800\u0041"])", "lone surrogate"), 2u);
  EXPECT_EQ(error_offset(R"(["\uDE00\uD83D"])", "lone surrogate"), 2u);
  EXPECT_EQ(canonicalize_json(R"("\ud83d\ude00")"), "\"\xF0\x9F\x98\x80\"");
}

TEST(PayloadErrors, DuplicateMemberNamesAfterUnescaping) {
  EXPECT_EQ(error_offset(R"({"a":1,"b":{"x":1,"x":2}})", "duplicate JSON member name \"x\""), 18u);
  EXPECT_EQ(error_offset(R"({"é":1,"\u00e9":2})", "duplicate"), 8u);
  // The same name in different objects is fine.
  EXPECT_EQ(canonicalize_json(R"({"a":{"a":1},"b":{"a":2}})"), R"({"a":{"a":1},"b":{"a":2}})");
}

// The payload as a whole must be valid, whatever the selection leaves out of the digest: an
// exclude or an include does not start or stop rejecting traffic.
TEST(PayloadErrors, ADuplicateNameOrDeepNestingTheSelectionLeavesOutIsStillAnError) {
  const std::string duplicate = R"({"x":{"a":1,"a":2}})";
  EXPECT_EQ(error_offset(duplicate, "duplicate JSON member name \"a\"", {.exclude = {"/x"}}), 12u);
  EXPECT_EQ(error_offset(R"({"x":{"a":1,"\u0061":2}})", "duplicate", {.exclude = {"/x"}}), 12u);
  EXPECT_EQ(error_offset(R"({"y":1,"x":{"a":1,"a":2}})", "duplicate", {.include = {"/y"}}), 18u);
  EXPECT_EQ(error_offset(R"({"x":{"k":{"z":1,"z":2}},"y":1})", "duplicate", {.exclude = {"/x/k"}}),
            17u);
  const std::string deep =
      R"({"x":)" + std::string(200, '[') + std::string(200, ']') + R"(,"y":1})";
  EXPECT_EQ(error_offset(deep, "nesting deeper than the limit of 128", {.exclude = {"/x"}}), 132u);
  EXPECT_EQ(error_offset(deep, "nesting deeper", {.include = {"/y"}}), 132u);
  EXPECT_EQ(Fingerprinter({.exclude = {"/x"}}).canonicalize(R"({"x":{"a":{"b":[1]}},"y":1})"),
            R"({"y":1})");
}

// A duplicate member name is payload text: quoted with every byte that is not printable ASCII
// as \xHH, and cut after 64 bytes, so a client cannot write lines into a log or a 400 answer.
TEST(PayloadErrors, ADuplicateNameIsQuotedEscapedAndBoundedInTheMessage) {
  // As JSON text: CR, LF and ESC escaped; the decoded name holds them raw.
  const std::string name = R"(x\r\nLOG: forged\u001b[31m)" + std::string(5000, 'n');
  try {
    (void)canonicalize_json("{\"" + name + "\":1,\"" + name + "\":2}");
    ADD_FAILURE() << "no PayloadError";
  } catch (const PayloadError& error) {
    const std::string what = error.what();
    EXPECT_EQ(what.find_first_of(std::string("\r\n\x1b\0", 4)), std::string::npos) << what;
    EXPECT_NE(what.find(R"("x\x0D\x0ALOG: forged\x1B[31mnnn)"), std::string::npos) << what;
    EXPECT_LT(what.size(), 200u) << what;
    EXPECT_NE(what.find("...\" at byte"), std::string::npos) << what;
  }
}

TEST(PayloadErrors, NestingLimitWithoutStackOverflow) {
  const auto nested = [](std::size_t depth) {
    return std::string(depth, '[') + std::string(depth, ']');
  };
  EXPECT_NO_THROW((void)canonicalize_json(nested(128)));
  EXPECT_EQ(error_offset(nested(129), "nesting deeper than the limit of 128"), 128u);
  EXPECT_EQ(error_offset(nested(100000), "nesting deeper"), 128u);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_EQ(error_offset(objects, "nesting deeper"), 128u * 5);
  EXPECT_EQ(error_offset(nested(6), "nesting deeper than the limit of 5", {.max_depth = 5}), 5u);
  EXPECT_NO_THROW((void)Fingerprinter({.max_depth = 1024}).canonicalize(nested(1024)));
}

TEST(PayloadErrors, SizeLimit) {
  const std::string big = "\"" + std::string((std::size_t{1} << 20) - 2, 'x') + "\"";
  EXPECT_NO_THROW((void)canonicalize_json(big));
  EXPECT_EQ(error_offset(big + " ", "over the limit of 1048576"), std::size_t{1} << 20);
  EXPECT_EQ(error_offset("[1,2,3]", "over the limit of 4", {.max_bytes = 4}), 4u);
}

TEST(PayloadErrors, NumbersBeyondTheRangeOfADouble) {
  EXPECT_EQ(error_offset("{\"a\":1e400}", "out of the range of a double"), 5u);
  EXPECT_EQ(error_offset("[-1.5E+309]", "out of the range of a double"), 1u);
  EXPECT_EQ(error_offset("[0,1.8e308]", "out of the range of a double"), 3u);
  EXPECT_EQ(canonicalize_json("[1e-400,-1e-400,0.0000001e-320]"), "[0,0,0]");  // as in JavaScript
  EXPECT_EQ(canonicalize_json("[1.7976931348623157e308]"), "[1.7976931348623157e+308]");
}

TEST(PayloadErrors, AbsentIncludeUnderTheErrorPolicy) {
  const Fingerprinter fp({.include = {"/a", "/b/c"}, .absent_include = AbsentInclude::kError});
  EXPECT_EQ(fp.canonicalize(R"({"a":1,"b":{"c":2}})"), R"({"a":1,"b":{"c":2}})");
  try {
    (void)fp.canonicalize(R"({"a":1,"b":{"d":2}})");
    ADD_FAILURE() << "absent include accepted";
  } catch (const PayloadError& error) {
    EXPECT_NE(std::string(error.what()).find("\"/b/c\" matches nothing"), std::string::npos)
        << error.what();
    EXPECT_FALSE(error.offset().has_value());
  }
}

}  // namespace
}  // namespace idem
