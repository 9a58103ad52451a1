// ggml's block formats (kernels/cpu/quants.hpp): hand-built blocks dequantized to values worked
// out by hand, activation quantization to exact int8s, the reference dot products against the
// dequantized rows, and the fast path against the reference bit for bit, whatever the batch or
// the threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/quants.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe::kernels::cpu {
namespace {

constexpr weight_type all_weight_types[] = {weight_type::f32,  weight_type::f16,  weight_type::bf16,
                                            weight_type::q8_0, weight_type::q4_0, weight_type::q4_k,
                                            weight_type::q5_k, weight_type::q6_k};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

uint16_t f16_bits(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

void put_u16(std::vector<uint8_t>& bytes, size_t offset, uint16_t v) { std::memcpy(&bytes[offset], &v, sizeof(v)); }

std::vector<float> dequantized(const std::vector<uint8_t>& row, weight_type t, int32_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(out.data(), row.data(), t, n);
  return out;
}

// ---- the type table ----

TEST(QuantsTable, BlockSizesAndRowBytes) {
  EXPECT_EQ(block_elements(weight_type::f32), 1);
  EXPECT_EQ(block_elements(weight_type::q8_0), 32);
  EXPECT_EQ(block_elements(weight_type::q4_0), 32);
  EXPECT_EQ(block_elements(weight_type::q4_k), 256);
  EXPECT_EQ(block_elements(weight_type::q8_k), 256);
  EXPECT_EQ(block_bytes(weight_type::f32), 4);
  EXPECT_EQ(block_bytes(weight_type::f16), 2);
  EXPECT_EQ(block_bytes(weight_type::bf16), 2);
  EXPECT_EQ(block_bytes(weight_type::q8_0), 34);
  EXPECT_EQ(block_bytes(weight_type::q4_0), 18);
  EXPECT_EQ(block_bytes(weight_type::q4_k), 144);
  EXPECT_EQ(block_bytes(weight_type::q5_k), 176);
  EXPECT_EQ(block_bytes(weight_type::q6_k), 210);
  EXPECT_EQ(block_bytes(weight_type::q8_k), 292);
  EXPECT_EQ(row_bytes(weight_type::q4_k, 256), 144);
  EXPECT_EQ(row_bytes(weight_type::q4_k, 4096), 2304);  // 16 x 144
  EXPECT_EQ(row_bytes(weight_type::q8_0, 4096), 4352);  // 128 x 34
  EXPECT_EQ(row_bytes(weight_type::q6_k, 4096), 3360);  // 16 x 210
  EXPECT_EQ(row_bytes(weight_type::q8_k, 4096), 4672);  // 16 x 292
  EXPECT_EQ(row_bytes(weight_type::f16, 3), 6);
  EXPECT_EQ(row_bytes(weight_type::f32, 5), 20);
}

TEST(QuantsTable, DotTypesNamesAndWeightTypes) {
  EXPECT_EQ(dot_type(weight_type::f32), weight_type::f32);
  EXPECT_EQ(dot_type(weight_type::f16), weight_type::f16);
  EXPECT_EQ(dot_type(weight_type::bf16), weight_type::bf16);
  EXPECT_EQ(dot_type(weight_type::q8_0), weight_type::q8_0);
  EXPECT_EQ(dot_type(weight_type::q4_0), weight_type::q8_0);
  EXPECT_EQ(dot_type(weight_type::q4_k), weight_type::q8_k);
  EXPECT_EQ(dot_type(weight_type::q5_k), weight_type::q8_k);
  EXPECT_EQ(dot_type(weight_type::q6_k), weight_type::q8_k);
  EXPECT_STREQ(type_name(weight_type::bf16), "BF16");
  EXPECT_STREQ(type_name(weight_type::q4_k), "Q4_K");
  EXPECT_STREQ(type_name(weight_type::q8_k), "Q8_K");
  for (uint32_t raw : {0u, 1u, 2u, 8u, 12u, 13u, 14u, 30u}) EXPECT_TRUE(is_weight_type(raw)) << raw;
  // Q4_1 (3), Q5_0 (6), Q2_K (10), Q8_K (15, activations only), IQ types, I8 (24).
  for (uint32_t raw : {3u, 6u, 10u, 15u, 16u, 24u, 31u, 1000u}) EXPECT_FALSE(is_weight_type(raw)) << raw;
}

// ---- dequantization of hand-built blocks ----

TEST(QuantsDequantize, F16AndBF16) {
  std::vector<uint8_t> f16(8);
  put_u16(f16, 0, 0x3C00);  // 1.0
  put_u16(f16, 2, 0xC000);  // -2.0
  put_u16(f16, 4, 0x3555);  // 2^-2 * (1 + 0x155 / 1024) = 0.333251953125
  put_u16(f16, 6, 0x0001);  // the smallest subnormal, 2^-24
  EXPECT_EQ(dequantized(f16, weight_type::f16, 4),
            (std::vector<float>{1.0f, -2.0f, 0.333251953125f, 5.9604644775390625e-08f}));
  // 13 values: the first 8 take F16C's 8-wide conversion where the build has it, the rest one
  // by one; every class of value converts exactly either way.
  const uint16_t bits[13] = {0x3C00, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x7BFF, 0x3555,
                             0xC000, 0x0400, 0x3800, 0x4248, 0x7E00};
  std::vector<uint8_t> wide(26);
  for (int i = 0; i < 13; i++) put_u16(wide, static_cast<size_t>(2 * i), bits[i]);
  const std::vector<float> got = dequantized(wide, weight_type::f16, 13);
  const float inf = std::numeric_limits<float>::infinity();
  const float want[12] = {1.0f, -0.0f, inf, -inf, 5.9604644775390625e-08f, 6.097555160522461e-05f, 65504.0f,
                          0.333251953125f, -2.0f, 6.103515625e-05f, 0.5f, 3.140625f};
  for (size_t i = 0; i < 12; i++) EXPECT_TRUE(same_bits(got[i], want[i])) << i << ": " << got[i];
  EXPECT_TRUE(std::isnan(got[12]));
  std::vector<uint8_t> bf16(6);
  put_u16(bf16, 0, 0x3F80);  // 1.0
  put_u16(bf16, 2, 0xC0A0);  // -(2^2 * 1.25) = -5
  put_u16(bf16, 4, 0x3EAB);  // 2^-2 * (1 + 43 / 128) = 0.333984375
  EXPECT_EQ(dequantized(bf16, weight_type::bf16, 3), (std::vector<float>{1.0f, -5.0f, 0.333984375f}));
}

TEST(QuantsDequantize, Q8_0AndQ4_0) {
  std::vector<uint8_t> q80(34, 0);
  put_u16(q80, 0, 0x3800);  // d = 0.5
  const int8_t qs[5] = {-128, -1, 0, 1, 127};
  std::memcpy(&q80[2], qs, sizeof(qs));
  const std::vector<float> y = dequantized(q80, weight_type::q8_0, 32);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 5), (std::vector<float>{-64.0f, -0.5f, 0.0f, 0.5f, 63.5f}));

