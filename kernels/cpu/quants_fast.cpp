// Fast dot products over ggml's block formats: quants.cpp's reference with AVX2. Inside a block
// every product is summed as an exact int32, so the lanes may add in any order; the float steps
// between blocks are the reference's, one at a time, in its order (quants.hpp), so the bits are
// the reference's. Built without AVX2 (+FMA, F16C), fast:: is the reference.
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TROUPE_QUANTS_AVX2 1
#include <immintrin.h>
#endif

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/quant_blocks.hpp"
#include "kernels/cpu/quants.hpp"

namespace troupe::kernels::cpu::fast {
namespace {

#ifdef TROUPE_QUANTS_AVX2
using blocks::qk;
using blocks::qk_k;

// ---- F32, F16, BF16: 8 elements as float ----

__m256 load8_f32(const uint8_t* p, int64_t j) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + j); }

__m256 load8_f16(const uint8_t* p, int64_t j) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j)));
}

__m256 load8_bf16(const uint8_t* p, int64_t j) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

float load1_f32(const uint8_t* p, int64_t j) {
  float v;
  std::memcpy(&v, p + 4 * j, sizeof(v));
  return v;
}

template <float (*convert)(uint16_t)>
float load1_16(const uint8_t* p, int64_t j) {
  uint16_t bits;
  std::memcpy(&bits, p + 2 * j, sizeof(bits));
  return convert(bits);
}

/// Lanes 0-31 are the reference's acc[0..32) in four registers of 8, so the tree's first level
/// (acc[i] + acc[i + 8]) + (acc[i + 16] + acc[i + 24]) is (a0 + a1) + (a2 + a3), lane for lane.
template <__m256 (*load8)(const uint8_t*, int64_t), float (*load1)(const uint8_t*, int64_t)>
float dot_float(const uint8_t* w, const uint8_t* x, int32_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int32_t body = n - n % 32;
  for (int64_t j = 0; j < body; j += 32) {
    a0 = _mm256_fmadd_ps(load8(w, j), load8(x, j), a0);
    a1 = _mm256_fmadd_ps(load8(w, j + 8), load8(x, j + 8), a1);
    a2 = _mm256_fmadd_ps(load8(w, j + 16), load8(x, j + 16), a2);
    a3 = _mm256_fmadd_ps(load8(w, j + 24), load8(x, j + 24), a3);
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // s[i] + s[i + 4]
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                  // t[i] + t[i + 2]
  float sum = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));                           // u[0] + u[1]
  for (int64_t j = body; j < n; j++) sum = std::fmaf(load1(w, j), load1(x, j), sum);
  return sum;
}

// ---- integer helpers (exact) ----

int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

/// 32 int8 x int8 products as 8 int32 partial sums. Widened to int16 first: the usual
/// sign-flip trick for maddubs gets -128 x -128 wrong, and weights are whatever the file holds.
__m256i dot32_i8(const int8_t* a, const int8_t* b) {
  const auto half = [](const int8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  return _mm256_add_epi32(_mm256_madd_epi16(half(a), half(b)), _mm256_madd_epi16(half(a + 16), half(b + 16)));
}

/// 32 products of unsigned quants q (each < 64) with int8 x, less `offset` x each, as 16 int16
/// pair sums: every pair stays within +-2 * 64 * 128, so maddubs never saturates.
__m256i pairs_u_i8(__m256i q, __m256i x, int8_t offset) {
  const __m256i p = _mm256_maddubs_epi16(q, x);
  return offset == 0 ? p : _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8(offset), x));
}

// ---- block dot products ----

/// Four blocks' int32 sums from their 8-lane partial sums.
__m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/// A Q8_0 block's 32 products as 8 int32 partial sums.
__m256i partial_q8_0(const blocks::q8_0& w, const blocks::q8_0& x) { return dot32_i8(w.qs, x.qs); }

/// A Q4_0 block's: nibbles 0..15 in element order, less 8 x each activation.
__m256i partial_q4_0(const blocks::q4_0& w, const blocks::q8_0& x) {
  const __m128i m4 = _mm_set1_epi8(0xF);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
  return _mm256_madd_epi16(pairs_u_i8(q, load32(x.qs), 8), _mm256_set1_epi16(1));
}

