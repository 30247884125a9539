// Members whose string value is a JSON document (FingerprintOptions::embedded_json), on the event
// shapes of HTTP-triggered functions, and holds_value(): what a fallback key can be made of.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

// A Function Compute HTTP trigger event (event function), as the platform delivers it: the
// request body as a string, base64 when isBase64Encoded is true.
std::string fc_http_event(const std::string& body, bool base64, const std::string& request_id) {
  return R"({"version":"v1","rawPath":"/refund","headers":{"Content-Type":"application/json",)"
         R"("X-Forwarded-Proto":"https"},"queryParameters":{},"body":")" +
         body + R"(","isBase64Encoded":)" + (base64 ? "true" : "false") +
         R"(,"requestContext":{"accountId":"1234567890","domainName":"t-1.cn-hangzhou.fcapp.run",)"
         R"("domainPrefix":"t-1","http":{"method":"POST","path":"/refund","protocol":"HTTP/1.1",)"
         R"("sourceIp":"11.11.11.11","userAgent":"curl/7.88.1"},"requestId":")" +
         request_id + R"(","time":"2026-12-02T06:41:11Z","timeEpoch":"1764657671895"}})";
}

FingerprintOptions http_body_options() {
  return {.include = {"/body"},
          .embedded_json = {{.pointer = "/body", .base64_flag = "/isBase64Encoded"}}};
}

TEST(EmbeddedJson, AnHttpTriggerEventsBodyIsSelectedAsJson) {
  const Fingerprinter fp(http_body_options());
  EXPECT_EQ(fp.canonicalize(fc_http_event(R"({\"orderId\":\"o-7\",\"amount\":10})", false, "1")),
            R"({"body":{"amount":10,"orderId":"o-7"}})");
}

TEST(EmbeddedJson, Base64AndPlainBodiesOfOneRequestShareAFingerprintAcrossDeliveries) {
  const Fingerprinter fp(http_body_options());
  // {"orderId":"o-7","amount":10}, base64.
  EXPECT_EQ(fp.fingerprint(fc_http_event(R"({\"orderId\":\"o-7\",\"amount\":10})", false, "1")),
            fp.fingerprint(fc_http_event("eyJvcmRlcklkIjoiby03IiwiYW1vdW50IjoxMH0=", true, "2")));
  EXPECT_NE(fp.fingerprint(fc_http_event(R"({\"orderId\":\"o-7\",\"amount\":10})", false, "1")),
            fp.fingerprint(fc_http_event(R"({\"orderId\":\"o-7\",\"amount\":11})", false, "1")));
}

TEST(EmbeddedJson, AnIncludeReachesInsideTheBodyOfAnApiGatewayProxyEvent) {
  const Fingerprinter fp(
      {.include = {"/body/order/id"},
       .embedded_json = {{.pointer = "/body", .base64_flag = "/isBase64Encoded"}}});
  const std::string event =
      R"({"resource":"/refund","httpMethod":"POST","headers":{"Host":"api.example.com"},)"
      R"("requestContext":{"requestId":"c6af9ac6-7b61-11e6-9a41-93e8deadbeef"},)"
      R"("body":"{\"order\":{\"id\":\"o-7\",\"lines\":[1,2]}}","isBase64Encoded":false})";
  EXPECT_EQ(fp.canonicalize(event), R"({"body":{"order":{"id":"o-7"}}})");
}

TEST(EmbeddedJson, AMemberThatIsAbsentNotAStringOrEmptyIsLeftAsIs) {
  const Fingerprinter fp({.embedded_json = {{.pointer = "/body"}}});
  EXPECT_EQ(fp.canonicalize(R"({"a":1})"), R"({"a":1})");
  EXPECT_EQ(fp.canonicalize(R"({"body":{"b":1}})"), R"({"body":{"b":1}})");
  EXPECT_EQ(fp.canonicalize(R"({"body":null})"), R"({"body":null})");
  EXPECT_EQ(fp.canonicalize(R"({"body":""})"), R"({"body":""})");
  EXPECT_EQ(fp.canonicalize(R"({"body" : "[1, 2]" , "z":0})"), R"({"body":[1,2],"z":0})");
}

TEST(EmbeddedJson, ALaterMemberMayLieInsideAnEarlierOnesDocument) {
  const Fingerprinter fp({.embedded_json = {{.pointer = "/body"}, {.pointer = "/body/inner"}}});
  EXPECT_EQ(fp.canonicalize(R"({"body":"{\"inner\":\"{\\\"x\\\":1}\"}"})"),
            R"({"body":{"inner":{"x":1}}})");
}