  std::vector<uint8_t> q40(18, 0x88);  // every nibble 8: value 0
  put_u16(q40, 0, 0x3400);             // d = 0.25
  q40[2] = 0xF0;  // element 0: (0 - 8) * 0.25 = -2; element 16: (15 - 8) * 0.25 = 1.75
  q40[3] = 0x38;  // element 1: (8 - 8) * 0.25 = 0; element 17: (3 - 8) * 0.25 = -1.25
  const std::vector<float> z = dequantized(q40, weight_type::q4_0, 32);
  EXPECT_EQ(z[0], -2.0f);
  EXPECT_EQ(z[16], 1.75f);
  EXPECT_EQ(z[1], 0.0f);
  EXPECT_EQ(z[17], -1.25f);
  EXPECT_EQ(z[31], 0.0f);
}

// Sub-block scales {1, 2, 3, 63, 17, 33, 48, 5} and mins {0, 1, 2, 3, 63, 16, 31, 7} in the
// 12-byte packing: bytes 0-3 = scale j | (scale j+4 >> 4) << 6, bytes 4-7 = min j | (min j+4 >>
// 4) << 6, bytes 8-11 = (scale j+4 & 15) | (min j+4 & 15) << 4.
constexpr uint8_t k_scales[12] = {
    1 | 1 << 6, 2 | 2 << 6, 3 | 3 << 6, 63 | 0 << 6,  // 0x41 0x82 0xC3 0x3F
    0 | 3 << 6, 1 | 1 << 6, 2 | 1 << 6, 3 | 0 << 6,   // 0xC0 0x41 0x42 0x03
    1 | 15 << 4, 1 | 0 << 4, 0 | 15 << 4, 5 | 7 << 4  // 0xF1 0x01 0xF0 0x75
};

/// A Q4_K block (d 0.5, dmin 0.25, k_scales) whose nibbles are 0 but for four bytes.
std::vector<uint8_t> hand_q4_k() {
  std::vector<uint8_t> b(144, 0);
  put_u16(b, 0, 0x3800);  // d = 0.5
  put_u16(b, 2, 0x3400);  // dmin = 0.25
  std::memcpy(&b[4], k_scales, 12);
  uint8_t* qs = &b[16];
  qs[0] = 0x5A;       // element 0 (sub-block 0) 10, element 32 (sub-block 1) 5
  qs[32 + 2] = 0xE0;  // element 66 (sub-block 2) 0, element 98 (sub-block 3) 14
  qs[64] = 0x90;      // element 128 (sub-block 4) 0, element 160 (sub-block 5) 9
  qs[96 + 7] = 0xF3;  // element 199 (sub-block 6) 3, element 231 (sub-block 7) 15
  return b;
}

