#include "idem/version.h"

#include <gtest/gtest.h>

#include <string>

namespace idem {
namespace {

TEST(Version, TheLibraryTheHeadersAndTheProjectAgree) {
  EXPECT_STREQ(library_version(), IDEM_VERSION_STRING);
  EXPECT_EQ(std::string(IDEM_VERSION_STRING), std::to_string(IDEM_VERSION_MAJOR) + "." +
                                                  std::to_string(IDEM_VERSION_MINOR) + "." +
                                                  std::to_string(IDEM_VERSION_PATCH));
  // CMakeLists.txt reads project(VERSION) from the header: the package's version is the same.
  EXPECT_STREQ(IDEM_VERSION_STRING, IDEM_TEST_PROJECT_VERSION);
}

}  // namespace
}  // namespace idem