template <class Block>
float scale_product(const Block& w, const blocks::q8_0& x) {
  return blocks::f16_to_f32(w.d) * blocks::f16_to_f32(x.d);
}

/// Q8_0 and Q4_0: four blocks' products float(isum) * (dw * dx) at once (each rounded as the
/// reference rounds it), then added to the sum one by one, in block order.
template <class Block, __m256i (*partial)(const Block&, const blocks::q8_0&)>
float dot_q8_0_family(const Block* w, const blocks::q8_0* x, int32_t nb) {
  float sum = 0.0f;
  int32_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const __m128i isum = hsum4(partial(w[i], x[i]), partial(w[i + 1], x[i + 1]), partial(w[i + 2], x[i + 2]),
                               partial(w[i + 3], x[i + 3]));
    const __m128 scale = _mm_setr_ps(scale_product(w[i], x[i]), scale_product(w[i + 1], x[i + 1]),
                                     scale_product(w[i + 2], x[i + 2]), scale_product(w[i + 3], x[i + 3]));
    float products[4];
    _mm_storeu_ps(products, _mm_mul_ps(_mm_cvtepi32_ps(isum), scale));
    for (float p : products) sum += p;
  }
  for (; i < nb; i++) sum += static_cast<float>(hsum(partial(w[i], x[i]))) * scale_product(w[i], x[i]);
  return sum;
}

/// msum of quants.hpp: each sub-block's min times its 32 activations' sum.
template <class Block>
int32_t min_sum(const Block& w, const blocks::q8_k& x) {
  int32_t msum = 0;
  for (int32_t j = 0; j < 8; j++) msum += blocks::scale_min_k4(w.scales, j).min * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
  return msum;
}

/// Q4_K's isum; with `qh` (Q5_K) each quant gains its fifth bit.
template <class Block>
int32_t scaled_sum_k(const Block& w, const blocks::q8_k& x, const uint8_t* qh) {
  const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  __m256i high = qh != nullptr ? load32(qh) : _mm256_setzero_si256();
  __m256i acc = _mm256_setzero_si256();
  for (int32_t c = 0; c < 4; c++) {
    const __m256i raw = load32(w.qs + 32 * c);
    __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    // Bits 2c and 2c + 1 of qh, worth 16: bytes shift within 16-bit lanes, masked to bit 0.
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(high, one), 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 1), one), 4));
    high = _mm256_srli_epi16(high, 2);
    const blocks::scale_min s0 = blocks::scale_min_k4(w.scales, 2 * c), s1 = blocks::scale_min_k4(w.scales, 2 * c + 1);
    const __m256i p_lo = pairs_u_i8(lo, load32(x.qs + 64 * c), 0), p_hi = pairs_u_i8(hi, load32(x.qs + 64 * c + 32), 0);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p_lo, _mm256_set1_epi16(s0.scale)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p_hi, _mm256_set1_epi16(s1.scale)));
  }
  return hsum(acc);
}

const uint8_t* fifth_bits(const blocks::q4_k&) { return nullptr; }
const uint8_t* fifth_bits(const blocks::q5_k& b) { return b.qh; }

template <class Block>
float dot_k_mins(const Block* w, const blocks::q8_k* x, int32_t nb) {
  float sum = 0.0f;
  for (int32_t i = 0; i < nb; i++) {
    const int32_t isum = scaled_sum_k(w[i], x[i], fifth_bits(w[i]));
    const int32_t msum = min_sum(w[i], x[i]);
    const float dw = blocks::f16_to_f32(w[i].d), dmin = blocks::f16_to_f32(w[i].dmin);
    sum += (x[i].d * dw) * static_cast<float>(isum) - (x[i].d * dmin) * static_cast<float>(msum);
  }
  return sum;
}