TEST(QuantsDequantize, Q4_K) {
  const std::vector<float> y = dequantized(hand_q4_k(), weight_type::q4_k, 256);
  // value = (d * scale) * q - dmin * min
  EXPECT_EQ(y[0], 5.0f);      // (0.5 * 1) * 10 - 0.25 * 0
  EXPECT_EQ(y[32], 4.75f);    // (0.5 * 2) * 5 - 0.25 * 1
  EXPECT_EQ(y[66], -0.5f);    // (0.5 * 3) * 0 - 0.25 * 2
  EXPECT_EQ(y[98], 440.25f);  // (0.5 * 63) * 14 - 0.25 * 3
  EXPECT_EQ(y[128], -15.75f); // (0.5 * 17) * 0 - 0.25 * 63
  EXPECT_EQ(y[160], 144.5f);  // (0.5 * 33) * 9 - 0.25 * 16
  EXPECT_EQ(y[199], 64.25f);  // (0.5 * 48) * 3 - 0.25 * 31
  EXPECT_EQ(y[231], 35.75f);  // (0.5 * 5) * 15 - 0.25 * 7
  // A zero nibble leaves -dmin * min.
  const float zero_q[8] = {0.0f, -0.25f, -0.5f, -0.75f, -15.75f, -4.0f, -7.75f, -1.75f};
  for (int32_t j = 0; j < 8; j++) EXPECT_EQ(y[32 * j + 1], zero_q[j]) << "sub-block " << j;
}

TEST(QuantsDequantize, Q5_K) {
  const std::vector<uint8_t> q4 = hand_q4_k();
  std::vector<uint8_t> b(176, 0);
  std::memcpy(&b[0], &q4[0], 16);          // d, dmin, scales
  std::memcpy(&b[48], &q4[16], 128);       // qs after qh[32]
  uint8_t* qh = &b[16];
  qh[0] = 0x03;  // bit c of qh[l] adds 16 to element 32c + l: elements 0 and 32
  qh[1] = 0x10;  // element 129
  qh[7] = 0x80;  // element 231
  const std::vector<float> y = dequantized(b, weight_type::q5_k, 256);
  EXPECT_EQ(y[0], 13.0f);     // (0.5 * 1) * (10 + 16) - 0
  EXPECT_EQ(y[32], 20.75f);   // (0.5 * 2) * (5 + 16) - 0.25
  EXPECT_EQ(y[129], 120.25f); // (0.5 * 17) * (0 + 16) - 15.75
  EXPECT_EQ(y[199], 64.25f);  // no fifth bit: as Q4_K
  EXPECT_EQ(y[231], 75.75f);  // (0.5 * 5) * (15 + 16) - 1.75
  EXPECT_EQ(y[98], 440.25f);  // no fifth bit
}

TEST(QuantsDequantize, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  uint8_t* ql = &b[0];
  uint8_t* qh = &b[128];
  const int8_t scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 127, -128};
  std::memcpy(&b[192], scales, 16);
  put_u16(b, 208, 0x3800);  // d = 0.5
  ql[0] = 0x7F;    // element 0 low 15, element 64 low 7
  ql[32] = 0x2A;   // element 32 low 10, element 96 low 2
  qh[0] = 0xE7;    // top bits: element 0 3, element 32 1, element 64 2, element 96 3
  ql[64 + 17] = 0x0C;  // second half, element 145 low 12
  qh[32 + 17] = 0x02;  // element 145 top 2
  ql[127] = 0xF0;      // element 255 low 15
  qh[63] = 0xC0;       // element 255 top 3
  const std::vector<float> y = dequantized(b, weight_type::q6_k, 256);
  // value = (d * scale[e / 16]) * (q - 32)
  EXPECT_EQ(y[0], 15.5f);     // (0.5 * 1) * ((15 | 3 << 4) - 32 = 31)
  EXPECT_EQ(y[32], -6.0f);    // (0.5 * 2) * ((10 | 1 << 4) - 32 = -6)
  EXPECT_EQ(y[64], 10.5f);    // (0.5 * 3) * ((7 | 2 << 4) - 32 = 7)
  EXPECT_EQ(y[96], 36.0f);    // (0.5 * 4) * ((2 | 3 << 4) - 32 = 18)
  EXPECT_EQ(y[145], -30.0f);  // (0.5 * -5) * ((12 | 2 << 4) - 32 = 12)
  EXPECT_EQ(y[255], -1984.0f);  // (0.5 * -128) * ((15 | 3 << 4) - 32 = 31)
  EXPECT_EQ(y[224], -2032.0f);  // (0.5 * 127) * (0 - 32)
  EXPECT_EQ(y[17], 16.0f);      // (0.5 * -1) * (0 - 32)
}

TEST(QuantsDequantize, Q8_K) {
  std::vector<uint8_t> b(292, 0);
  const float d = 0.25f;
  std::memcpy(&b[0], &d, sizeof(d));
  b[4] = static_cast<uint8_t>(-128);
  b[4 + 255] = 127;
  const std::vector<float> y = dequantized(b, weight_type::q8_k, 256);
  EXPECT_EQ(y[0], -32.0f);    // 0.25 * -128
  EXPECT_EQ(y[255], 31.75f);  // 0.25 * 127
  EXPECT_EQ(y[1], 0.0f);
}

// ---- activation quantization ----

struct q8_0_block {
  uint16_t d;
  std::vector<int8_t> qs;
};

q8_0_block q8_0_at(const std::vector<uint8_t>& out, int32_t b) {
  q8_0_block r{0, std::vector<int8_t>(32)};
  std::memcpy(&r.d, &out[34 * b], 2);
  std::memcpy(r.qs.data(), &out[34 * b + 2], 32);
  return r;
}

