#include "idem/request_id.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "idem/clock.h"
#include "idem/errors.h"

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

TEST(RequestIdOrDigest, KeepsValidIdsAndDigestsInvalidOnes) {
  EXPECT_EQ(request_id_or_digest("ok-1"), "ok-1");
  const std::string digest = request_id_or_digest("a\nb");
  EXPECT_EQ(digest, "sha256~7e18f737311b2dc3b2f269dd78396b03");  // SHA-256, first 128 bits
  EXPECT_TRUE(is_valid_request_id(digest));
  EXPECT_NE(digest, request_id_or_digest("ab"));
  EXPECT_EQ(request_id_or_digest(std::string(10000, 'x')).size(), 39U);
  EXPECT_TRUE(is_valid_request_id(request_id_or_digest("")));
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
  EXPECT_EQ(id[14], '7');                                          // version
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
  EXPECT_EQ(parse_sf_string("abc"), std::nullopt);              // a token, not a string
  EXPECT_EQ(parse_sf_string("\"abc"), std::nullopt);            // unterminated
  EXPECT_EQ(parse_sf_string("\"a\\nb\""), std::nullopt);        // only \" and \\ escapes
  EXPECT_EQ(parse_sf_string("\"a\\\""), std::nullopt);          // escape eats the closing quote
  EXPECT_EQ(parse_sf_string("\"a\nb\""), std::nullopt);         // control byte
  EXPECT_EQ(parse_sf_string("\"caf\xc3\xa9\""), std::nullopt);  // non-ASCII
  EXPECT_EQ(parse_sf_string("\"a\", \"b\""), std::nullopt);     // a list, not one item
  EXPECT_EQ(parse_sf_string("\"a\"x"), std::nullopt);           // trailing garbage
  EXPECT_EQ(parse_sf_string("\t\"a\""), std::nullopt);          // only SP is discarded
  EXPECT_EQ(parse_sf_string(""), std::nullopt);
}

TEST(SfString, ParsesAndIgnoresParameters) {
  EXPECT_EQ(parse_sf_string("\"abc\";a=1"), "abc");
  EXPECT_EQ(parse_sf_string("\"abc\";a;b=?0;c=:AQID:;d=tok/x:y;e=\"s\";f=-1.5;*g=*"), "abc");
  EXPECT_EQ(parse_sf_string("\"abc\"; a=1"), "abc");               // SP after ';' is allowed
  EXPECT_EQ(parse_sf_string("\"abc\";a=123456789012345"), "abc");  // 15 digits
}

// The bare-item types RFC 9651 added to RFC 8941: a Date (§3.3.7) and a Display String
// (§3.3.8). An Idempotency-Key carrying one as a parameter is a valid key, not a 400.
TEST(SfString, ParsesDateAndDisplayStringParameters) {
  EXPECT_EQ(parse_sf_string("\"k-1\";t=@1659578233"), "k-1");
  EXPECT_EQ(parse_sf_string("\"k-1\";t=@-62135596800"), "k-1");
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"f%c3%bc%c3%bc\""), "abc");
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"\""), "abc");
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"100%25 %22sure%22\""), "abc");
  EXPECT_EQ(parse_sf_string("\"abc\";t=@1.5"), std::nullopt);  // a Date is an Integer
  EXPECT_EQ(parse_sf_string("\"abc\";t=@"), std::nullopt);
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"%C3%BC\""), std::nullopt);  // hex is lowercase
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"%c3\""), std::nullopt);     // not UTF-8
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"%g1\""), std::nullopt);
  EXPECT_EQ(parse_sf_string("\"abc\";p=%\"x"), std::nullopt);  // unterminated
  EXPECT_EQ(parse_sf_string("\"abc\";p=%x"), std::nullopt);
  const auto got = extract_request_id({{"Idempotency-Key", "\"k-1\";t=@1659578233"}});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->id, "k-1");
}

TEST(SfString, RejectsMalformedParameters) {
  EXPECT_EQ(parse_sf_string("\"abc\";"), std::nullopt);          // key required
  EXPECT_EQ(parse_sf_string("\"abc\";A=1"), std::nullopt);       // keys are lowercase
  EXPECT_EQ(parse_sf_string("\"abc\";a="), std::nullopt);        // value required after '='
  EXPECT_EQ(parse_sf_string("\"abc\" ;a=1"), std::nullopt);      // no SP before ';'
  EXPECT_EQ(parse_sf_string("\"abc\";a=1.2345"), std::nullopt);  // at most 3 fraction digits
  EXPECT_EQ(parse_sf_string("\"abc\";a=1234567890123456"), std::nullopt);  // 16 digits
  EXPECT_EQ(parse_sf_string("\"abc\";a=?2"), std::nullopt);
  EXPECT_EQ(parse_sf_string("\"abc\";a=:AQID"), std::nullopt);  // unterminated byte sequence
  EXPECT_EQ(parse_sf_string("\"abc\";a=\"x"), std::nullopt);    // unterminated string
}

TEST(SfString, FormatRoundTripsAndRefusesControlBytes) {
  EXPECT_EQ(format_sf_string("key-1"), "\"key-1\"");
  EXPECT_EQ(format_sf_string("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(parse_sf_string(format_sf_string("a\"b\\c")), "a\"b\\c");
  EXPECT_THROW((void)format_sf_string("a\r\nb"), InvalidRequestId);
}

