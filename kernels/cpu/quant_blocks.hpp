#pragma once

/// ggml's block layouts (ggml-common.h), shared by quants.cpp and quants_fast.inl; not part of
/// the kernels' interface (quants.hpp). Each struct is read in place from a mapped row: every
/// block size is a multiple of its alignment, so a row that starts aligned (GGUF aligns tensor
/// data to 32 bytes) keeps every block aligned.

#include <cstdint>
#include <cstring>

namespace troupe::kernels::cpu::blocks {

inline constexpr int32_t qk = 32;     ///< elements per Q8_0 / Q4_0 block
inline constexpr int32_t qk_k = 256;  ///< elements per K-quant super-block

/// value = d * qs[j].
struct q8_0 {
  uint16_t d;  ///< f16
  int8_t qs[qk];
};
static_assert(sizeof(q8_0) == 34);

/// value j < 16 = d * ((qs[j] & 15) - 8); value j + 16 = d * ((qs[j] >> 4) - 8).
struct q4_0 {
  uint16_t d;  ///< f16
  uint8_t qs[qk / 2];
};
static_assert(sizeof(q4_0) == 18);

/// 8 sub-blocks of 32, each with a 6-bit scale and min (scale_min_k4); value = d * scale * q -
/// dmin * min, q the nibble: 64-element chunk c holds sub-block 2c in qs[32c..32c+32)'s low
/// nibbles and sub-block 2c + 1 in their high nibbles.
struct q4_k {
  uint16_t d;     ///< f16, scale of the scales
  uint16_t dmin;  ///< f16, scale of the mins
  uint8_t scales[12];
  uint8_t qs[qk_k / 2];
};
static_assert(sizeof(q4_k) == 144);

/// Q4_K plus a fifth bit per value: bit c of qh[l] is worth 16 in element 32c + l.
struct q5_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[qk_k / 8];
  uint8_t qs[qk_k / 2];
};
static_assert(sizeof(q5_k) == 176);

/// 16 sub-blocks of 16 with int8 scales; value = d * scale * (q - 32), q 6 bits. In each
/// 128-element half (ql 64 bytes, qh 32 bytes), element 32k + l (k < 4, l < 32) takes its low 4
/// bits from ql[l + 32 (k & 1)] (low nibble for k < 2, high for k >= 2) and its top 2 bits from
/// bits 2k, 2k + 1 of qh[l].
struct q6_k {
  uint8_t ql[qk_k / 2];
  uint8_t qh[qk_k / 4];
  int8_t scales[qk_k / 16];
  uint16_t d;  ///< f16
};
static_assert(sizeof(q6_k) == 210);

/// Activations for the K-quants: value = d * qs[j]; bsums[g] = sum of qs[16g..16g+16).
struct q8_k {
  float d;
  int8_t qs[qk_k];
  int16_t bsums[qk_k / 16];
};
static_assert(sizeof(q8_k) == 292);

/// An IEEE half's bits as float (exact).
inline float f16_to_f32(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof(h));
  return static_cast<float>(h);
}

/// A float as an IEEE half's bits, rounded to nearest even (as F16C's vcvtps2ph).
inline uint16_t f32_to_f16(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

/// A bfloat16's bits as float (exact: the top half of a float).
inline float bf16_to_f32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

/// Sub-block j's (j < 8) 6-bit scale and min, from the 12 bytes Q4_K and Q5_K pack them in:
/// bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales and mins 4-7 take
/// their low 4 bits from bytes 8-11 (low and high nibble) and their top 2 bits from the spare
/// top bits of bytes 0-3 (scales) and 4-7 (mins).
struct scale_min {
  uint8_t scale;
  uint8_t min;
};
inline scale_min scale_min_k4(const uint8_t* packed, int32_t j) {
  if (j < 4) return {static_cast<uint8_t>(packed[j] & 63), static_cast<uint8_t>(packed[j + 4] & 63)};
  return {static_cast<uint8_t>((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4)),
          static_cast<uint8_t>((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4))};
}

}  // namespace troupe::kernels::cpu::blocks