TEST(QuantsActivations, Q8_0RoundsHalfToEven) {
  std::vector<float> x(4 * 32, 0.0f);
  // Block 0: max |x| 127, so q = x * (127 / 127) rounded half to even; d = 1 (f16 0x3C00).
  const float b0[11] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.49f, -127.0f, 126.5f, 125.5f};
  std::copy(b0, b0 + 11, x.begin());
  // Block 1: all zero: d = 0, q = 0. Block 2: max 254, d = 2, q = x * 0.5.
  const float b2[5] = {254.0f, 3.0f, 5.0f, -1.0f, 7.0f};
  std::copy(b2, b2 + 5, x.begin() + 64);
  // Block 3: max 1: d = 1/127 rounded to f16: 2^-7 * (1 + 8/1024) (0x2008, mantissa 8.06 -> 8).
  x[96] = -1.0f;
  x[97] = 0.25f;  // 0.25 * 127 = 31.75 -> 32
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes(weight_type::q8_0, 128)));
  quantize_activations(out.data(), x.data(), 128, weight_type::q8_0);

  const q8_0_block q0 = q8_0_at(out, 0), q1 = q8_0_at(out, 1), q2 = q8_0_at(out, 2), q3 = q8_0_at(out, 3);
  EXPECT_EQ(q0.d, 0x3C00);
  EXPECT_EQ(std::vector<int8_t>(q0.qs.begin(), q0.qs.begin() + 11),
            (std::vector<int8_t>{127, 0, 2, 2, 0, -2, -2, 3, -127, 126, 126}));
  EXPECT_EQ(q1.d, 0x0000);
  EXPECT_EQ(q1.qs, std::vector<int8_t>(32, 0));
  EXPECT_EQ(q2.d, 0x4000);  // 2.0
  // 254, 3, 5, -1, 7 times 0.5: 127, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, 3.5 -> 4
  EXPECT_EQ(std::vector<int8_t>(q2.qs.begin(), q2.qs.begin() + 5), (std::vector<int8_t>{127, 2, 2, 0, 4}));
  EXPECT_EQ(q3.d, 0x2008);
  EXPECT_EQ(q3.qs[0], -127);
  EXPECT_EQ(q3.qs[1], 32);
}

struct q8_k_block {
  float d;
  std::vector<int8_t> qs;
  std::vector<int16_t> bsums;
};

q8_k_block q8_k_at(const std::vector<uint8_t>& out, int32_t b) {
  q8_k_block r{0.0f, std::vector<int8_t>(256), std::vector<int16_t>(16)};
  std::memcpy(&r.d, &out[292 * b], 4);
  std::memcpy(r.qs.data(), &out[292 * b + 4], 256);
  std::memcpy(r.bsums.data(), &out[292 * b + 260], 32);
  return r;
}

TEST(QuantsActivations, Q8_KMapsTheLargestToMinus127) {
  std::vector<float> x(3 * 256, 0.0f);
  // Block 0: the first element of largest magnitude is -127 (x[5]), so iscale = -127 / -127 = 1:
  // q = x rounded half to even, and +127 (x[6]) stays 127; d = 1 / iscale = 1.
  const float b0[7] = {0.5f, 1.5f, 2.5f, -2.5f, -3.5f, -127.0f, 127.0f};
  std::copy(b0, b0 + 7, x.begin());
  x[20] = 100.25f;  // bsums[1]
  // Block 1: the largest is +2 (first), so iscale = -127 / 2 = -63.5 and the signs flip: 2 ->
  // -127, -2 -> 127, 1 -> -63.5 -> -64 (even), 0.5 -> -31.75 -> -32.
  // A NaN gives what ggml's nearest_int makes of it: the default NaN's mantissa bits, 0 (x86).
  const float b1[5] = {2.0f, -2.0f, 1.0f, 0.5f, std::numeric_limits<float>::quiet_NaN()};
  std::copy(b1, b1 + 5, x.begin() + 256);
  // Block 2: all zero.
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes(weight_type::q8_k, 768)), 0xAA);
  quantize_activations(out.data(), x.data(), 768, weight_type::q8_k);

  const q8_k_block k0 = q8_k_at(out, 0), k1 = q8_k_at(out, 1), k2 = q8_k_at(out, 2);
  EXPECT_EQ(k0.d, 1.0f);
  EXPECT_EQ(std::vector<int8_t>(k0.qs.begin(), k0.qs.begin() + 7), (std::vector<int8_t>{0, 2, 2, -2, -4, -127, 127}));
  EXPECT_EQ(k0.qs[20], 100);
  EXPECT_EQ(k0.bsums[0], -2);  // 0 + 2 + 2 - 2 - 4 - 127 + 127
  EXPECT_EQ(k0.bsums[1], 100);
  EXPECT_EQ(k0.bsums[2], 0);
  EXPECT_EQ(k1.d, 1.0f / -63.5f);  // 1 / iscale: -2/127 rounded, -0.015748031...
  EXPECT_EQ(std::vector<int8_t>(k1.qs.begin(), k1.qs.begin() + 5), (std::vector<int8_t>{-127, 127, -64, -32, 0}));
  EXPECT_EQ(k1.bsums[0], -96);  // -127 + 127 - 64 - 32
  EXPECT_EQ(k2.d, 0.0f);
  EXPECT_EQ(k2.qs, std::vector<int8_t>(256, 0));
  EXPECT_EQ(k2.bsums, std::vector<int16_t>(16, 0));
}

