// The facade's three key forms (key.h: KeyText) and the check every guard and sink applies to a
// key text (validate_key_text): the one home of the key grammar.
#include <gtest/gtest.h>

#include <string>

#include "idem/errors.h"
#include "idem/key.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"

namespace idem {
namespace {

TEST(KeyText, EachFormRoundTripsAndTheFormsNeverCollide) {
  const KeyText business{KeyForm::kBusiness, "u:1", "pay", "o-7"};
  const KeyText by_id{KeyForm::kRequestId, "u:1", "pay", "o-7"};
  const KeyText by_payload{KeyForm::kFallback, "u:1", "pay", "0a1b"};
  EXPECT_EQ(business.encode(), "u%3A1:pay:o-7");
  EXPECT_EQ(business.encode(), (IdempotencyKey{"u:1", "pay", "o-7"}.encode()));
  EXPECT_EQ(by_id.encode(), "id:u%3A1:pay:o-7");
  EXPECT_EQ(by_payload.encode(), "fp:u%3A1:pay:0a1b");
  EXPECT_EQ(by_payload.encode(), fallback_key("u:1", "pay", "0a1b"));
  for (const KeyText& key : {business, by_id, by_payload}) {
    EXPECT_EQ(KeyText::decode(key.encode()), key) << key.encode();
  }
  // A user named "id" with a business key is still a business key: three components.
  EXPECT_EQ(KeyText::decode(KeyText{KeyForm::kBusiness, "id", "i", "b"}.encode()).form,
            KeyForm::kBusiness);
}

TEST(KeyText, DecodeRejectsWhatNoFormWrites) {
  for (const std::string_view bad :
       {"", "a", "a:b", "xx:a:b:c", "fp:a:b:c:d", "id:a:b:{c}", "id:a::c", "a:b:c:d:e"}) {
    EXPECT_THROW((void)KeyText::decode(bad), InvalidKey) << bad;
  }
}

TEST(ValidateKeyText, AcceptsEveryEncodedKeyAndPlainWords) {
  EXPECT_NO_THROW(validate_key_text("order-7"));
  EXPECT_NO_THROW(validate_key_text(IdempotencyKey{"u{1}", "a:b", "c%d"}.encode()));
  EXPECT_NO_THROW(validate_key_text(KeyText{KeyForm::kRequestId, "u", "i", "r"}.encode()));
}

TEST(ValidateKeyText, RejectsHashTagsControlBytesAndMalformedEscapes) {
  for (const std::string_view bad :
       {"", "{x}:i:b", "a}", "a b", "a\n", "a:", ":a", "a::b", "a%", "a%4", "a%41", "a%zz"}) {
    EXPECT_THROW(validate_key_text(bad), InvalidKey) << bad;
  }
  try {
    validate_key_text("ab:{x}");
    FAIL() << "no InvalidKey";
  } catch (const InvalidKey& error) {
    EXPECT_NE(std::string(error.what()).find("byte 3"), std::string::npos) << error.what();
  }
}

// Every guard and sink checks the key text's grammar: guard->claim("{x}:i:b", ...) would write
// idem:ns:{x}:i:b, in the Redis Cluster slot of "x".
TEST(ValidateKeyText, GuardsAndSinksRejectARawTextThatCarriesAHashTag) {
  InMemoryGuard guard;
  EXPECT_THROW((void)guard.claim("{x}:i:b", "r1", ""), InvalidKey);
  EXPECT_EQ(guard.size(), 0u);
  InMemorySink sink;
  EXPECT_THROW((void)sink.claim("{x}:i:b", "r1", ""), InvalidKey);
  EXPECT_EQ(sink.size(), 0u);
}

}  // namespace
}  // namespace idem
