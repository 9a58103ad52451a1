// ggml's weight formats: the type table, dequantization, activation conversion and the readable
// reference dot products, in the order quants.hpp fixes. quants_fast.inl must reproduce these
// bits exactly.
#include "kernels/cpu/quants.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/quant_blocks.hpp"

namespace troupe::kernels::cpu {
namespace {

using blocks::qk;
using blocks::qk_k;

struct type_info {
  weight_type type;
  const char* name;
  int32_t block_elements;
  int32_t block_bytes;
  weight_type dot;  ///< Q8_K's own: no dot product takes it as weights (is_weight_type)
};

constexpr type_info type_table[] = {
    {weight_type::f32, "F32", 1, 4, weight_type::f32},
    {weight_type::f16, "F16", 1, 2, weight_type::f16},
    {weight_type::bf16, "BF16", 1, 2, weight_type::bf16},
    {weight_type::q8_0, "Q8_0", qk, sizeof(blocks::q8_0), weight_type::q8_0},
    {weight_type::q4_0, "Q4_0", qk, sizeof(blocks::q4_0), weight_type::q8_0},
    {weight_type::q4_k, "Q4_K", qk_k, sizeof(blocks::q4_k), weight_type::q8_k},
    {weight_type::q5_k, "Q5_K", qk_k, sizeof(blocks::q5_k), weight_type::q8_k},
    {weight_type::q6_k, "Q6_K", qk_k, sizeof(blocks::q6_k), weight_type::q8_k},
    {weight_type::q8_k, "Q8_K", qk_k, sizeof(blocks::q8_k), weight_type::q8_k},
};

const type_info& info(weight_type t) {
  for (const type_info& i : type_table)
    if (i.type == t) return i;
  TROUPE_KERNEL_ASSERT(!"a weight_type outside the type table");
}

/// ggml's GGML_FP32_TO_BF16: round to nearest even; a NaN keeps its top bits, made quiet (a
/// NaN whose payload lies only in the low 16 bits would otherwise round to infinity).
uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/// A value already rounded to an integer, as int8 the way x86's cvtps2dq then packs saturate it
/// (a NaN becomes INT_MIN there, so -128). Finite activations never reach the bounds.
int8_t saturate_int8(float rounded) {
  if (!(rounded >= -128.0f)) return -128;
  if (rounded > 127.0f) return 127;
  return static_cast<int8_t>(rounded);
}

/// ggml's nearest_int: adding 1.5 * 2^23 leaves x's integer part, rounded half to even, in the
/// low mantissa bits (for |x| < 2^22). Kept as ggml writes it, not nearbyint, so that even a
/// NaN activation gives ggml's quant (the default NaN gives 0).
int32_t nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

float max_abs(const float* x, int32_t n) {
  float m = 0.0f;
  for (int32_t j = 0; j < n; j++) m = std::fabs(x[j]) > m ? std::fabs(x[j]) : m;
  return m;
}

// ---- unpacking: a block's quants as plain integers in element order ----

/// Q4_K's 256 nibbles, element order.
void unpack_q4_k(uint8_t* q, const blocks::q4_k& b) {
  for (int32_t c = 0; c < 4; c++) {
    for (int32_t l = 0; l < 32; l++) {
      q[64 * c + l] = b.qs[32 * c + l] & 0xF;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
  }
}

/// Q5_K's 256 five-bit quants, element order.
void unpack_q5_k(uint8_t* q, const blocks::q5_k& b) {
  for (int32_t c = 0; c < 4; c++) {
    for (int32_t l = 0; l < 32; l++) {
      q[64 * c + l] = b.qs[32 * c + l] & 0xF;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
  }
  for (int32_t e = 0; e < qk_k; e++) q[e] += ((b.qh[e % 32] >> (e / 32)) & 1) << 4;
}

/// Q6_K's 256 quants minus 32, element order.
void unpack_q6_k(int8_t* q, const blocks::q6_k& b) {
  for (int32_t h = 0; h < 2; h++) {
    const uint8_t* ql = b.ql + 64 * h;  // (64)
    const uint8_t* qh = b.qh + 32 * h;  // (32)
    for (int32_t k = 0; k < 4; k++) {
      for (int32_t l = 0; l < 32; l++) {
        const int32_t low = k < 2 ? ql[l + 32 * (k & 1)] & 0xF : ql[l + 32 * (k & 1)] >> 4;
        const int32_t high = (qh[l] >> (2 * k)) & 3;
        q[128 * h + 32 * k + l] = static_cast<int8_t>((low | (high << 4)) - 32);
      }
    }
  }
}

// ---- dequantization, in ggml's float order ----

void dequantize_q8_0(float* y, const blocks::q8_0* b, int32_t nb) {
  for (int32_t i = 0; i < nb; i++) {
    const float d = blocks::f16_to_f32(b[i].d);
    for (int32_t j = 0; j < qk; j++) y[qk * i + j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequantize_q4_0(float* y, const blocks::q4_0* b, int32_t nb) {
  for (int32_t i = 0; i < nb; i++) {
    const float d = blocks::f16_to_f32(b[i].d);
    for (int32_t j = 0; j < qk / 2; j++) {
      y[qk * i + j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[qk * i + j + qk / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

/// Q4_K and Q5_K: y = (d * scale) * q - dmin * min per sub-block of 32.
template <class Block, void (*unpack)(uint8_t*, const Block&)>
void dequantize_k_mins(float* y, const Block* b, int32_t nb) {
  for (int32_t i = 0; i < nb; i++) {
    uint8_t q[qk_k];
    unpack(q, b[i]);
    const float d = blocks::f16_to_f32(b[i].d);
    const float dmin = blocks::f16_to_f32(b[i].dmin);
    for (int32_t j = 0; j < 8; j++) {
      const blocks::scale_min sm = blocks::scale_min_k4(b[i].scales, j);
      const float scale = d * static_cast<float>(sm.scale);
      const float min = dmin * static_cast<float>(sm.min);
      for (int32_t l = 0; l < 32; l++) y[qk_k * i + 32 * j + l] = scale * static_cast<float>(q[32 * j + l]) - min;
    }
  }
}

void dequantize_q6_k(float* y, const blocks::q6_k* b, int32_t nb) {
  for (int32_t i = 0; i < nb; i++) {
    int8_t q[qk_k];
    unpack_q6_k(q, b[i]);
    const float d = blocks::f16_to_f32(b[i].d);
    for (int32_t e = 0; e < qk_k; e++)
      y[qk_k * i + e] = d * static_cast<float>(b[i].scales[e / 16]) * static_cast<float>(q[e]);
  }
}

void dequantize_q8_k(float* y, const blocks::q8_k* b, int32_t nb) {
  for (int32_t i = 0; i < nb; i++)
    for (int32_t j = 0; j < qk_k; j++) y[qk_k * i + j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

// ---- activation conversion ----

/// quantize_row_q8_0's AVX2 path: q = x * (127 / amax) rounded half to even.
void quantize_q8_0(blocks::q8_0* out, const float* x, int32_t nb) {
  for (int32_t i = 0; i < nb; i++) {
    const float* xb = x + qk * i;  // (32)
    const float amax = max_abs(xb, qk);
    out[i].d = blocks::f32_to_f16(amax / 127.0f);
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int32_t j = 0; j < qk; j++) out[i].qs[j] = saturate_int8(std::nearbyint(xb[j] * inverse));
  }
}

/// quantize_row_q8_K_ref: scaled so that the first element of largest magnitude maps to -127
/// (one of opposite sign and equal magnitude maps to +127, ggml's min(127, v) bounding it).
void quantize_q8_k(blocks::q8_k* out, const float* x, int32_t nb) {
  for (int32_t i = 0; i < nb; i++) {
    const float* xb = x + qk_k * i;  // (256)
    float amax = 0.0f, max = 0.0f;
    for (int32_t j = 0; j < qk_k; j++) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    // ggml leaves an all-zero block's bsums unwritten; zero is what its quants sum to.
    std::memset(&out[i], 0, sizeof(out[i]));
    if (amax == 0.0f) continue;
    const float iscale = -127.0f / max;
    for (int32_t j = 0; j < qk_k; j++) {
      const int32_t v = nearest_int(iscale * xb[j]);
      out[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);  // >= -127 for finite x
    }
    for (int32_t j = 0; j < qk_k; j++) out[i].bsums[j / 16] = static_cast<int16_t>(out[i].bsums[j / 16] + out[i].qs[j]);
    out[i].d = 1.0f / iscale;
  }
}

// ---- reference dot products ----

/// F32, F16, BF16: 32 lanes of fused multiply-adds, the fixed tree, then the tail in order.
template <float (*load)(const uint8_t*, int32_t)>
float dot_float(const uint8_t* w, const uint8_t* x, int32_t n) {
  float acc[32] = {};
  const int32_t body = n - n % 32;
  for (int32_t j = 0; j < body; j++) acc[j % 32] = std::fmaf(load(w, j), load(x, j), acc[j % 32]);
  float s[8], t[4], u[2];
  for (int32_t i = 0; i < 8; i++) s[i] = (acc[i] + acc[i + 8]) + (acc[i + 16] + acc[i + 24]);
  for (int32_t i = 0; i < 4; i++) t[i] = s[i] + s[i + 4];
  for (int32_t i = 0; i < 2; i++) u[i] = t[i] + t[i + 2];
  float sum = u[0] + u[1];
  for (int32_t j = body; j < n; j++) sum = std::fmaf(load(w, j), load(x, j), sum);
  return sum;
}

float load_f32(const uint8_t* p, int32_t j) {
  float v;
  std::memcpy(&v, p + 4 * static_cast<int64_t>(j), sizeof(v));
  return v;
}

template <float (*convert)(uint16_t)>
float load_16(const uint8_t* p, int32_t j) {
  uint16_t bits;
  std::memcpy(&bits, p + 2 * static_cast<int64_t>(j), sizeof(bits));
  return convert(bits);
}

int32_t isum_q8_0(const blocks::q8_0& w, const blocks::q8_0& x) {
  int32_t isum = 0;
  for (int32_t j = 0; j < qk; j++) isum += static_cast<int32_t>(w.qs[j]) * x.qs[j];
  return isum;
}

int32_t isum_q4_0(const blocks::q4_0& w, const blocks::q8_0& x) {
  int32_t isum = 0;
  for (int32_t j = 0; j < qk / 2; j++) {
    isum += ((w.qs[j] & 0xF) - 8) * x.qs[j];
    isum += ((w.qs[j] >> 4) - 8) * x.qs[j + qk / 2];
  }
  return isum;
}

/// Q8_0 and Q4_0's float steps (quants.hpp): block b's product into lane b mod 4 over the first
/// nb - nb mod 4 blocks, the lanes summed as (0 + 1) + (2 + 3), then the last blocks in order.
template <class Block, int32_t (*isum)(const Block&, const blocks::q8_0&)>
float dot_q8_0_family(const Block* w, const blocks::q8_0* x, int32_t nb) {
  const auto product = [&](int32_t i) {
    return static_cast<float>(isum(w[i], x[i])) * (blocks::f16_to_f32(w[i].d) * blocks::f16_to_f32(x[i].d));
  };
  float lane[4] = {};
  const int32_t body = nb - nb % 4;
  for (int32_t i = 0; i < body; i++) lane[i % 4] += product(i);
  float sum = (lane[0] + lane[1]) + (lane[2] + lane[3]);
  for (int32_t i = body; i < nb; i++) sum += product(i);
  return sum;
}

/// Q4_K and Q5_K: isum over the sub-blocks' scaled dot products, msum over their mins times the
/// activations' sums.
template <class Block, void (*unpack)(uint8_t*, const Block&)>
float dot_k_mins(const Block* w, const blocks::q8_k* x, int32_t nb) {
  float sum = 0.0f;
  for (int32_t i = 0; i < nb; i++) {
    uint8_t q[qk_k];
    unpack(q, w[i]);
    int32_t isum = 0, msum = 0;
    for (int32_t j = 0; j < 8; j++) {
      const blocks::scale_min sm = blocks::scale_min_k4(w[i].scales, j);
      int32_t dot = 0;
      for (int32_t l = 0; l < 32; l++) dot += q[32 * j + l] * x[i].qs[32 * j + l];
      isum += sm.scale * dot;
      msum += sm.min * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
    }
    const float dw = blocks::f16_to_f32(w[i].d), dmin = blocks::f16_to_f32(w[i].dmin);
    sum += (x[i].d * dw) * static_cast<float>(isum) - (x[i].d * dmin) * static_cast<float>(msum);
  }
  return sum;
}

float dot_q6_k(const blocks::q6_k* w, const blocks::q8_k* x, int32_t nb) {
  float sum = 0.0f;
  for (int32_t i = 0; i < nb; i++) {
    int8_t q[qk_k];
    unpack_q6_k(q, w[i]);
    int32_t isum = 0;
    for (int32_t j = 0; j < 16; j++) {
      int32_t dot = 0;
      for (int32_t l = 0; l < 16; l++) dot += q[16 * j + l] * x[i].qs[16 * j + l];
      isum += w[i].scales[j] * dot;
    }
    sum += (x[i].d * blocks::f16_to_f32(w[i].d)) * static_cast<float>(isum);
  }
  return sum;
}

template <class Block>
const Block* as(const uint8_t* p) {
  return reinterpret_cast<const Block*>(p);
}

}  // namespace

bool is_weight_type(uint32_t raw) {
  for (const type_info& i : type_table)
    if (static_cast<uint32_t>(i.type) == raw) return i.type != weight_type::q8_k;
  return false;
}

const char* type_name(weight_type t) { return info(t).name; }

int32_t block_elements(weight_type t) { return info(t).block_elements; }

int32_t block_bytes(weight_type t) { return info(t).block_bytes; }

weight_type dot_type(weight_type t) {
  TROUPE_KERNEL_ASSERT(is_weight_type(static_cast<uint32_t>(t)));
  return info(t).dot;
}

int64_t row_bytes(weight_type t, int64_t n) {
  const type_info& i = info(t);
  TROUPE_KERNEL_ASSERT(n >= 0);
  TROUPE_KERNEL_ASSERT(n % i.block_elements == 0);
  return n / i.block_elements * i.block_bytes;
}

namespace {

/// Where a rows16 matrix keeps each byte of a row's blocks (quants.hpp's matrix_layout).
struct rows16_shape {
  int64_t nb, block, quants, row;  ///< blocks a row; bytes a block, of its quants, a row
  uint8_t bias;                    ///< what a quant byte is XORed with (Q8_0: + 128)
  explicit rows16_shape(const quant_matrix& w)
      : nb(w.n / block_elements(w.type)),
        block(block_bytes(w.type)),
        quants(block - 2),
        row(row_bytes(w.type, w.n)),
        bias(w.type == weight_type::q8_0 ? 0x80 : 0) {}
  /// Byte j of row i's block b's quants.
  [[nodiscard]] int64_t quant_at(int64_t i, int64_t b, int64_t j) const {
    return (i - i % 16) * row + b * 16 * quants + 64 * (j / 4) + 4 * (i % 16) + j % 4;
  }
  /// Row i's block b's f16 scale.
  [[nodiscard]] int64_t scale_at(int64_t i, int64_t b) const {
    return (i - i % 16) * row + nb * 16 * quants + 2 * (16 * b + i % 16);
  }
};

}  // namespace

void copy_row(const quant_matrix& w, int64_t i, uint8_t* out) {
  if (w.layout == matrix_layout::rows) {
    std::memcpy(out, w.row(i), static_cast<size_t>(row_bytes(w.type, w.n)));
    return;
  }
  const rows16_shape s(w);
  for (int64_t b = 0; b < s.nb; b++, out += s.block) {
    std::memcpy(out, w.data + s.scale_at(i, b), 2);
    for (int64_t j = 0; j < s.quants; j++) out[2 + j] = w.data[s.quant_at(i, b, j)] ^ s.bias;
  }
}

void dequantize_row(float* out, const uint8_t* row, weight_type t, int32_t n) {
  const int32_t nb = n / block_elements(t);
  TROUPE_KERNEL_ASSERT(nb * block_elements(t) == n);
  switch (t) {
    case weight_type::f32: std::memcpy(out, row, sizeof(float) * static_cast<size_t>(n)); return;
    case weight_type::f16: {
      int32_t j = 0;
#ifdef __F16C__  // the same exact conversion, 8 at a time (GCC 12 leaves the loop below scalar)
      for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * j))));
#endif
      for (; j < n; j++) out[j] = load_16<blocks::f16_to_f32>(row, j);
      return;
    }
    case weight_type::bf16:
      for (int32_t j = 0; j < n; j++) out[j] = load_16<blocks::bf16_to_f32>(row, j);
      return;
    case weight_type::q8_0: return dequantize_q8_0(out, as<blocks::q8_0>(row), nb);
    case weight_type::q4_0: return dequantize_q4_0(out, as<blocks::q4_0>(row), nb);
    case weight_type::q4_k: return dequantize_k_mins<blocks::q4_k, unpack_q4_k>(out, as<blocks::q4_k>(row), nb);
    case weight_type::q5_k: return dequantize_k_mins<blocks::q5_k, unpack_q5_k>(out, as<blocks::q5_k>(row), nb);
    case weight_type::q6_k: return dequantize_q6_k(out, as<blocks::q6_k>(row), nb);
    case weight_type::q8_k: return dequantize_q8_k(out, as<blocks::q8_k>(row), nb);
  }
  TROUPE_KERNEL_ASSERT(!"dequantize_row: unknown type");
}

void quantize_activations(uint8_t* out, const float* x, int32_t n, weight_type t) {
  const int32_t nb = n / block_elements(t);
  TROUPE_KERNEL_ASSERT(nb * block_elements(t) == n);
  switch (t) {
    case weight_type::f32: std::memcpy(out, x, sizeof(float) * static_cast<size_t>(n)); return;
    case weight_type::f16:
    case weight_type::bf16:
      for (int32_t j = 0; j < n; j++) {
        const uint16_t bits = t == weight_type::f16 ? blocks::f32_to_f16(x[j]) : f32_to_bf16(x[j]);
        std::memcpy(out + 2 * static_cast<int64_t>(j), &bits, sizeof(bits));
      }
      return;
    case weight_type::q8_0: return quantize_q8_0(reinterpret_cast<blocks::q8_0*>(out), x, nb);
    case weight_type::q8_k: return quantize_q8_k(reinterpret_cast<blocks::q8_k*>(out), x, nb);
    default: break;
  }
  TROUPE_KERNEL_ASSERT(!"quantize_activations: not a dot type");
}

namespace reference {

float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n) {
  TROUPE_KERNEL_ASSERT(is_weight_type(static_cast<uint32_t>(t)));
  const int32_t nb = n / block_elements(t);
  TROUPE_KERNEL_ASSERT(nb * block_elements(t) == n);
  switch (t) {
    case weight_type::f32: return dot_float<load_f32>(w, x, n);
    case weight_type::f16: return dot_float<load_16<blocks::f16_to_f32>>(w, x, n);
    case weight_type::bf16: return dot_float<load_16<blocks::bf16_to_f32>>(w, x, n);
    case weight_type::q8_0: return dot_q8_0_family<blocks::q8_0, isum_q8_0>(as<blocks::q8_0>(w), as<blocks::q8_0>(x), nb);
    case weight_type::q4_0: return dot_q8_0_family<blocks::q4_0, isum_q4_0>(as<blocks::q4_0>(w), as<blocks::q8_0>(x), nb);
    case weight_type::q4_k: return dot_k_mins<blocks::q4_k, unpack_q4_k>(as<blocks::q4_k>(w), as<blocks::q8_k>(x), nb);
    case weight_type::q5_k: return dot_k_mins<blocks::q5_k, unpack_q5_k>(as<blocks::q5_k>(w), as<blocks::q8_k>(x), nb);
    case weight_type::q6_k: return dot_q6_k(as<blocks::q6_k>(w), as<blocks::q8_k>(x), nb);
    case weight_type::q8_k: break;
  }
  TROUPE_KERNEL_ASSERT(!"vec_dot: not a weight type");
}

void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows) {
  const int64_t x_row_bytes = row_bytes(dot_type(w.type), w.n);
  std::vector<uint8_t> copy(w.layout == matrix_layout::rows ? 0 : static_cast<size_t>(row_bytes(w.type, w.n)));
  for (int32_t i = 0; i < w.d; i++) {
    const uint8_t* row = w.layout == matrix_layout::rows ? w.row(i) : (copy_row(w, i, copy.data()), copy.data());
    for (int32_t r = 0; r < rows; r++)
      out[static_cast<int64_t>(r) * w.d + i] = vec_dot(row, xq + r * x_row_bytes, w.type, w.n);
  }
}

quant_matrix repack_rows16(const quant_matrix& w, uint8_t* out) {
  TROUPE_KERNEL_ASSERT((w.type == weight_type::q8_0 || w.type == weight_type::q4_0) && w.layout == matrix_layout::rows &&
                       w.d % 16 == 0);
  const rows16_shape s(w);
  for (int64_t i = 0; i < w.d; i++) {
    const uint8_t* row = w.row(i);
    for (int64_t b = 0; b < s.nb; b++, row += s.block) {
      std::memcpy(out + s.scale_at(i, b), row, 2);
      for (int64_t j = 0; j < s.quants; j++) out[s.quant_at(i, b, j)] = row[2 + j] ^ s.bias;
    }
  }
  quant_matrix r = w;
  r.data = out;
  r.layout = matrix_layout::rows16;
  return r;
}

}  // namespace reference

}  // namespace troupe::kernels::cpu