TEST(QuantsActivations, F16AndBF16RoundToNearestEven) {
  // 1 + 2^-11 lies halfway between two f16s (1 and 1 + 2^-10): even keeps 1. 1 + 3 * 2^-11
  // lies halfway between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9 (mantissa 2).
  const float x[3] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -65504.0f};
  std::vector<uint8_t> f16(6);
  quantize_activations(f16.data(), x, 3, weight_type::f16);
  EXPECT_EQ(dequantized(f16, weight_type::f16, 3), (std::vector<float>{1.0f, 1.0f + 0x1p-9f, -65504.0f}));
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is halfway (even: 1), 1 + 3 * 2^-8 rounds up to
  // 1 + 2^-6; a NaN stays a NaN (a payload only in the low bits must not round to infinity).
  uint32_t nan_bits = 0x7F800001;
  float nan;
  std::memcpy(&nan, &nan_bits, sizeof(nan));
  const float y[3] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, nan};
  std::vector<uint8_t> bf16(6);
  quantize_activations(bf16.data(), y, 3, weight_type::bf16);
  const std::vector<float> back = dequantized(bf16, weight_type::bf16, 3);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f + 0x1p-6f);
  EXPECT_TRUE(std::isnan(back[2]));
}

// ---- random rows ----

/// Where a block's f16 scales sit (d, and dmin for Q4_K / Q5_K); -1: none.
struct scale_fields {
  int32_t d = -1;
  int32_t dmin = -1;
};

scale_fields scale_offsets(weight_type t) {
  switch (t) {
    case weight_type::q8_0:
    case weight_type::q4_0: return {0, -1};
    case weight_type::q4_k:
    case weight_type::q5_k: return {0, 2};
    case weight_type::q6_k: return {208, -1};
    default: return {};
  }
}

std::vector<float> random_floats(int32_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

/// A weight row: float types from normal values; block types random bytes with sane f16 scales.
std::vector<uint8_t> random_weights(weight_type t, int32_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes(t, n)));
  if (t == weight_type::f32 || t == weight_type::f16 || t == weight_type::bf16) {
    quantize_activations(row.data(), random_floats(n, rng).data(), n, t);
    return row;
  }
  for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f);
  const scale_fields f = scale_offsets(t);
  for (size_t b = 0; b < row.size(); b += static_cast<size_t>(block_bytes(t))) {
    put_u16(row, b + static_cast<size_t>(f.d), f16_bits(scale(rng)));
    if (f.dmin >= 0) put_u16(row, b + static_cast<size_t>(f.dmin), f16_bits(scale(rng)));
  }
  return row;
}

/// Random int8 activations (-128 included, which quantize_activations never makes) with sane
/// scales and matching bsums.
std::vector<uint8_t> random_raw_activations(weight_type dt, int32_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes(dt, n)));
  for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (size_t b = 0; b < row.size(); b += static_cast<size_t>(block_bytes(dt))) {
    if (dt == weight_type::q8_0) {
      put_u16(row, b, f16_bits(scale(rng)));
      continue;
    }
    const float d = scale(rng);
    std::memcpy(&row[b], &d, sizeof(d));
    for (int32_t g = 0; g < 16; g++) {
      int16_t sum = 0;
      for (int32_t l = 0; l < 16; l++) sum = static_cast<int16_t>(sum + static_cast<int8_t>(row[b + 4 + 16 * g + l]));
      std::memcpy(&row[b + 260 + 2 * g], &sum, sizeof(sum));
    }
  }
  return row;
}

/// An activation row of dot_type(t): quantized from normal values, or (`raw`, integer dot
/// types) random int8s.
std::vector<uint8_t> random_activations(weight_type t, int32_t n, std::mt19937& rng, bool raw) {
  const weight_type dt = dot_type(t);
  if (raw && (dt == weight_type::q8_0 || dt == weight_type::q8_k)) return random_raw_activations(dt, n, rng);
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes(dt, n)));
  quantize_activations(row.data(), random_floats(n, rng).data(), n, dt);
  return row;
}

// ---- dot products ----

TEST(QuantsDot, ReferenceEqualsDequantizedDot) {
  std::mt19937 rng(7);
  for (weight_type t : all_weight_types) {
    for (int32_t n : {256, 512, 4096}) {
      for (int32_t trial = 0; trial < 20; trial++) {
        const std::vector<uint8_t> w = random_weights(t, n, rng), x = random_activations(t, n, rng, trial % 2 == 1);
        const std::vector<float> wf = dequantized(w, t, n), xf = dequantized(x, dot_type(t), n);
        double exact = 0.0, magnitude = 0.0;
        for (int32_t j = 0; j < n; j++) {
          exact += static_cast<double>(wf[j]) * xf[j];
          magnitude += std::fabs(static_cast<double>(wf[j]) * xf[j]);
        }
        const float got = reference::vec_dot(w.data(), x.data(), t, n);
        // Rounding errors of about an ulp per step, adding up like a random walk (the worst seen
        // is 40x below this bound; a misplaced quant or scale is off by ~magnitude / sqrt(n)).
        EXPECT_NEAR(got, exact, 0x1p-24 * magnitude * std::sqrt(static_cast<double>(n)))
            << type_name(t) << " n " << n << " trial " << trial;
      }
    }
  }
}

