#include "idem/key.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace idem
