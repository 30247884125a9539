#include "idem/key.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "idem/errors.h"

namespace idem {
namespace {

TEST(IdempotencyKey, EncodesComponentsWithSeparators) {
  EXPECT_EQ((IdempotencyKey{"u1", "refund", "order-7"}.encode()), "u1:refund:order-7");
}

TEST(IdempotencyKey, SeparatorInComponentCannotForgeAnotherKey) {
  const auto a = IdempotencyKey{"u1:pay", "x", "o1"}.encode();
  const auto b = IdempotencyKey{"u1", "pay:x", "o1"}.encode();
  EXPECT_NE(a, b);
  EXPECT_EQ(a, "u1%3Apay:x:o1");
  EXPECT_EQ(b, "u1:pay%3Ax:o1");
}

TEST(IdempotencyKey, EscapesBracesPercentControlAndNonAsciiBytes) {
  EXPECT_EQ(escape_key_component("{a}%\n\x7f\xc3\xa9 ", "biz_key"), "%7Ba%7D%25%0A%7F%C3%A9%20");
}

TEST(IdempotencyKey, EmptyComponentIsInvalidKey) {
  EXPECT_THROW((void)(IdempotencyKey{"", "refund", "o"}.encode()), InvalidKey);
  EXPECT_THROW((void)(IdempotencyKey{"u", "", "o"}.encode()), InvalidKey);
  EXPECT_THROW((void)(IdempotencyKey{"u", "refund", ""}.encode()), InvalidKey);
}

TEST(IdempotencyKey, DecodeInvertsEncode) {
  const IdempotencyKey key{"u1:pay", "x%{y}", "o\n1\x00\xff"};
  EXPECT_EQ(IdempotencyKey::decode(key.encode()), key);
  EXPECT_EQ(IdempotencyKey::decode("u1%3Apay:x:o1"), (IdempotencyKey{"u1:pay", "x", "o1"}));
}

// Round trip over random components drawn from every byte value, with the bytes encode()
// escapes (separators, %, braces, control and non-ASCII bytes) heavily represented.
TEST(IdempotencyKey, DecodeRoundTripsRandomKeys) {
  std::mt19937 rng(20261130);
  const std::string special = std::string(":%{}\x00\x01\n\r\x7f\x80\xff ", 12);
  const auto component = [&] {
    std::string out(1 + rng() % 12, '\0');
    for (char& c : out) {
      c = rng() % 2 == 0 ? special[rng() % special.size()] : static_cast<char>(rng() % 256);
    }
    return out;
  };
  for (int i = 0; i < 2000; ++i) {
    const IdempotencyKey key{component(), component(), component()};
    const std::string text = key.encode();
    ASSERT_EQ(IdempotencyKey::decode(text), key) << text;
    ASSERT_EQ(IdempotencyKey::decode(text).encode(), text);
  }
}

TEST(IdempotencyKey, DecodeRejectsTextsEncodeNeverWrites) {
  for (const std::string_view bad :
       {"", "a:b", "a:b:c:d", ":b:c", "a::c", "a:b:", "a:b:c%", "a:b:c%4", "a:b:c%zz", "a:b:c%3a",
        "a:b:%41", "a:b:c d", "a:b:{c}", "a:b:c\n", "a:b:c\x80"}) {
    EXPECT_THROW((void)IdempotencyKey::decode(bad), InvalidKey) << bad;
  }
  EXPECT_THROW((void)IdempotencyKey::decode(std::string("a:b:c\0", 6)), InvalidKey);
}

TEST(IdempotencyKey, UnescapeNamesTheComponentAndOffset) {
  EXPECT_EQ(unescape_key_component("%7Ba%7D%25%0A", "biz_key"), "{a}%\n");
  try {
    (void)unescape_key_component("ab%4", "intent");
    FAIL() << "no InvalidKey";
  } catch (const InvalidKey& error) {
    EXPECT_NE(std::string(error.what()).find("'intent'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("byte 2"), std::string::npos) << error.what();
  }
}

// An oversize key component is an InvalidKey up front: an 8,000-byte business key reaching
// PostgreSQL, whose B-tree refuses the row, would come back as "backend unavailable" (a 503 any
// client could cause, redelivered forever).
TEST(KeyComponentLimit, OversizeComponentsAreInvalidKeysUpFront) {
  EXPECT_EQ(escape_key_component(std::string(kMaxKeyComponentBytes, 'a'), "biz_key").size(),
            kMaxKeyComponentBytes);
  EXPECT_THROW((void)escape_key_component(std::string(kMaxKeyComponentBytes + 1, 'a'), "biz_key"),
               InvalidKey);
  // The limit is on the escaped form: 200 bytes that each escape to 3.
  EXPECT_THROW((void)escape_key_component(std::string(200, '\xFF'), "user"), InvalidKey);
  EXPECT_THROW((void)(IdempotencyKey{"u", "i", std::string(8000, 'k')}.encode()), InvalidKey);
  EXPECT_THROW((void)IdempotencyKey::decode("u:i:" + std::string(kMaxKeyComponentBytes + 1, 'k')),
               InvalidKey);
}

}  // namespace
}  // namespace idem