TEST(QuantsDot, FastEqualsReferenceBitForBit) {
  std::mt19937 rng(11);
  for (weight_type t : all_weight_types) {
    const bool floats = block_elements(t) == 1;
    const std::vector<int32_t> ns = floats ? std::vector<int32_t>{1, 7, 31, 32, 33, 100, 4096, 4101}
                                           : block_elements(t) == 32 ? std::vector<int32_t>{32, 64, 96, 512, 4096}
                                                                     : std::vector<int32_t>{256, 512, 4096};
    for (int32_t n : ns) {
      for (int32_t trial = 0; trial < 40; trial++) {
        const std::vector<uint8_t> w = random_weights(t, n, rng), x = random_activations(t, n, rng, trial % 2 == 1);
        const float ref = reference::vec_dot(w.data(), x.data(), t, n);
        const float fst = fast::vec_dot(w.data(), x.data(), t, n);
        EXPECT_TRUE(same_bits(ref, fst)) << type_name(t) << " n " << n << " trial " << trial << ": " << ref << " vs "
                                         << fst;
      }
    }
  }
}

TEST(QuantsDot, Q8_0MinusOneTwentyEightSquaredIsExact) {
  // -128 x -128 is +16384; a sign-flip shortcut (maddubs of |x| and sign-adjusted w) wraps it.
  std::vector<uint8_t> w(34, 0x80), x(34, 0x80);
  put_u16(w, 0, 0x3C00);  // d = 1
  put_u16(x, 0, 0x3C00);
  EXPECT_EQ(reference::vec_dot(w.data(), x.data(), weight_type::q8_0, 32), 524288.0f);  // 32 x 16384
  EXPECT_EQ(fast::vec_dot(w.data(), x.data(), weight_type::q8_0, 32), 524288.0f);
  float one_row = 0.0f;  // decode's matmul, with its activation row prepared
  fast::matmul(&one_row, x.data(), quant_matrix{w.data(), weight_type::q8_0, 1, 32}, 1);
  EXPECT_EQ(one_row, 524288.0f);
  // 16 weight rows by 5 activation rows: the many-row kernel's path with VNNI
  std::vector<uint8_t> ws, xs;
  for (int i = 0; i < 16; i++) ws.insert(ws.end(), w.begin(), w.end());
  for (int i = 0; i < 5; i++) xs.insert(xs.end(), x.begin(), x.end());
  std::vector<float> many(16 * 5, 0.0f);
  fast::matmul(many.data(), xs.data(), quant_matrix{ws.data(), weight_type::q8_0, 16, 32}, 5);
  EXPECT_EQ(many, std::vector<float>(16 * 5, 524288.0f));
  // the same 16 rows laid out as rows16, by 1 and 5 activation rows
  std::vector<uint8_t> packed(ws.size());
  const quant_matrix rows16 = fast::repack_rows16(quant_matrix{ws.data(), weight_type::q8_0, 16, 32}, packed.data());
  for (int32_t rows : {1, 5}) {
    std::vector<float> out(16 * static_cast<size_t>(rows), 0.0f);
    fast::matmul(out.data(), xs.data(), rows16, rows);
    EXPECT_EQ(out, std::vector<float>(out.size(), 524288.0f)) << rows << " rows";
  }
}

// ---- matmul ----

struct random_problem {
  std::vector<uint8_t> weights;  // (d, row_bytes)
  std::vector<uint8_t> xq;       // (rows, row_bytes of the dot type)
  quant_matrix w;
  int64_t x_row_bytes = 0;
};

random_problem make_problem(weight_type t, int32_t d, int32_t n, int32_t rows, std::mt19937& rng) {
  random_problem p;
  for (int32_t i = 0; i < d; i++) {
    const std::vector<uint8_t> r = random_weights(t, n, rng);
    p.weights.insert(p.weights.end(), r.begin(), r.end());
  }
  for (int32_t r = 0; r < rows; r++) {
    const std::vector<uint8_t> x = random_activations(t, n, rng, r % 3 == 2);
    p.xq.insert(p.xq.end(), x.begin(), x.end());
  }
  p.w = quant_matrix{p.weights.data(), t, d, n};
  p.x_row_bytes = row_bytes(dot_type(t), n);
  return p;
}

int32_t test_n(weight_type t) { return block_elements(t) == 1 ? 1000 : 1024; }

TEST(QuantsMatmul, FastEqualsReferenceForRowsOneToNine) {
  std::mt19937 rng(13);
  thread_pool pool(3);
  for (weight_type t : all_weight_types) {
    // d * n * rows crosses the split threshold (2^18) from 4 rows on.
    const random_problem p = make_problem(t, 67, test_n(t), 9, rng);
    for (int32_t rows = 1; rows <= 9; rows++) {
      std::vector<float> ref(static_cast<size_t>(rows) * 67), fst(ref.size(), -1.0f), split(ref.size(), -1.0f);
      reference::matmul(ref.data(), p.xq.data(), p.w, rows);
      fast::matmul(fst.data(), p.xq.data(), p.w, rows);
      fast::matmul(split.data(), p.xq.data(), p.w, rows, &pool);
      EXPECT_TRUE(same_bits(ref, fst)) << type_name(t) << " rows " << rows;
      EXPECT_TRUE(same_bits(ref, split)) << type_name(t) << " rows " << rows << " on 3 threads";
    }
  }
}