TEST(Uuid7, UsesTheClockAndStaysIncreasingWhenItStandsStillOrStepsBack) {
  auto clock = std::make_shared<ManualClock>(0x0190b6a46c3e);
  Uuid7Generator gen(clock);
  std::string prev = gen.next();
  EXPECT_EQ(prev.substr(0, 13), "0190b6a4-6c3e");
  for (int i = 0; i < 10000; ++i) {
    std::string id = gen.next();
    ASSERT_LT(prev, id);
    prev = std::move(id);
  }
  clock->advance_ms(-5000);
  const std::string after_step_back = gen.next();
  EXPECT_LT(prev, after_step_back);
  EXPECT_EQ(after_step_back.substr(0, 13), "0190b6a4-6c3e");  // the timestamp did not go back
}

Headers all_four() {
  return {{"x-fc-request-id", "fc-1"},
          {"X-Request-ID", "rid-1"},
          {"X-Idempotency-Key", "xik-1"},
          {"Idempotency-Key", "\"ik-1\""}};
}

TEST(ExtractRequestId, FollowsTheDocumentedPrecedence) {
  Headers headers = all_four();
  auto got = extract_request_id(headers);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->id, "ik-1");
  EXPECT_EQ(got->source, RequestIdHeader::kIdempotencyKey);
  std::erase_if(headers, [](const auto& h) { return h.first == "Idempotency-Key"; });
  got = extract_request_id(headers);
  EXPECT_EQ(got->id, "xik-1");
  EXPECT_EQ(got->source, RequestIdHeader::kXIdempotencyKey);
  std::erase_if(headers, [](const auto& h) { return h.first == "X-Idempotency-Key"; });
  got = extract_request_id(headers);
  EXPECT_EQ(got->id, "rid-1");
  EXPECT_EQ(got->source, RequestIdHeader::kXRequestId);
  EXPECT_FALSE(got->replaced);
  std::erase_if(headers, [](const auto& h) { return h.first == "X-Request-ID"; });
  got = extract_request_id(headers);
  EXPECT_EQ(got->id, "fc-1");
  EXPECT_EQ(got->source, RequestIdHeader::kFcRequestId);
  EXPECT_EQ(extract_request_id({{"Content-Type", "application/json"}}), std::nullopt);
}

TEST(ExtractRequestId, HeaderNamesAreCaseInsensitive) {
  EXPECT_EQ(request_id_from_headers({{"IDEMPOTENCY-KEY", "\"a\""}}), "a");
  EXPECT_EQ(request_id_from_headers({{"x-idempotency-key", "b"}}), "b");
  EXPECT_EQ(request_id_from_headers({{"X-REQUEST-ID", "c"}}), "c");
  EXPECT_EQ(request_id_from_headers({{"X-Fc-Request-Id", "d"}}), "d");
  EXPECT_EQ(request_id_from_headers({{"X-Request-IDs", "e"}}), std::nullopt);
}

TEST(ExtractRequestId, InvalidKeysAreRejectedNeverStrippedOrSkipped) {
  // An invalid Idempotency-Key is an error even when a valid lower-precedence ID is present.
  EXPECT_THROW((void)extract_request_id({{"Idempotency-Key", "ik-1"}, {"X-Request-ID", "r"}}),
               InvalidRequestId);  // a token, not an sf-string
  EXPECT_THROW((void)extract_request_id({{"Idempotency-Key", "\"a b\""}}), InvalidRequestId);
  EXPECT_THROW(
      (void)extract_request_id({{"Idempotency-Key", "\"a\""}, {"idempotency-key", "\"a\""}}),
      InvalidRequestId);
  EXPECT_THROW((void)extract_request_id({{"X-Idempotency-Key", "a\nb"}}), InvalidRequestId);
  EXPECT_THROW((void)extract_request_id({{"X-Idempotency-Key", "a"}, {"x-idempotency-key", "b"}}),
               InvalidRequestId);
  EXPECT_THROW((void)extract_request_id({{"x-fc-request-id", ""}}), InvalidRequestId);
}

TEST(ExtractRequestId, InvalidXRequestIdIsReplacedAndReported) {
  const auto generate = [] { return std::string("generated-1"); };
  for (const Headers& headers :
       {Headers{{"X-Request-ID", "abc\r\nSet-Cookie: s=1"}}, Headers{{"X-Request-ID", ""}},
        Headers{{"X-Request-ID", std::string(65, 'a')}},
        Headers{{"X-Request-ID", "a"}, {"x-request-id", "b"}}}) {
    const auto got = extract_request_id(headers, generate);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->id, "generated-1");
    EXPECT_TRUE(got->replaced);
    EXPECT_EQ(got->source, RequestIdHeader::kXRequestId);
  }
  const auto by_default = extract_request_id({{"X-Request-ID", "bad value"}});
  EXPECT_TRUE(by_default->replaced);
  EXPECT_EQ(by_default->id.size(), 36U);  // a UUIDv7
  // A generator that returns an invalid ID is the server's fault, not the client's (no 400).
  EXPECT_THROW(
      (void)extract_request_id({{"X-Request-ID", ""}}, [] { return std::string("bad id"); }),
      ConfigError);
}

TEST(InjectRequestId, ReplacesEveryFieldOfThatNameAndQuotesIdempotencyKey) {
  Headers headers{{"x-request-id", "old"}, {"Accept", "*/*"}, {"X-REQUEST-ID", "older"}};
  inject_request_id(headers, "new-1");
  EXPECT_EQ(headers, (Headers{{"Accept", "*/*"}, {"X-Request-ID", "new-1"}}));
  inject_request_id(headers, "key-1", RequestIdHeader::kIdempotencyKey);
  EXPECT_EQ(headers.back(), (std::pair<std::string, std::string>{"Idempotency-Key", "\"key-1\""}));
  EXPECT_EQ(request_id_from_headers(headers), "key-1");
  EXPECT_THROW(inject_request_id(headers, "a\r\nb"), InvalidRequestId);
  EXPECT_EQ(headers.size(), 3U);  // untouched by the refused injection
}

}  // namespace
}  // namespace idem
