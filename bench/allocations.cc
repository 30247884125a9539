#include "allocations.h"

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define IDEM_BENCH_COUNTS_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define IDEM_BENCH_COUNTS_ALLOCATIONS 0
#endif
#endif
#if !defined(IDEM_BENCH_COUNTS_ALLOCATIONS) && defined(__GLIBC__)
#define IDEM_BENCH_COUNTS_ALLOCATIONS 1
#endif
#ifndef IDEM_BENCH_COUNTS_ALLOCATIONS
#define IDEM_BENCH_COUNTS_ALLOCATIONS 0
#endif

namespace {
// Per thread: the loop thread's count is what a benchmark reports, and counting costs it no
// locked instruction (a shared atomic add per allocation showed as about 3 % of the async
// loop's CPU in a profile).
thread_local long long counted = 0;
}  // namespace

#if IDEM_BENCH_COUNTS_ALLOCATIONS
// The counting wrappers forward to the allocator that comes next in the symbol search order:
// glibc's, or one preloaded (LD_PRELOAD=libjemalloc.so.2), whose free() and aligned
// allocations then serve this program too. Resolved at the first call: glibc's dlsym() does
// not allocate when the symbol exists.
namespace {
using Malloc = void* (*)(std::size_t) noexcept;
using Calloc = void* (*)(std::size_t, std::size_t) noexcept;
using Realloc = void* (*)(void*, std::size_t) noexcept;

// Resolved into atomics, not function-local statics, whose guarded initialization would be
// entered again if dlsym() allocated. Two threads resolving one at once store the same value.
std::atomic<Malloc> next_malloc{nullptr};
std::atomic<Calloc> next_calloc{nullptr};
std::atomic<Realloc> next_realloc{nullptr};

template <typename F>
F resolved(std::atomic<F>& slot, const char* name) noexcept {
  F f = slot.load(std::memory_order_relaxed);
  if (f == nullptr) {
    void* found = dlsym(RTLD_NEXT, name);
    if (found == nullptr) std::abort();
    f = reinterpret_cast<F>(found);
    slot.store(f, std::memory_order_relaxed);
  }
  return f;
}
}  // namespace

extern "C" {
void* malloc(std::size_t size) noexcept {
  ++counted;
  return resolved(next_malloc, "malloc")(size);
}
void* calloc(std::size_t count, std::size_t size) noexcept {
  ++counted;
  return resolved(next_calloc, "calloc")(count, size);
}
void* realloc(void* pointer, std::size_t size) noexcept {
  if (pointer == nullptr) ++counted;
  return resolved(next_realloc, "realloc")(pointer, size);
}
}
#endif

namespace bench {

long long allocations() noexcept { return IDEM_BENCH_COUNTS_ALLOCATIONS ? counted : -1; }

}  // namespace bench