TEST(QuantsMatmul, PrefillAcrossPanelsAndTilesEqualsReference) {
  // Prefill's path: weight rows in panels of ~256 KiB (601 rows of 2048 span 2-10 of them,
  // none a multiple of the 3-row tiles), 4-row groups with Q8_0's prepared activations, and the
  // 3 rows left after them.
  std::mt19937 rng(29);
  thread_pool pool(2);
  constexpr int32_t d = 601, n = 2048, rows = 11;
  for (weight_type t : all_weight_types) {
    const random_problem p = make_problem(t, d, n, rows, rng);
    std::vector<float> ref(static_cast<size_t>(rows) * d), fst(ref.size(), -1.0f), split(ref.size(), -1.0f);
    reference::matmul(ref.data(), p.xq.data(), p.w, rows);
    fast::matmul(fst.data(), p.xq.data(), p.w, rows);
    fast::matmul(split.data(), p.xq.data(), p.w, rows, &pool);
    EXPECT_TRUE(same_bits(ref, fst)) << type_name(t);
    EXPECT_TRUE(same_bits(ref, split)) << type_name(t) << " on 2 threads";
  }
}

TEST(QuantsMatmul, EveryInstructionSetGivesTheReferenceBits) {
  // Both builds of the fast kernels run here where the CPU has them (this project's machines
  // have AVX-512 VNNI; a CPU without it skips that set, saying so).
  std::mt19937 rng(31);
  thread_pool pool(2);
  std::printf("selected: %s\n", fast::isa_name(fast::selected_isa()));
  EXPECT_TRUE(fast::cpu_runs(fast::selected_isa()));
  for (fast::isa i : {fast::isa::avx2, fast::isa::avx512}) {
    if (!fast::cpu_runs(i)) {
      std::printf("skipped: this CPU does not run %s\n", fast::isa_name(i));
      continue;
    }
    for (weight_type t : all_weight_types)
      for (int32_t rows : {1, 4, 9}) {
        const random_problem p = make_problem(t, 301, 2048, rows, rng);
        std::vector<float> ref(static_cast<size_t>(rows) * 301), fst(ref.size(), -1.0f);
        reference::matmul(ref.data(), p.xq.data(), p.w, rows);
        fast::matmul(i, fst.data(), p.xq.data(), p.w, rows, &pool);
        EXPECT_TRUE(same_bits(ref, fst)) << fast::isa_name(i) << " " << type_name(t) << " rows " << rows;
      }
  }
}

TEST(QuantsMatmul, Q8_0FamilyRowsWithBlocksPastTheLastFour) {
  // 3, 7 and 13 blocks a row: the blocks after the last whole four take their own path per row
  // group (13: one-row decode's steps of eight blocks, then four, then one). 37 weight rows: two
  // groups of 16 (more than 4 activation rows, with VNNI) and 5 rows on the per-row path.
  std::mt19937 rng(17);
  for (weight_type t : {weight_type::q8_0, weight_type::q4_0}) {
    for (int32_t n : {96, 224, 416}) {
      const random_problem p = make_problem(t, 37, n, 9, rng);
      for (int32_t rows = 1; rows <= 9; rows++) {
        std::vector<float> ref(static_cast<size_t>(rows) * 37), fst(ref.size(), -1.0f);
        reference::matmul(ref.data(), p.xq.data(), p.w, rows);
        fast::matmul(fst.data(), p.xq.data(), p.w, rows);
        EXPECT_TRUE(same_bits(ref, fst)) << type_name(t) << " n " << n << " rows " << rows;
      }
    }
  }
}

// ---- rows16: Q8_0 and Q4_0 laid out sixteen rows at a time ----

TEST(QuantsRows16, RepackPutsEachByteWhereTheLayoutSays) {
  // 16 Q8_0 rows of 2 blocks: quant j of row l's block b is l + 16b + j - 40 (int8), its scale
  // 0x3c00 + 2l + b. Quants: register g of block b at 512b + 64g, row l's four at 4l, + 128.
  // Scales after the 1024 bytes of quants, row l's block b at 1024 + 2 (16b + l).
  std::vector<uint8_t> w(16 * 68);
  for (int l = 0; l < 16; l++)
    for (int b = 0; b < 2; b++) {
      uint8_t* block = &w[static_cast<size_t>(68 * l + 34 * b)];
      const uint16_t d = static_cast<uint16_t>(0x3c00 + 2 * l + b);
      std::memcpy(block, &d, 2);
      for (int j = 0; j < 32; j++) block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(l + 16 * b + j - 40));
    }
  const quant_matrix m{w.data(), weight_type::q8_0, 16, 64};
  for (bool simd : {false, true}) {
    std::vector<uint8_t> out(w.size(), 0);
    const quant_matrix r = simd ? fast::repack_rows16(m, out.data()) : reference::repack_rows16(m, out.data());
    EXPECT_EQ(r.layout, matrix_layout::rows16);
    EXPECT_EQ(r.data, out.data());
    EXPECT_EQ(out[0], static_cast<uint8_t>(-40 + 128));                // row 0, block 0, quant 0
    EXPECT_EQ(out[4 * 3 + 1], static_cast<uint8_t>(3 + 1 - 40 + 128));  // row 3, quant 1
    EXPECT_EQ(out[512 + 64 * 1 + 4 * 3 + 2], static_cast<uint8_t>(3 + 16 + 6 - 40 + 128));  // row 3, block 1, quant 6
    EXPECT_EQ(out[512 + 64 * 7 + 4 * 15 + 3], static_cast<uint8_t>(15 + 16 + 31 - 40 + 128));  // the last
    uint16_t d = 0;
    std::memcpy(&d, &out[1024 + 2 * (16 * 1 + 3)], 2);
    EXPECT_EQ(d, 0x3c00 + 2 * 3 + 1) << "row 3, block 1's scale";
  }
}

