#pragma once

/// exp(x) for float, one formula for the scalar and the vector paths (Cephes' expf: range
/// reduction by ln 2, a degree-6 polynomial, scaling by 2^n; about 1 ulp). They perform the
/// same IEEE operations in the same order, so they return the same bits — which lets the
/// vectorized softmax and shifted_exp stay bit-identical to the reference ones. Inputs are clamped to
/// [-87.3, 88.3], where the result is a normal float.

#include <cstdint>
#include <cstring>

namespace troupe::kernels::cpu::detail {

inline constexpr float exp_lo = -87.3f;
inline constexpr float exp_hi = 88.3f;
inline constexpr float log2e = 1.44269504088896341f;
inline constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: x + magic - magic rounds to int
inline constexpr float ln2_hi = 0.693359375f;
inline constexpr float ln2_lo = -2.12194440e-4f;
inline constexpr float p0 = 1.9875691500e-4f;
inline constexpr float p1 = 1.3981999507e-3f;
inline constexpr float p2 = 8.3334519073e-3f;
inline constexpr float p3 = 4.1665795894e-2f;
inline constexpr float p4 = 1.6666665459e-1f;
inline constexpr float p5 = 5.0000001201e-1f;

/// The shared formula over any arithmetic type F (float or an 8-float vector) whose integer
/// twin is I; `pow2n` builds 2^n from the rounded exponent.
template <class F, class Pow2n>
inline F exp_formula(F x, Pow2n pow2n) {
  const F n = (x * log2e + round_magic) - round_magic;
  x = x - n * ln2_hi;
  x = x - n * ln2_lo;
  F y = F{} + p0;
  y = y * x + p1;
  y = y * x + p2;
  y = y * x + p3;
  y = y * x + p4;
  y = y * x + p5;
  y = y * (x * x) + x + 1.0f;
  return y * pow2n(n);
}

}  // namespace troupe::kernels::cpu::detail

namespace troupe::kernels::cpu {

/// exp(x), scalar; bit-identical to each lane of the vector version in fast.cpp.
inline float exp(float x) {
  x = x < detail::exp_lo ? detail::exp_lo : (x > detail::exp_hi ? detail::exp_hi : x);
  return detail::exp_formula(x, [](float n) {
    // Shifted unsigned: the same bits as the vector lanes' shift, and no undefined behaviour
    // when a NaN or out-of-range input made the exponent negative (UBSan, the fuzz test).
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return scale;
  });
}

}  // namespace troupe::kernels::cpu
