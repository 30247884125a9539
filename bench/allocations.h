// Heap allocations made by the calling thread so far, for benchmarks that report allocations
// per call of a loop on one thread: every malloc(), calloc() and realloc() of a null pointer,
// whoever calls it (operator new, libpq, hiredis, OpenSSL). Defined in bench/allocations.cc, which
// replaces malloc() with a counting wrapper around the next allocator in the symbol search order
// (glibc's, or one preloaded such as jemalloc); with a sanitizer, which replaces malloc() itself,
// or without glibc, nothing is counted and allocations() returns -1. A preloaded allocator that
// also replaces operator new (jemalloc does) leaves C++ allocations uncounted. Thread-safe (a
// counter per thread).
#pragma once

namespace bench {

[[nodiscard]] long long allocations() noexcept;

}  // namespace bench
