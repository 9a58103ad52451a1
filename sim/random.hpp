#pragma once

/// A seeded random source whose draws are the same on every standard library.
///
/// The bits come from `std::mt19937_64`, whose output sequence the C++ standard fixes exactly.
/// The `std::*_distribution`s are not fixed (each library maps bits to values its own way), so
/// every distribution here is written out: uniform doubles from the top 53 bits, integers by
/// threshold rejection, normals by the polar form of Box-Muller, gammas by Marsaglia-Tsang.
/// With `-ffp-contract=off` (the project's flags) the arithmetic is plain IEEE double; the only
/// library calls are `std::sqrt` (exactly rounded by IEEE 754) and `std::log` / `std::exp`
/// (correctly rounded in practice by glibc and the other mainstream libms, not by the standard).

#include <cstdint>
#include <random>

namespace troupe::sim {

/// An independent 64-bit seed for sub-stream `stream` of `seed` (SplitMix64's finalizer over
/// both words), so that one run seed fans out into uncorrelated streams.
[[nodiscard]] uint64_t derive_seed(uint64_t seed, uint64_t stream);

class random_source {
 public:
  explicit random_source(uint64_t seed) : engine_(seed) {}

  /// The engine's next raw 64-bit word.
  [[nodiscard]] uint64_t next_u64() { return engine_(); }

  /// Uniform in [0, 1) on the 2^-53 grid: the top 53 bits of one word times 2^-53.
  [[nodiscard]] double uniform();

  /// Uniform in (0, 1] on the 2^-53 grid (safe to take the log of).
  [[nodiscard]] double uniform_positive();

  /// Uniform integer in [0, bound), bound > 0, without modulo bias (threshold rejection).
  [[nodiscard]] uint64_t uniform_below(uint64_t bound);

  /// Uniform integer in [lo, hi], lo <= hi.
  [[nodiscard]] int64_t uniform_between(int64_t lo, int64_t hi);

  /// Standard normal, polar Box-Muller: draw (u, v) uniform in the unit disc, return
  /// u * sqrt(-2 ln s / s) with s = u^2 + v^2. The second normal of the pair is discarded,
  /// so a draw's value depends only on the words it consumed.
  [[nodiscard]] double standard_normal();

  /// Exponential with mean 1: -ln(U), U uniform in (0, 1].
  [[nodiscard]] double exponential();

  /// Gamma(shape, scale = 1), shape > 0. shape == 1 is `exponential()`; shape > 1 is
  /// Marsaglia-Tsang (2000); shape < 1 is Marsaglia-Tsang at shape + 1 times U^(1/shape).
  [[nodiscard]] double gamma(double shape);

 private:
  std::mt19937_64 engine_;
};

}  // namespace troupe::sim
