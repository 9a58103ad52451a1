// Fast dot products over ggml's block formats: quants.cpp's reference with AVX2. Inside a block
// every product is summed as an exact int32, so the lanes may add in any order; the float steps
// between blocks are the reference's, one at a time, in its order (quants.hpp), so the bits are
// the reference's. Built without AVX2 (+FMA, F16C), fast:: is the reference.
#include <algorithm>
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

/// Asks for the cache lines `ahead` bytes past a block of `bytes` bytes: a weight row streams
/// from memory, and the rows of a matrix follow each other, so the next blocks are known.
template <int32_t bytes, int32_t ahead = 2048>
void prefetch_after(const void* block) {
  const char* p = static_cast<const char*>(block) + ahead;
  for (int32_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

/// Up to this many activation rows share each weight load: a block's weights are loaded and
/// unpacked once for all of them (prefill, batched decode). Each row's sums are its own, in
/// vec_dot's order, so a row's result is the same bits whatever rows it is computed with.
/// (Interleaving several weight rows for one activation row, to overlap their float chains, was
/// measured slower: decode streams the weights from memory, and two streams at once defeat the
/// prefetching.)
constexpr int32_t max_rows = 4;

/// Lanes 0-31 are the reference's acc[0..32) in four registers of 8, so the tree's first level
/// (acc[i] + acc[i + 8]) + (acc[i + 16] + acc[i + 24]) is (a0 + a1) + (a2 + a3), lane for lane.
template <int R, int32_t element_bytes, __m256 (*load8)(const uint8_t*, int64_t),
          float (*load1)(const uint8_t*, int64_t)>
void dot_float(const uint8_t* w, const uint8_t* const* x, int32_t n, float* out) {
  __m256 a[R][4];
  for (int r = 0; r < R; r++)
    for (__m256& v : a[r]) v = _mm256_setzero_ps();
  const int32_t body = n - n % 32;
  for (int64_t j = 0; j < body; j += 32) {
    prefetch_after<32 * element_bytes>(w + j * element_bytes);
    for (int k = 0; k < 4; k++) {
      const __m256 wk = load8(w, j + 8 * k);
      for (int r = 0; r < R; r++) a[r][k] = _mm256_fmadd_ps(wk, load8(x[r], j + 8 * k), a[r][k]);
    }
  }
  for (int r = 0; r < R; r++) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3]));
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // s[i] + s[i + 4]
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                  // t[i] + t[i + 2]
    float sum = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));                           // u[0] + u[1]
    for (int64_t j = body; j < n; j++) sum = std::fmaf(load1(w, j), load1(x[r], j), sum);
    out[r] = sum;
  }
}

// ---- integer helpers (exact) ----

int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

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

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/// A Q8_0 block's weights and 128 x their sums by 4, once for every row: partial() gives a row's
/// 32 products as 8 int32 partial sums with VNNI's u8 x s8 dot product, taking the activations
/// as x + 128 (unsigned) and 128 x the weights' sum back: exact integers, the same block sum.
struct q8_0_weights {
  __m256i w, w_sum_128;
  explicit q8_0_weights(const blocks::q8_0& b)
      : w(load32(b.qs)),
        w_sum_128(_mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), w), 7)) {}
  [[nodiscard]] __m256i partial(const blocks::q8_0& x) const {
    const __m256i x_plus_128 = _mm256_xor_si256(load32(x.qs), _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), x_plus_128, w), w_sum_128);
  }
};
#else
/// A Q8_0 block's weights widened to int16, once for every row: partial() gives a row's 32
/// products as 8 int32 partial sums.
struct q8_0_weights {
  __m256i lo, hi;
  explicit q8_0_weights(const blocks::q8_0& w) : lo(widen(w.qs)), hi(widen(w.qs + 16)) {}
  static __m256i widen(const int8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  /// Widened to int16 first: the usual sign-flip trick for maddubs gets -128 x -128 wrong, and
  /// weights are whatever the file holds.
  [[nodiscard]] __m256i partial(const blocks::q8_0& x) const {
    return _mm256_add_epi32(_mm256_madd_epi16(lo, widen(x.qs)), _mm256_madd_epi16(hi, widen(x.qs + 16)));
  }
};
#endif

/// A Q4_0 block's nibbles 0..15 in element order; a row's partial sums take 8 x each activation off.
struct q4_0_weights {
  __m256i q;
  explicit q4_0_weights(const blocks::q4_0& w) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
    q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
  }
  [[nodiscard]] __m256i partial(const blocks::q8_0& x) const {
    return _mm256_madd_epi16(pairs_u_i8(q, load32(x.qs), 8), _mm256_set1_epi16(1));
  }
};

