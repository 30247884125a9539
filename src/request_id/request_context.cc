#include "idem/request_context.h"

#include "idem/request_id.h"

namespace idem {
namespace {

thread_local const RequestContext* t_current = nullptr;

}  // namespace

RequestContext::RequestContext(std::string request_id) : request_id_(std::move(request_id)) {
  validate_request_id(request_id_);
}

RequestContext RequestContext::current() {
  return t_current != nullptr ? *t_current : RequestContext();
}

RequestScope::RequestScope(RequestContext context) noexcept
    : context_(std::move(context)), previous_(t_current) {
  t_current = &context_;
}

RequestScope::~RequestScope() { t_current = previous_; }

const std::string& current_request_id() noexcept {
  static const std::string kNone;
  return t_current != nullptr ? t_current->request_id() : kNone;
}

}  // namespace idem
