// The simulator's randomness: std::mt19937_64 (its output is fixed by the standard) with our own
// mapping to ranges, so a seed replays the same run with any compiler and standard library
// (std::uniform_int_distribution is implementation-defined).
#pragma once

#include <cstdint>
#include <random>

namespace idem::sim {

/// A seeded stream of random numbers. Not thread-safe (the simulator has one thread).
class Rng {
 public:
  /// `stream` separates independent streams of one seed (workload, scheduler, faults, ...).
  Rng(std::uint64_t seed, std::uint64_t stream) : engine_(mix(seed ^ mix(stream + 1))) {}

  /// Uniform in [0, n); n > 0. Rejection sampling: no modulo bias.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    std::uint64_t x = engine_();
    while (x >= limit) x = engine_();
    return x % n;
  }

  /// Uniform in [lo, hi], lo <= hi.
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }

  /// True with probability `per_mille` / 1000.
  bool chance(std::uint64_t per_mille) { return below(1000) < per_mille; }

 private:
  // SplitMix64's finalizer: nearby seeds give unrelated engine states.
  static std::uint64_t mix(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  }

  std::mt19937_64 engine_;
};

}  // namespace idem::sim
