// RFC 6901 JSON Pointer parsing (src/common/json_pointer.h), shared by field selection and
// request-ID extraction.
#include "common/json_pointer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "idem/errors.h"

namespace idem {
namespace {

TEST(JsonPointer, ParsesTokensWithRfc6901Escapes) {
  EXPECT_TRUE(detail::parse_json_pointer("").empty());
  EXPECT_EQ(detail::parse_json_pointer("/a~1b/m~0n/0"),
            (std::vector<std::string>{"a/b", "m~n", "0"}));
  EXPECT_EQ(detail::parse_json_pointer("/"), (std::vector<std::string>{""}));
  EXPECT_EQ(detail::parse_json_pointer("/~01"), (std::vector<std::string>{"~1"}));  // not "/"
  EXPECT_THROW((void)detail::parse_json_pointer("a"), ConfigError);
  EXPECT_THROW((void)detail::parse_json_pointer("/a~2"), ConfigError);
  EXPECT_THROW((void)detail::parse_json_pointer("/a~"), ConfigError);
}

}  // namespace
}  // namespace idem
