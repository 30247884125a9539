#include "idem/version.h"

namespace idem {

const char* library_version() noexcept { return IDEM_VERSION_STRING; }

}  // namespace idem
