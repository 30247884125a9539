#include <gtest/gtest.h>

#include <set>
#include <string>

#include "idem/errors.h"
#include "idem/request_id.h"

namespace idem {
namespace {

TEST(RequestIdValidation, AcceptsAllowedAlphabetUpTo64Bytes) {
  EXPECT_TRUE(is_valid_request_id("a"));
  EXPECT_TRUE(is_valid_request_id("AZaz09._~:-"));
  EXPECT_TRUE(is_valid_request_id("0190b6a4-6c3e-7d2a-8f00-1234567890ab"));
  EXPECT_TRUE(is_valid_request_id(std::string(64, 'x')));
}

TEST(RequestIdValidation, RejectsEmptyOversizeAndForeignBytes) {
  EXPECT_FALSE(is_valid_request_id(""));
  EXPECT_FALSE(is_valid_request_id(std::string(65, 'x')));
  EXPECT_FALSE(is_valid_request_id("abc\r\nSet-Cookie: s=1"));
  EXPECT_FALSE(is_valid_request_id(std::string("a\0b", 3)));
  EXPECT_FALSE(is_valid_request_id("a b"));
  EXPECT_FALSE(is_valid_request_id("a/b"));
  EXPECT_FALSE(is_valid_request_id("caf\xc3\xa9"));
  EXPECT_FALSE(is_valid_request_id("\"quoted\""));
}

TEST(RequestIdValidation, ValidateThrowsWithoutEchoingInput) {
  EXPECT_NO_THROW(validate_request_id("ok-1"));
  EXPECT_THROW(validate_request_id(""), InvalidRequestId);
  EXPECT_THROW(validate_request_id(std::string(65, 'x')), InvalidRequestId);
  try {
    validate_request_id("abc\r\nSet-Cookie: s=1");
    FAIL() << "no exception";
  } catch (const InvalidRequestId& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\r'), std::string::npos);
    EXPECT_EQ(what.find("Set-Cookie"), std::string::npos);
  }
}

bool is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

TEST(Uuid7, CanonicalLowercaseTextWithVersionAndVariant) {
  Uuid7Generator gen;
  const std::string id = gen.next();
  ASSERT_EQ(id.size(), 36U);
  for (std::size_t i = 0; i < id.size(); ++i) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      EXPECT_EQ(id[i], '-') << i;
    } else {
      EXPECT_TRUE(is_lower_hex(id[i])) << i;
    }
  }
  EXPECT_EQ(id[14], '7');                                     // version
  EXPECT_NE(std::string("89ab").find(id[19]), std::string::npos);  // variant 10xx
  EXPECT_TRUE(is_valid_request_id(id));
}

TEST(Uuid7, StrictlyIncreasingAndUnique) {
  Uuid7Generator gen;
  std::string prev = gen.next();
  std::set<std::string> seen{prev};
  for (int i = 0; i < 100000; ++i) {
    std::string id = gen.next();
    ASSERT_LT(prev, id);
    seen.insert(id);
    prev = std::move(id);
  }
  EXPECT_EQ(seen.size(), 100001U);
}

TEST(SfString, ParsesQuotedStringAndEscapes) {
  EXPECT_EQ(parse_sf_string("\"abc\""), "abc");
  EXPECT_EQ(parse_sf_string("  \"abc\"  "), "abc");
  EXPECT_EQ(parse_sf_string("\"\""), "");
  EXPECT_EQ(parse_sf_string(R"("a\"b\\c")"), "a\"b\\c");
}

TEST(SfString, RejectsEverythingElse) {
  EXPECT_EQ(parse_sf_string("abc"), std::nullopt);          // a token, not a string
  EXPECT_EQ(parse_sf_string("\"abc"), std::nullopt);        // unterminated
  EXPECT_EQ(parse_sf_string("\"a\\nb\""), std::nullopt);    // only \" and \\ escapes
  EXPECT_EQ(parse_sf_string("\"a\\\""), std::nullopt);      // escape eats the closing quote
  EXPECT_EQ(parse_sf_string("\"a\nb\""), std::nullopt);     // control byte
  EXPECT_EQ(parse_sf_string("\"caf\xc3\xa9\""), std::nullopt);  // non-ASCII
  EXPECT_EQ(parse_sf_string("\"a\", \"b\""), std::nullopt);  // a list, not one item
  EXPECT_EQ(parse_sf_string("\"a\"x"), std::nullopt);       // trailing garbage
  EXPECT_EQ(parse_sf_string("\t\"a\""), std::nullopt);      // only SP is discarded
  EXPECT_EQ(parse_sf_string(""), std::nullopt);
}

TEST(RequestIdFromHeaders, IdempotencyKeyWinsAndNamesAreCaseInsensitive) {
  EXPECT_EQ(request_id_from_headers({{"x-request-id", "rid-1"}, {"IDEMPOTENCY-KEY", "\"key-1\""}}),
            "key-1");
  EXPECT_EQ(request_id_from_headers({{"X-REQUEST-ID", "rid-1"}}), "rid-1");
  EXPECT_EQ(request_id_from_headers({{"Content-Type", "application/json"}}), std::nullopt);
}

TEST(RequestIdFromHeaders, InvalidIdempotencyKeyIsRejectedNeverStripped) {
  EXPECT_THROW((void)request_id_from_headers({{"Idempotency-Key", "key-1"}}), InvalidRequestId);
  EXPECT_THROW((void)request_id_from_headers({{"Idempotency-Key", "\"a\nb\""}}), InvalidRequestId);
  EXPECT_THROW((void)request_id_from_headers({{"Idempotency-Key", "\"a b\""}}), InvalidRequestId);
  EXPECT_THROW(
      (void)request_id_from_headers({{"Idempotency-Key", "\"a\""}, {"idempotency-key", "\"a\""}}),
      InvalidRequestId);
}

}  // namespace
}  // namespace idem