TEST(EmbeddedJson, AStringThatHoldsNoJsonOrNoBase64IsAPayloadErrorNamingTheMember) {
  const Fingerprinter fp(http_body_options());
  try {
    (void)fp.fingerprint(fc_http_event("amount=10", false, "1"));
    FAIL() << "no error";
  } catch (const PayloadError& e) {
    EXPECT_NE(std::string(e.what()).find("/body"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)fp.fingerprint(fc_http_event("***", true, "1")), PayloadError);
  EXPECT_THROW((void)fp.fingerprint(fc_http_event("eyJh", true, "1")), PayloadError);  // {"a
}

// A problem the canonical writer finds inside a decoded document (a duplicate member name,
// nesting too deep) names the member and its offset in the decoded text, as one simdjson
// rejects does; the offset is not into the payload.
TEST(EmbeddedJson, AProblemInsideTheDocumentNamesTheMemberAndItsOffsetInTheDecodedText) {
  const Fingerprinter fp(http_body_options());
  // {"orderId":1,"orderId":2}, escaped in the string, and base64-encoded.
  for (const auto& [body, base64] :
       {std::pair<std::string, bool>{R"({\"orderId\":1,\"orderId\":2})", false},
        {"eyJvcmRlcklkIjoxLCJvcmRlcklkIjoyfQ==", true}}) {
    try {
      (void)fp.fingerprint(fc_http_event(body, base64, "1"));
      ADD_FAILURE() << "no error";
    } catch (const PayloadError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the string at /body does not hold a JSON document: duplicate JSON "
                          "member name \"orderId\" at byte 13 of it"),
                std::string::npos)
          << what;
      EXPECT_FALSE(e.offset().has_value()) << what;
    }
  }
  const Fingerprinter shallow({.embedded_json = {{.pointer = "/body"}}, .max_depth = 4});
  EXPECT_NO_THROW((void)shallow.canonicalize(R"({"body":"[[[1]]]"})"));  // 1 + 3 levels
  try {
    (void)shallow.canonicalize(R"({"body":"[[[[1]]]]"})");  // 1 + 4 levels
    ADD_FAILURE() << "no error";
  } catch (const PayloadError& e) {
    EXPECT_NE(std::string(e.what()).find("/body does not hold a JSON document: JSON nesting deeper "
                                         "than the limit of 3 at byte 3 of it"),
              std::string::npos)
        << e.what();
  }
}

TEST(EmbeddedJson, BadOptionsAreConfigErrorsAndTheOptionsAreInTheTag) {
  EXPECT_THROW(Fingerprinter({.embedded_json = {{.pointer = ""}}}), ConfigError);
  EXPECT_THROW(Fingerprinter({.embedded_json = {{.pointer = "body"}}}), ConfigError);
  EXPECT_THROW(Fingerprinter({.embedded_json = {{.pointer = "/body", .base64_flag = "x"}}}),
               ConfigError);
  EXPECT_NE(Fingerprinter({.embedded_json = {{.pointer = "/body"}}}).options_tag(),
            Fingerprinter().options_tag());
  EXPECT_NE(Fingerprinter({.embedded_json = {{.pointer = "/body"}}}).options_tag(),
            Fingerprinter({.embedded_json = {{.pointer = "/body", .base64_flag = "/b64"}}})
                .options_tag());
}

TEST(HoldsValue, OnlyNumbersBooleansAndNonEmptyStringsAreValues) {
  for (const char* empty : {"", "null", R"("")", "[]", "{}", R"({"id":null})",
                            R"({"a":{"b":[null,"",{},[]]}})", R"({"":""})"}) {
    EXPECT_FALSE(holds_value(empty)) << empty;
  }
  for (const char* value : {"0", "false", "true", R"("x")", R"({"a":[null,0]})", R"(["\""])",
                            R"({"k\":":"v"})", "-1.5e3"}) {
    EXPECT_TRUE(holds_value(value)) << value;
  }
}

TEST(HoldsValue, TheWindowSaysWhenASelectionHoldsNothing) {
  const Fingerprinter fp({.include = {"/id"}});
  EXPECT_TRUE(fp.fingerprint_window(R"({"refund":10})", "u", {}).selects_nothing);
  EXPECT_TRUE(fp.fingerprint_window(R"({"id":""})", "u", {}).selects_nothing);
  EXPECT_FALSE(fp.fingerprint_window(R"({"id":"o-7"})", "u", {}).selects_nothing);
}

}  // namespace
}  // namespace idem
