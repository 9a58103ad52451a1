// fast::libm_scaled_exp: glibc's expf, four lanes of doubles per AVX2 register.
//
// Since 2.27 glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, from ARM's optimized-routines)
// computes in double: k = round(x * 32 / ln 2), r = x * 32 / ln 2 - k, 2^(k/32) from a
// 32-entry table and the exponent bits, a degree-3 polynomial in r, one rounding to float. On
// x86-64 an ifunc picks a build of it compiled with FMA contraction when the CPU has FMA and
// AVX2, and plain SSE2 otherwise. The FMA build's five fused operations are reproduced here with
// explicit _mm256_fmadd_pd (the rest of the build keeps -ffp-contract=off), so on the CPUs where
// this path runs it returns what std::exp returns there. Arguments <= 0 (the sampler's: a logit
// minus the largest one) are proven bit-identical by build/bench/bench_libm_exp, which checks
// every one of them (the suite checks every 31st and the hard cases). Only the fused reduction
// r = x * 32 / ln 2 - k shows in results there: unfused it differs at x = -0x1.f8cbb2p+5, as
// glibc's plain build does. Any other argument, and every CPU without AVX2 and FMA, takes
// std::exp itself.

#include <cmath>
#include <cstdint>

#include "kernels/cpu/ops.hpp"

// glibc >= 2.27 on x86-64 (another C library's expf may round differently).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 27)
#include <immintrin.h>
#define TROUPE_LIBM_EXP_AVX2 1
#endif

namespace troupe::kernels::cpu {

#ifdef TROUPE_LIBM_EXP_AVX2
namespace {

// __exp2f_data of glibc (sysdeps/ieee754/flt-32/e_exp2f_data.c): the table holds
// 2^(i/32) with i << 47 subtracted from its bits, so adding k << 47 scales it by 2^(k/32).
alignas(32) constexpr uint64_t exp2_table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
constexpr double inv_ln2_scaled = 0x1.71547652b82fep+5;  // 32 / ln 2
constexpr double round_shift = 0x1.8p+52;  // z + shift rounds z to an integer in the low bits
constexpr double poly0 = 0x1.c6af84b912394p-20;
constexpr double poly1 = 0x1.ebfce50fac4f3p-13;
constexpr double poly2 = 0x1.62e42ff0c52d6p-6;
// Below these glibc returns an underflow: the smallest subnormal, then 0 (and sets errno, which
// this path does not).
constexpr float may_underflow_below = -0x1.9d1d9ep6f;  // log(2^-149), about -103.28
constexpr float underflow_below = -0x1.9fe368p6f;      // log(2^-150), about -103.97

/// expf of 4 floats in [may_underflow_below, 0]: glibc's main path, operation for operation.
__attribute__((target("avx2,fma"))) __m128 exp4(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d shifted = _mm256_fmadd_pd(_mm256_set1_pd(inv_ln2_scaled), xd, _mm256_set1_pd(round_shift));
  const __m256i ki = _mm256_castpd_si256(shifted);
  const __m256d kd = _mm256_sub_pd(shifted, _mm256_set1_pd(round_shift));
  const __m256d r = _mm256_fmsub_pd(_mm256_set1_pd(inv_ln2_scaled), xd, kd);
  const __m256i index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  const __m256i table = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(exp2_table), index, 8);
  const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(table, _mm256_slli_epi64(ki, 47)));
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(poly0), r, _mm256_set1_pd(poly1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(poly2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/// expf of 8 floats <= 0 (-inf included): the main path, then glibc's underflow results.
__attribute__((target("avx2,fma"))) __m256 exp8_nonpositive(__m256 x) {
  const __m256 main = _mm256_set_m128(exp4(_mm256_extractf128_ps(x, 1)), exp4(_mm256_castps256_ps128(x)));
  const __m256 tiny = _mm256_blendv_ps(_mm256_set1_ps(0x1p-149f), _mm256_setzero_ps(),
                                       _mm256_cmp_ps(x, _mm256_set1_ps(underflow_below), _CMP_LT_OQ));
  return _mm256_blendv_ps(main, tiny, _mm256_cmp_ps(x, _mm256_set1_ps(may_underflow_below), _CMP_LT_OQ));
}

__attribute__((target("avx2,fma"))) void libm_scaled_exp_avx2(float* out, const float* x, int32_t n, float shift,
                                                              float divisor) {
  const __m256 shift_v = _mm256_set1_ps(shift), divisor_v = _mm256_set1_ps(divisor);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift_v), divisor_v);
    // A positive or NaN argument (outside the sampler's use) takes std::exp for the block.
    if (_mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NLE_UQ)) != 0) {
      reference::libm_scaled_exp(out + i, x + i, 8, shift, divisor);
      continue;
    }
    _mm256_storeu_ps(out + i, exp8_nonpositive(a));
  }
  reference::libm_scaled_exp(out + i, x + i, n - i, shift, divisor);
}

}  // namespace
#endif

namespace fast {

bool libm_exp_vectorized() {
#ifdef TROUPE_LIBM_EXP_AVX2
  static const bool vectorized = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return vectorized;
#else
  return false;
#endif
}

void libm_scaled_exp(float* out, const float* x, int32_t n, float shift, float divisor) {
#ifdef TROUPE_LIBM_EXP_AVX2
  if (libm_exp_vectorized()) return libm_scaled_exp_avx2(out, x, n, shift, divisor);
#endif
  reference::libm_scaled_exp(out, x, n, shift, divisor);
}

}  // namespace fast
}  // namespace troupe::kernels::cpu
