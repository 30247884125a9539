#include "idem/guard.h"

#include "idem/errors.h"

namespace idem {
namespace {

[[noreturn]] void no_journal() {
  throw ConfigError(
      "idem: this guard keeps no step journal (Context::step needs RedisGuard or InMemoryGuard)");
}

}  // namespace

StepJournal Guard::steps(std::string_view /*key*/) { no_journal(); }

bool Guard::put_step(std::string_view /*key*/, std::string_view /*owner_token*/,
                     std::string_view /*name*/, const JournaledStep& /*step*/) {
  no_journal();
}

}  // namespace idem
