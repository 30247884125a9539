#include <gtest/gtest.h>

#include <string>

#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/memory_guard.h"
#include "idem/request_id.h"

namespace idem {
namespace {

TEST(RequestIdFromJson, ReadsTheDefaultMember) {
  EXPECT_EQ(request_id_from_json(R"({"amount":5,"requestId":"abc-1"})"), "abc-1");
  EXPECT_EQ(request_id_from_json(R"({"amount":5})"), std::nullopt);
  EXPECT_EQ(request_id_from_json(R"({"requestId":null})"), std::nullopt);
  EXPECT_EQ(request_id_from_json(R"({"request\u0049d":"esc-1"})"), "esc-1");  // escaped name
  EXPECT_EQ(request_id_from_json(R"([1,2])"), std::nullopt);
}

TEST(RequestIdFromJson, FollowsJsonPointers) {
  const std::string payload =
      R"({"meta":{"id":"m-1"},"items":[{"id":"i-0"},{"id":"i-1"}],"a/b":{"c~d":"e-1"}})";
  EXPECT_EQ(request_id_from_json(payload, "/meta/id"), "m-1");
  EXPECT_EQ(request_id_from_json(payload, "/items/1/id"), "i-1");
  EXPECT_EQ(request_id_from_json(payload, "/items/2/id"), std::nullopt);
  EXPECT_EQ(request_id_from_json(payload, "/items/01/id"), std::nullopt);  // not an index
  EXPECT_EQ(request_id_from_json(payload, "/a~1b/c~0d"), "e-1");
  EXPECT_EQ(request_id_from_json(payload, "/meta/id/deeper"), std::nullopt);
}

TEST(RequestIdFromJson, RejectsBadValuesPayloadsAndPointers) {
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":7})"), InvalidRequestId);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a\nb"})"), InvalidRequestId);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":""})"), InvalidRequestId);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a","requestId":"b"})"), PayloadError);
  EXPECT_THROW((void)request_id_from_json(R"({"m":{"id":"a"},"m":{"id":"b"}})", "/m/id"),
               PayloadError);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a")"), PayloadError);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a"} x)"), PayloadError);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a"})", "requestId"), ConfigError);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a"})", ""), ConfigError);
  EXPECT_THROW((void)request_id_from_json(R"({"requestId":"a"})", "/a~2"), ConfigError);
}

// The PayloadError `call` throws; fails the test when it throws none.
template <class Call>
PayloadError payload_error_of(Call call) {
  try {
    call();
  } catch (const PayloadError& error) {
    return error;
  }
  ADD_FAILURE() << "no PayloadError";
  return PayloadError("none");
}

// A malformed payload is reported as the facade's PayloadError reports the same body (the same
// message, with the byte offset), so a consumer that reads the request ID first logs the same
// error as the facade.
TEST(RequestIdFromJson, MalformedJsonIsReportedAsTheFacadeReportsIt) {
  Deduplicator facade([] {
    DeduplicatorOptions options;
    options.guard = std::make_shared<InMemoryGuard>();
    return options;
  }());
  const struct {
    std::string payload;
    std::size_t offset;
  } cases[] = {
      {R"({"requestId":"a")", 16},                   // unexpected end
      {R"({"requestId":"a"} x)", 18},                // trailing content
      {R"({"amount":5,})", 12},                      // unexpected character
      {R"({"requestId":"a","requestId":"b"})", 17},  // duplicate member on the path
      {"{\"requestId\":\"a\xC3\"}", 15},             // invalid UTF-8
  };
  for (const auto& c : cases) {
    const PayloadError mine = payload_error_of([&] { (void)request_id_from_json(c.payload); });
    Request request;
    request.user = "u1";
    request.intent = "refund";
    request.biz_key = "o-1";
    request.payload = c.payload;
    const PayloadError facades =
        payload_error_of([&] { (void)facade.run(request, [] { return std::string(); }); });
    EXPECT_STREQ(mine.what(), facades.what()) << c.payload;
    EXPECT_EQ(mine.offset(), c.offset) << mine.what();
    EXPECT_EQ(facades.offset(), c.offset) << facades.what();
    EXPECT_NE(std::string(mine.what()).find(" at byte " + std::to_string(c.offset)),
              std::string::npos)
        << mine.what();
  }
}

TEST(InjectRequestIdJson, ReplacesOnlyTheValueBytes) {
  const std::string payload = "{ \"a\" : 1,  \"requestId\" : \"old\" , \"b\":[1, 2.50] }\n";
  EXPECT_EQ(inject_request_id_json(payload, "new-1"),
            "{ \"a\" : 1,  \"requestId\" : \"new-1\" , \"b\":[1, 2.50] }\n");
  EXPECT_EQ(inject_request_id_json(R"({"requestId":null,"x":1})", "n-1"),
            R"({"requestId":"n-1","x":1})");
  EXPECT_EQ(inject_request_id_json(R"({"requestId":12 })", "n-2"), R"({"requestId":"n-2" })");
}

TEST(InjectRequestIdJson, AddsAMissingMemberFirstInItsObject) {
  EXPECT_EQ(inject_request_id_json(R"({"a":1})", "id-1"), R"({"requestId":"id-1","a":1})");
  EXPECT_EQ(inject_request_id_json("{}", "id-1"), R"({"requestId":"id-1"})");
  EXPECT_EQ(inject_request_id_json("  { }", "id-1"), R"(  {"requestId":"id-1" })");
  EXPECT_EQ(inject_request_id_json(R"({"meta":{"k":true},"x":[]})", "id-2", "/meta/trace~1id"),
            R"({"meta":{"trace/id":"id-2","k":true},"x":[]})");
  const std::string out = inject_request_id_json(R"({"items":[{"q":1}]})", "id-3", "/items/0/rid");
  EXPECT_EQ(out, R"({"items":[{"rid":"id-3","q":1}]})");
  EXPECT_EQ(request_id_from_json(out, "/items/0/rid"), "id-3");
}

TEST(InjectRequestIdJson, RefusesWhatItCannotDoSafely) {
  EXPECT_THROW((void)inject_request_id_json(R"({"a":1})", "bad id"), InvalidRequestId);
  EXPECT_THROW((void)inject_request_id_json(R"({"a":1})", "id", "/meta/id"), PayloadError);
  EXPECT_THROW((void)inject_request_id_json(R"({"requestId":{"x":1}})", "id"), PayloadError);
  EXPECT_THROW((void)inject_request_id_json(R"({"requestId":"a","requestId":"b"})", "id"),
               PayloadError);
  EXPECT_THROW((void)inject_request_id_json(R"([1])", "id"), PayloadError);
  EXPECT_THROW((void)inject_request_id_json(R"({"a":)", "id"), PayloadError);
}

}  // namespace
}  // namespace idem