/// The scales of blocks x[0..4) as floats (exact), lane b for block b.
__m128 block_scales(const blocks::q8_0* x) {
  __m128i d = _mm_setzero_si128();
  d = _mm_insert_epi16(d, x[0].d, 0);
  d = _mm_insert_epi16(d, x[1].d, 1);
  d = _mm_insert_epi16(d, x[2].d, 2);
  d = _mm_insert_epi16(d, x[3].d, 3);
  return _mm_cvtph_ps(d);
}

/// Q8_0 and Q4_0, per row: four blocks' int32 sums at once, their products float(isum) * (dw *
/// dx) in one register (lane b: block i + b) added to the row's four lanes — quants.hpp's order,
/// each step rounded as the reference rounds it.
template <int R, class Block, class Weights>
void dot_q8_0_family(const Block* w, const blocks::q8_0* const* x, int32_t nb, float* out) {
  __m128 lanes[R];
  for (__m128& l : lanes) l = _mm_setzero_ps();
  const int32_t body = nb - nb % 4;
  for (int32_t i = 0; i < body; i += 4) {
    prefetch_after<4 * sizeof(Block)>(w + i);
    __m256i p[R][4];
    alignas(16) float dw[4];
    for (int b = 0; b < 4; b++) {
      const Weights wb(w[i + b]);
      dw[b] = blocks::f16_to_f32(w[i + b].d);
      for (int r = 0; r < R; r++) p[r][b] = wb.partial(x[r][i + b]);
    }
    const __m128 dws = _mm_load_ps(dw);
    for (int r = 0; r < R; r++) {
      const __m128 scale = _mm_mul_ps(dws, block_scales(x[r] + i));
      const __m128 products = _mm_mul_ps(_mm_cvtepi32_ps(hsum4(p[r][0], p[r][1], p[r][2], p[r][3])), scale);
      lanes[r] = _mm_add_ps(lanes[r], products);
    }
  }
  for (int r = 0; r < R; r++) {
    // (lane 0 + lane 1) + (lane 2 + lane 3)
    const __m128 pairs = _mm_add_ps(lanes[r], _mm_shuffle_ps(lanes[r], lanes[r], _MM_SHUFFLE(2, 3, 0, 1)));
    out[r] = _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)));
  }
  for (int32_t i = body; i < nb; i++) {  // the last blocks, each unpacked once for every row
    const Weights wb(w[i]);
    const float dw = blocks::f16_to_f32(w[i].d);
    for (int r = 0; r < R; r++)
      out[r] += static_cast<float>(hsum(wb.partial(x[r][i]))) * (dw * blocks::f16_to_f32(x[r][i].d));
  }
}

const uint8_t* fifth_bits(const blocks::q4_k&) { return nullptr; }
const uint8_t* fifth_bits(const blocks::q5_k& b) { return b.qh; }

int32_t hsum(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
  return _mm_cvtsi128_si32(v);
}

/// Int16 element `lo` of the low 128-bit lane broadcast over that lane, and element `hi` of the
/// high lane over that one: a sub-block's scale from a register of scales.
__m256i pick16(__m256i v, int lo, int hi) {
  const auto mask = [](int k) { return _mm_set1_epi16(static_cast<int16_t>(((2 * k + 1) << 8) | (2 * k))); };
  return _mm256_shuffle_epi8(v, _mm256_set_m128i(mask(hi), mask(lo)));
}

/// A Q4_K or Q5_K block's 6-bit scales (bytes 0-7) and mins (bytes 8-15), unpacked from its 12
/// bytes a word at a time (the layout of blocks::scale_min_k4): with A, B, C the three little-endian
/// words, scales 0-3 = A & 63 per byte, mins 0-3 = B & 63, scales 4-7 = C's low nibbles with A's
/// top two bits above them, mins 4-7 = C's high nibbles with B's top two bits.
__m128i scales_mins_k4(const uint8_t* packed) {
  uint32_t a, b, c;
  std::memcpy(&a, packed, 4);
  std::memcpy(&b, packed + 4, 4);
  std::memcpy(&c, packed + 8, 4);
  constexpr uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, top2 = 0x03030303;
  return _mm_setr_epi32(static_cast<int32_t>(a & low6), static_cast<int32_t>((c & low4) | (((a >> 6) & top2) << 4)),
                        static_cast<int32_t>(b & low6),
                        static_cast<int32_t>(((c >> 4) & low4) | (((b >> 6) & top2) << 4)));
}

