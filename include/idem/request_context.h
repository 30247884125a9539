// The request ID of the work a thread is doing: RequestScope sets it (RAII), any code below
// reads it with current_request_id(), and RequestContext carries it explicitly across thread
// pools, callbacks and coroutines, where thread-locals do not follow the work.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "idem/export.h"

namespace idem {

/// A request's propagated identity: its request ID (empty when none). Copyable, a value;
/// capture it where the work is handed off and open a RequestScope with it where it resumes.
class IDEM_EXPORT RequestContext {
 public:
  /// No request ID.
  RequestContext() = default;
  /// Throws idem::InvalidRequestId unless `request_id` is a valid request ID.
  explicit RequestContext(std::string request_id);

  /// The request ID; empty when none.
  [[nodiscard]] const std::string& request_id() const noexcept { return request_id_; }
  /// True when there is no request ID.
  [[nodiscard]] bool empty() const noexcept { return request_id_.empty(); }

  /// The calling thread's current context (a copy; empty outside any RequestScope).
  [[nodiscard]] static RequestContext current();

  /// Wraps `fn` so that each call runs inside a RequestScope of this context.
  template <class Fn>
  [[nodiscard]] auto bind(Fn fn) const;

 private:
  std::string request_id_;
};

/// Makes `context` the calling thread's current context until destruction, then restores
/// the previous one (scopes nest). Not copyable or movable: it lives on one thread's stack.
/// In a coroutine, never keep a scope across a `co_await` (the coroutine may resume on
/// another thread): keep a RequestContext in the frame and open a scope after each resume.
class IDEM_EXPORT RequestScope {
 public:
  /// Makes `context` current.
  explicit RequestScope(RequestContext context) noexcept;
  /// Throws idem::InvalidRequestId unless `request_id` is valid.
  explicit RequestScope(std::string request_id)
      : RequestScope(RequestContext(std::move(request_id))) {}
  ~RequestScope();
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;

 private:
  RequestContext context_;
  const RequestContext* previous_;
};

/// The calling thread's current request ID; empty outside any RequestScope. The reference
/// stays valid until the innermost scope ends.
[[nodiscard]] IDEM_EXPORT const std::string& current_request_id() noexcept;

/// Wraps `fn` so it runs, on whatever thread calls it, inside the context current here and
/// now: `pool.submit(idem::bind([] { ... current_request_id() ... }))`.
template <class Fn>
[[nodiscard]] auto bind(Fn fn) {
  return RequestContext::current().bind(std::move(fn));
}

template <class Fn>
auto RequestContext::bind(Fn fn) const {
  return [context = *this, fn = std::move(fn)](auto&&... args) mutable -> decltype(auto) {
    const RequestScope scope(context);
    return fn(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace idem
