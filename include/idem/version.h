// The version of idem's headers and of the library they link with.
#pragma once

#include "idem/export.h"

/// The version of these headers, by Semantic Versioning 2.0.0 (https://semver.org/). While the
/// major is 0, a minor release may break the API and the ABI: a shared libidem's soname is
/// libidem.so.0.MINOR, and find_package(idem 0.MINOR) accepts 0.MINOR.* only. CMakeLists.txt
/// reads the project's version from these three lines.
#define IDEM_VERSION_MAJOR 0
#define IDEM_VERSION_MINOR 1
#define IDEM_VERSION_PATCH 0

#define IDEM_DETAIL_TEXT_(part) #part
#define IDEM_DETAIL_TEXT(part) IDEM_DETAIL_TEXT_(part)
/// The version of these headers as text, "MAJOR.MINOR.PATCH" (for example "0.1.0").
#define IDEM_VERSION_STRING            \
  IDEM_DETAIL_TEXT(IDEM_VERSION_MAJOR) \
  "." IDEM_DETAIL_TEXT(IDEM_VERSION_MINOR) "." IDEM_DETAIL_TEXT(IDEM_VERSION_PATCH)

namespace idem {

/// The version of the idem library linked in, "MAJOR.MINOR.PATCH": IDEM_VERSION_STRING of the
/// headers it was built from. It differs from the IDEM_VERSION_STRING a program sees when the
/// program was compiled against one release's headers and runs with another release's shared
/// library. A static string; thread-safe; never throws.
[[nodiscard]] IDEM_EXPORT const char* library_version() noexcept;

}  // namespace idem