/// Q4_K and Q5_K (with its fifth bits): each 32-quant chunk unpacked once for every row; per
/// row, isum = sum of scale_j * (its chunk's products) and msum = sum of min_j * (the chunk's
/// activation sum: bsums[2j] + bsums[2j + 1]).
template <int R, class Block>
void dot_k_mins(const Block* w, const blocks::q8_k* const* x, int32_t nb, float* out) {
  const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  float sum[R] = {};
  for (int32_t i = 0; i < nb; i++) {
    const Block& b = w[i];
    prefetch_after<sizeof(Block)>(&b);
    const __m128i packed = scales_mins_k4(b.scales);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed));  // int16, both lanes
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
    const uint8_t* qh = fifth_bits(b);
    __m256i high = qh != nullptr ? load32(qh) : _mm256_setzero_si256();
    __m256i acc[R];
    for (__m256i& a : acc) a = _mm256_setzero_si256();
    for (int32_t c = 0; c < 4; c++) {
      const __m256i raw = load32(b.qs + 32 * c);
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      // Bits 2c and 2c + 1 of qh, worth 16: bytes shift within 16-bit lanes, masked to bit 0.
      lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(high, one), 4));
      hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 1), one), 4));
      high = _mm256_srli_epi16(high, 2);
      const __m256i s0 = pick16(scales, 2 * c, 2 * c), s1 = pick16(scales, 2 * c + 1, 2 * c + 1);
      for (int r = 0; r < R; r++) {
        const int8_t* xq = x[r][i].qs + 64 * c;
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs_u_i8(lo, load32(xq), 0), s0));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs_u_i8(hi, load32(xq + 32), 0), s1));
      }
    }
    const float dw = blocks::f16_to_f32(b.d), dmin = blocks::f16_to_f32(b.dmin);
    for (int r = 0; r < R; r++) {
      const blocks::q8_k& xr = x[r][i];
      const __m256i bsums = load32(xr.bsums);
      const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
      const int32_t msum = hsum(_mm_madd_epi16(mins, pairs));
      sum[r] += (xr.d * dw) * static_cast<float>(hsum(acc[r])) - (xr.d * dmin) * static_cast<float>(msum);
    }
  }
  for (int r = 0; r < R; r++) out[r] = sum[r];
}

/// Q6_K: per half, four registers of 32 quants (blocks::q6_k's layout), each two sub-blocks of
/// 16 whose int16 pair sums take their own scale, unpacked once for every row. The quants' offset
/// of 32 is taken off whole: isum = sum of scale_j * (q . x) - 32 * sum of scale_j * bsums[j]
/// (the same exact integer as subtracting it per quant).
template <int R>
void dot_q6_k(const blocks::q6_k* w, const blocks::q8_k* const* x, int32_t nb, float* out) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
  float sum[R] = {};
  for (int32_t i = 0; i < nb; i++) {
    const blocks::q6_k& b = w[i];
    prefetch_after<sizeof(blocks::q6_k)>(&b);
    const __m128i raw_scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m256i scales = _mm256_cvtepi8_epi16(raw_scales);  // int16: 0-7 in the low lane, 8-15 in the high
    __m256i acc[R];
    for (int r = 0; r < R; r++)  // -32 * sum of scale_j * bsums[j]
      acc[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(scales, load32(x[r][i].bsums)), 5));
    for (int32_t h = 0; h < 2; h++) {
      const __m256i ql0 = load32(b.ql + 64 * h), ql1 = load32(b.ql + 64 * h + 32), qh = load32(b.qh + 32 * h);
      const __m256i low[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      // This half's 8 scales in both lanes.
      const __m256i half = h == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00)
                                  : _mm256_permute2x128_si256(scales, scales, 0x11);
      for (int32_t k = 0; k < 4; k++) {
        const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), m2);
        const __m256i q = _mm256_or_si256(low[k], _mm256_slli_epi16(top, 4));
        const __m256i scale = pick16(half, 2 * k, 2 * k + 1);  // sub-blocks 8h + 2k and 8h + 2k + 1
        for (int r = 0; r < R; r++) {
          const __m256i p = pairs_u_i8(q, load32(x[r][i].qs + 128 * h + 32 * k), 0);
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, scale));
        }
      }
    }
    const float dw = blocks::f16_to_f32(b.d);
    for (int r = 0; r < R; r++) sum[r] += (x[r][i].d * dw) * static_cast<float>(hsum(acc[r]));
  }
  for (int r = 0; r < R; r++) out[r] = sum[r];
}