/// Q6_K's isum: per half, four registers of 32 quants (blocks::q6_k's layout), each two
/// sub-blocks of 16 whose int16 pair sums take their own scale.
int32_t scaled_sum_q6_k(const blocks::q6_k& w, const blocks::q8_k& x) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
  __m256i acc = _mm256_setzero_si256();
  for (int32_t h = 0; h < 2; h++) {
    const __m256i ql0 = load32(w.ql + 64 * h), ql1 = load32(w.ql + 64 * h + 32), qh = load32(w.qh + 32 * h);
    const __m256i low[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
    for (int32_t k = 0; k < 4; k++) {
      const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), m2);
      const __m256i q = _mm256_or_si256(low[k], _mm256_slli_epi16(top, 4));
      const int32_t j = 8 * h + 2 * k;  // the first of its two sub-blocks
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(w.scales[j + 1]), _mm_set1_epi16(w.scales[j]));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs_u_i8(q, load32(x.qs + 128 * h + 32 * k), 32), scale));
    }
  }
  return hsum(acc);
}

float dot_q6_k(const blocks::q6_k* w, const blocks::q8_k* x, int32_t nb) {
  float sum = 0.0f;
  for (int32_t i = 0; i < nb; i++)
    sum += (x[i].d * blocks::f16_to_f32(w[i].d)) * static_cast<float>(scaled_sum_q6_k(w[i], x[i]));
  return sum;
}

template <class Block>
const Block* as(const uint8_t* p) {
  return reinterpret_cast<const Block*>(p);
}
#endif  // TROUPE_QUANTS_AVX2

/// A product this large (multiply-adds) is split over the pool; below it, waking the workers
/// costs more than they save.
constexpr int64_t parallel_work_min = int64_t{1} << 18;

/// Outputs [begin, end) of every row: each weight row is read once for all activation rows.
void matmul_outputs(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, int64_t begin, int64_t end) {
  const int64_t x_row_bytes = row_bytes(dot_type(w.type), w.n);
  for (int64_t i = begin; i < end; i++) {
    const uint8_t* wi = w.row(i);
    for (int32_t r = 0; r < rows; r++)
      out[r * static_cast<int64_t>(w.d) + i] = vec_dot(wi, xq + r * x_row_bytes, w.type, w.n);
  }
}

}  // namespace

float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n) {
#ifdef TROUPE_QUANTS_AVX2
  TROUPE_KERNEL_ASSERT(is_weight_type(static_cast<uint32_t>(t)));
  const int32_t nb = n / block_elements(t);
  TROUPE_KERNEL_ASSERT(nb * block_elements(t) == n);
  switch (t) {
    case weight_type::f32: return dot_float<load8_f32, load1_f32>(w, x, n);
    case weight_type::f16: return dot_float<load8_f16, load1_16<blocks::f16_to_f32>>(w, x, n);
    case weight_type::bf16: return dot_float<load8_bf16, load1_16<blocks::bf16_to_f32>>(w, x, n);
    case weight_type::q8_0:
      return dot_q8_0_family<blocks::q8_0, partial_q8_0>(as<blocks::q8_0>(w), as<blocks::q8_0>(x), nb);
    case weight_type::q4_0:
      return dot_q8_0_family<blocks::q4_0, partial_q4_0>(as<blocks::q4_0>(w), as<blocks::q8_0>(x), nb);
    case weight_type::q4_k: return dot_k_mins(as<blocks::q4_k>(w), as<blocks::q8_k>(x), nb);
    case weight_type::q5_k: return dot_k_mins(as<blocks::q5_k>(w), as<blocks::q8_k>(x), nb);
    case weight_type::q6_k: return dot_q6_k(as<blocks::q6_k>(w), as<blocks::q8_k>(x), nb);
    case weight_type::q8_k: break;
  }
#endif
  return reference::vec_dot(w, x, t, n);
}

void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool) {
  TROUPE_KERNEL_ASSERT(rows >= 0);
  const int64_t work = static_cast<int64_t>(w.d) * w.n * rows;
  if (pool == nullptr || pool->num_threads() == 1 || work < parallel_work_min) {
    matmul_outputs(out, xq, w, rows, 0, w.d);
    return;
  }
  pool->parallel_for(w.d, [&](int32_t, int64_t begin, int64_t end) { matmul_outputs(out, xq, w, rows, begin, end); });
}

}  // namespace troupe::kernels::cpu::fast
