// Where the integration tests find their servers.
//
// URLs come from the environment (IDEM_TEST_REDIS_URL, IDEM_TEST_PG_URL) or, when unset, from
// the file `scripts/dev services start` writes (IDEM_SERVICES_FILE, default
// <source>/.services/env). Without them a test is skipped, except under CI (CI set), where a
// missing server is a failure: an integration suite that silently skips proves nothing.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace idem::test {

/// The value of `name` from the environment or the services file; empty when neither has it.
std::string service_setting(const std::string& name);

/// A lowercase name unique to this test process and test, for key prefixes, namespaces and
/// schemas ([a-z0-9_] only, so it is the same SQL identifier quoted or not).
std::string unique_name(const std::string& stem);

}  // namespace idem::test

/// Declares `var` holding the URL named `setting`; skips (or fails under CI) when it is unset.
#define IDEM_REQUIRE_SERVICE(var, setting)                                              \
  const std::string var = ::idem::test::service_setting(setting);                       \
  if (var.empty()) {                                                                    \
    if (std::getenv("CI") != nullptr) FAIL() << setting " is not set (CI requires it)"; \
    GTEST_SKIP() << setting " is not set; run `scripts/dev services start`";            \
  }
