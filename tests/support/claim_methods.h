// The two RedisGuard claim methods as a gtest parameter: the Redis tests run against both.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "idem/redis_guard.h"

namespace idem {

/// Prints a ClaimMethod by name in gtest's output (it printed the enum's bytes).
inline void PrintTo(ClaimMethod method, std::ostream* out) {
  *out << (method == ClaimMethod::kLuaScript ? "Lua" : "SetNxGet");
}

namespace test {

/// Both claim methods, for INSTANTIATE_TEST_SUITE_P.
inline auto all_claim_methods() {
  return ::testing::Values(ClaimMethod::kLuaScript, ClaimMethod::kSetNxGet);
}

/// The test name suffix of a claim method: "Lua" or "SetNxGet".
inline std::string claim_method_name(const ::testing::TestParamInfo<ClaimMethod>& info) {
  return ::testing::PrintToString(info.param);
}

}  // namespace test
}  // namespace idem
