#include "test_env.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace idem::test {

std::string service_setting(const std::string& name) {
  if (const char* value = std::getenv(name.c_str()); value != nullptr && *value != '\0') {
    return value;
  }
  const char* file = std::getenv("IDEM_SERVICES_FILE");
  std::ifstream in(file != nullptr ? std::string(file)
                                   : std::string(IDEM_SOURCE_DIR "/.services/env"));
  std::string line;
  const std::string wanted = name + "=";
  while (std::getline(in, line)) {
    if (line.rfind(wanted, 0) == 0) return line.substr(wanted.size());
  }
  return {};
}

std::string unique_name(const std::string& stem) {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = stem + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  if (info != nullptr) name += std::string("_") + info->name();
  // Lowercase: a name used unquoted in SQL folds to lowercase, quoted it does not; both must agree.
  for (char& c : name) {
    c = std::isalnum(static_cast<unsigned char>(c))
            ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
            : '_';
  }
  return name;
}

}  // namespace idem::test
