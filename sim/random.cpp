#include "sim/random.hpp"

#include <cmath>

#include "runtime/common/error.hpp"

namespace troupe::sim {

namespace {

constexpr double two_pow_minus_53 = 1.0 / 9007199254740992.0;

uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Marsaglia-Tsang for shape >= 1: d = shape - 1/3, c = 1 / sqrt(9 d); repeat x ~ N(0, 1),
/// v = (1 + c x)^3 until v > 0 and the squeeze or the log test accepts; return d v.
double gamma_at_least_one(random_source& rng, double shape) {
  TROUPE_ASSERT(shape >= 1.0);
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = rng.standard_normal();
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = rng.uniform_positive();
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * (x2 * x2)) return d * v;
    if (std::log(u) < 0.5 * x2 + d * (1.0 - v + std::log(v))) return d * v;
  }
}

}  // namespace

uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  return splitmix64_finalize(splitmix64_finalize(seed) ^ (stream * 0x9e3779b97f4a7c15ULL + 1));
}

double random_source::uniform() { return static_cast<double>(next_u64() >> 11) * two_pow_minus_53; }

double random_source::uniform_positive() {
  return static_cast<double>((next_u64() >> 11) + 1) * two_pow_minus_53;
}

uint64_t random_source::uniform_below(uint64_t bound) {
  TROUPE_ASSERT_MSG(bound > 0, "uniform_below needs a positive bound");
  const uint64_t threshold = (~bound + 1) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t x = next_u64();
    if (x >= threshold) return x % bound;
  }
}

int64_t random_source::uniform_between(int64_t lo, int64_t hi) {
  TROUPE_ASSERT(lo <= hi);
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  TROUPE_ASSERT_MSG(span < UINT64_MAX, "uniform_between over the whole int64 range");
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + uniform_below(span + 1));
}

double random_source::standard_normal() {
  for (;;) {
    const double u = 2.0 * uniform() - 1.0;
    const double v = 2.0 * uniform() - 1.0;
    const double s = u * u + v * v;
    if (s == 0.0 || s >= 1.0) continue;
    return u * std::sqrt(-2.0 * std::log(s) / s);
  }
}

double random_source::exponential() { return -std::log(uniform_positive()); }

double random_source::gamma(double shape) {
  TROUPE_ASSERT_MSG(shape > 0.0 && std::isfinite(shape), "gamma needs a finite shape > 0");
  if (shape == 1.0) return exponential();
  if (shape > 1.0) return gamma_at_least_one(*this, shape);
  // Boost a small shape: Gamma(a) = Gamma(a + 1) * U^(1/a) (Marsaglia-Tsang, section 6).
  const double boosted = gamma_at_least_one(*this, shape + 1.0);
  return boosted * std::exp(std::log(uniform_positive()) / shape);
}

}  // namespace troupe::sim