template <class Block>
const Block* as(const uint8_t* p) {
  return reinterpret_cast<const Block*>(p);
}

/// Pointers to activation rows as arrays of their block type.
template <class Block, int R>
struct as_rows {
  const Block* p[R];
  explicit as_rows(const uint8_t* const* x) {
    for (int r = 0; r < R; r++) p[r] = as<Block>(x[r]);
  }
};

/// R rows' dot products with one weight row: out[r] = vec_dot(w, x[r], t, n), the same bits.
template <int R>
void dot_rows(const uint8_t* w, const uint8_t* const* x, weight_type t, int32_t n, float* out) {
  TROUPE_KERNEL_ASSERT(is_weight_type(static_cast<uint32_t>(t)));
  const int32_t nb = n / block_elements(t);
  TROUPE_KERNEL_ASSERT(nb * block_elements(t) == n);
  switch (t) {
    case weight_type::f32: return dot_float<R, 4, load8_f32, load1_f32>(w, x, n, out);
    case weight_type::f16: return dot_float<R, 2, load8_f16, load1_16<blocks::f16_to_f32>>(w, x, n, out);
    case weight_type::bf16: return dot_float<R, 2, load8_bf16, load1_16<blocks::bf16_to_f32>>(w, x, n, out);
    case weight_type::q8_0:
      return dot_q8_0_family<R, blocks::q8_0, q8_0_weights>(as<blocks::q8_0>(w), as_rows<blocks::q8_0, R>(x).p, nb, out);
    case weight_type::q4_0:
      return dot_q8_0_family<R, blocks::q4_0, q4_0_weights>(as<blocks::q4_0>(w), as_rows<blocks::q8_0, R>(x).p, nb, out);
    case weight_type::q4_k: return dot_k_mins<R>(as<blocks::q4_k>(w), as_rows<blocks::q8_k, R>(x).p, nb, out);
    case weight_type::q5_k: return dot_k_mins<R>(as<blocks::q5_k>(w), as_rows<blocks::q8_k, R>(x).p, nb, out);
    case weight_type::q6_k: return dot_q6_k<R>(as<blocks::q6_k>(w), as_rows<blocks::q8_k, R>(x).p, nb, out);
    case weight_type::q8_k: break;
  }
  TROUPE_KERNEL_ASSERT(false);
}
#endif  // TROUPE_QUANTS_AVX2

/// A product this large (multiply-adds) is split over the pool; below it, waking the workers
/// costs more than they save.
constexpr int64_t parallel_work_min = int64_t{1} << 18;

/// Outputs [begin, end) of every row: each weight row is read once for all activation rows,
/// and each of its blocks unpacked once for up to max_rows of them.
void matmul_outputs(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, int64_t begin, int64_t end) {
  const int64_t x_row_bytes = row_bytes(dot_type(w.type), w.n);
  for (int64_t i = begin; i < end; i++) {
    const uint8_t* wi = w.row(i);
#ifdef TROUPE_QUANTS_AVX2
    for (int32_t r = 0; r < rows; r += max_rows) {
      const uint8_t* x[max_rows];
      float sums[max_rows];
      const int32_t num = std::min(max_rows, rows - r);
      for (int32_t k = 0; k < num; k++) x[k] = xq + (r + k) * x_row_bytes;
      switch (num) {
        case 4: dot_rows<4>(wi, x, w.type, w.n, sums); break;
        case 3: dot_rows<3>(wi, x, w.type, w.n, sums); break;
        case 2: dot_rows<2>(wi, x, w.type, w.n, sums); break;
        default: dot_rows<1>(wi, x, w.type, w.n, sums); break;
      }
      for (int32_t k = 0; k < num; k++) out[(r + k) * static_cast<int64_t>(w.d) + i] = sums[k];
    }
#else
    for (int32_t r = 0; r < rows; r++)
      out[r * static_cast<int64_t>(w.d) + i] = reference::vec_dot(wi, xq + r * x_row_bytes, w.type, w.n);
#endif
  }
}

}  // namespace

float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n) {
#ifdef TROUPE_QUANTS_AVX2
  float out = 0.0f;
  dot_rows<1>(w, &x, t, n, &out);
  return out;
#else
  return reference::vec_dot(w, x, t, n);
#endif
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
