// Linked into the HTTP examples and their tests only under -fsanitize=thread (see
// examples/CMakeLists.txt). Debian's libcpp-httplib.so is not built with ThreadSanitizer, so the
// locking inside its thread pool is invisible to it and the request buffers it hands between its
// threads are reported as races. Races whose stack is inside that library are suppressed; races
// in idem and in the examples' own code are still reported.
extern "C" const char* __tsan_default_suppressions() { return "race:libcpp-httplib.so\n"; }