TEST(QuantsRows16, SimdRepackGivesTheReferenceBytesAndEveryRowBack) {
  std::mt19937 rng(37);
  for (weight_type t : {weight_type::q8_0, weight_type::q4_0})
    for (int32_t n : {96, 224, 2048}) {
      const random_problem p = make_problem(t, 48, n, 0, rng);
      std::vector<uint8_t> simd(p.weights.size()), scalar(p.weights.size()), row(static_cast<size_t>(row_bytes(t, n)));
      const quant_matrix r = fast::repack_rows16(p.w, simd.data());
      (void)reference::repack_rows16(p.w, scalar.data());
      EXPECT_EQ(simd, scalar) << type_name(t) << " n " << n;
      EXPECT_NE(simd, p.weights) << type_name(t) << " n " << n;
      for (int32_t i = 0; i < 48; i++) {
        copy_row(r, i, row.data());
        EXPECT_TRUE(std::equal(row.begin(), row.end(), p.w.row(i))) << type_name(t) << " n " << n << " row " << i;
      }
    }
}

TEST(QuantsRows16, MatmulGivesTheReferenceBitsOnEveryRowCountThreadAndInstructionSet) {
  // 48 rows (three groups, one per thread of 3), 3/7/13/64 blocks a row (the blocks past the
  // last whole four), 1-9 and 16 activation rows. An instruction set that does not take rows16
  // (AVX2) goes through the reference.
  std::mt19937 rng(41);
  thread_pool pool(3);
  for (weight_type t : {weight_type::q8_0, weight_type::q4_0})
    for (int32_t n : {96, 224, 416, 2048}) {
      const random_problem p = make_problem(t, 48, n, 16, rng);
      std::vector<uint8_t> packed(p.weights.size());
      const quant_matrix r = fast::repack_rows16(p.w, packed.data());
      for (int32_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
        std::vector<float> ref(static_cast<size_t>(rows) * 48), fst(ref.size(), -1.0f), split(ref.size(), -1.0f),
            of_packed(ref.size(), -1.0f);
        reference::matmul(ref.data(), p.xq.data(), p.w, rows);
        reference::matmul(of_packed.data(), p.xq.data(), r, rows);
        fast::matmul(fst.data(), p.xq.data(), r, rows);
        fast::matmul(split.data(), p.xq.data(), r, rows, &pool);
        EXPECT_TRUE(same_bits(ref, of_packed)) << type_name(t) << " n " << n << " rows " << rows << ": reference";
        EXPECT_TRUE(same_bits(ref, fst)) << type_name(t) << " n " << n << " rows " << rows;
        EXPECT_TRUE(same_bits(ref, split)) << type_name(t) << " n " << n << " rows " << rows << " on 3 threads";
        for (fast::isa i : {fast::isa::avx2, fast::isa::avx512}) {
          if (!fast::cpu_runs(i)) continue;
          std::vector<float> on(ref.size(), -1.0f);
          fast::matmul(i, on.data(), p.xq.data(), r, rows, &pool);
          EXPECT_TRUE(same_bits(ref, on)) << fast::isa_name(i) << " " << type_name(t) << " n " << n << " rows " << rows;
        }
      }
    }
}

TEST(QuantsMatmul, BatchAndThreadInvariant) {
  std::mt19937 rng(17);
  constexpr int32_t d = 300, rows = 9;  // 300 x ~1024 x 9: split on every pool
  thread_pool pool1(1), pool2(2), pool3(3);
  for (weight_type t : all_weight_types) {
    const random_problem p = make_problem(t, d, test_n(t), rows, rng);
    std::vector<float> batch(static_cast<size_t>(rows) * d);
    fast::matmul(batch.data(), p.xq.data(), p.w, rows, &pool2);
    for (int32_t r = 0; r < rows; r++) {
      std::vector<float> alone(d);
      fast::matmul(alone.data(), p.xq.data() + r * p.x_row_bytes, p.w, 1);
      const std::vector<float> in_batch(batch.begin() + r * d, batch.begin() + (r + 1) * d);
      EXPECT_TRUE(same_bits(alone, in_batch)) << type_name(t) << " row " << r;
    }
    for (thread_pool* pool : {&pool1, &pool3}) {
      std::vector<float> other(batch.size(), -1.0f);
      fast::matmul(other.data(), p.xq.data(), p.w, rows, pool);
      EXPECT_TRUE(same_bits(batch, other)) << type_name(t) << " on " << pool->num_threads() << " threads";
    }
  }
}

}  // namespace
}  // namespace troupe::kernels::cpu
