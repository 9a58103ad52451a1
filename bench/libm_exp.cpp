// bench_libm_exp: the exhaustive check of kernels::cpu::fast::libm_scaled_exp against std::exp,
// and the speed of both. Every float <= 0 (the sampler's arguments: +0, then -0 down to -inf,
// 2^31 values) goes through the kernel and through std::exp; the program prints how many differ
// in any bit (it must be 0; exit code 1 otherwise) and ns per element of each, timed over the
// sampler's typical arguments (a 32,000-token row of N(0, 3^2) logits at T 0.8).
// The suite (Kernels.FastLibmScaledExpEqualsStdExpOnEvery31stFloatAndTheHardCases) checks a
// subset; run this on a new CPU or C library.
//
//   build/bench/bench_libm_exp

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench/figures.hpp"
#include "kernels/cpu/ops.hpp"

namespace troupe::bench {
namespace {

namespace cpu = kernels::cpu;

/// Floats whose std::exp and kernel result differ in some bit, over bits [first, last].
int64_t count_mismatches(uint64_t first, uint64_t last) {
  constexpr uint32_t chunk = 1u << 16;
  std::vector<float> x(chunk), want(chunk), got(chunk);
  int64_t num_mismatches = 0;
  for (uint64_t begin = first; begin <= last; begin += chunk) {
    const auto count = static_cast<uint32_t>(std::min<uint64_t>(chunk, last + 1 - begin));
    for (uint32_t i = 0; i < count; ++i) {
      const auto bits = static_cast<uint32_t>(begin + i);
      std::memcpy(&x[i], &bits, sizeof(float));
      want[i] = std::exp(x[i]);
    }
    cpu::fast::libm_scaled_exp(got.data(), x.data(), static_cast<int32_t>(count), 0.0f, 1.0f);
    if (std::memcmp(want.data(), got.data(), count * sizeof(float)) == 0) continue;
    for (uint32_t i = 0; i < count; ++i) {
      if (std::memcmp(&want[i], &got[i], sizeof(float)) == 0) continue;
      if (num_mismatches++ < 10) std::printf("  exp(%a): std::exp %a, kernel %a\n", x[i], want[i], got[i]);
    }
  }
  return num_mismatches;
}

/// ns per element of `f` over a row of N(0, 3^2) logits at T 0.8, median of 5 runs.
template <class F>
double ns_per_element(F&& f) {
  constexpr int32_t vocab = 32000, reps = 200;
  std::mt19937 rng(20);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<float> logits(vocab), out(vocab);
  for (float& l : logits) l = logit(rng);
  const float logit_max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> ns;
  for (int run = 0; run < 5; ++run) {
    const double start = now_seconds();
    for (int r = 0; r < reps; ++r) f(out.data(), logits.data(), vocab, logit_max, 0.8f);
    ns.push_back((now_seconds() - start) * 1e9 / (double{reps} * vocab));
  }
  return summarize(ns).median;
}

int run(int argc, char** argv) {
  parse_arguments(argc, argv, [](const std::string&, auto&&) { return false; });
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  std::printf("vectorized (AVX2 and FMA): %s\n", cpu::fast::libm_exp_vectorized() ? "yes" : "no (std::exp itself)");
  const double start = now_seconds();
  const int64_t num_mismatches = count_mismatches(0, 0) + count_mismatches(0x80000000u, 0xff800000u);
  std::printf("every float <= 0 (2^31 + 2 values): %lld differ from std::exp (%.0f s)\n",
              static_cast<long long>(num_mismatches), now_seconds() - start);
  std::printf("ns per element, 32,000 logits at T 0.8: std::exp %.2f, libm_scaled_exp %.2f\n",
              ns_per_element(cpu::reference::libm_scaled_exp), ns_per_element(cpu::fast::libm_scaled_exp));
  return num_mismatches == 0 ? 0 : 1;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
