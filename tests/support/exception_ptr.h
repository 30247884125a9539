// What a test asks of a std::exception_ptr: its message and its type. Header-only and free of
// GoogleTest, so the simulation (tests/sim) uses it too.
#pragma once

#include <exception>
#include <string>

namespace idem::test {

/// The message of `error`: what() of a std::exception, "unknown exception" for anything else,
/// "" for a null pointer.
inline std::string what(const std::exception_ptr& error) {
  if (error == nullptr) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

/// True when `error` holds an `E` (or a type derived from it); false for a null pointer.
template <class E>
bool is(const std::exception_ptr& error) {
  if (error == nullptr) return false;
  try {
    std::rethrow_exception(error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace idem::test
