// Fast dot products over ggml's block formats: quants.cpp's reference with AVX2 and AVX-512.
// Inside a block every product is summed as an exact int32, so the lanes may add in any order;
// the float steps between blocks are the reference's, one at a time, in its order (quants.hpp),
// so the bits are the reference's. Included once per instruction set (quants_avx2.cpp,
// quants_avx512.cpp: TROUPE_QUANTS_ISA names the namespace; kernels/CMakeLists.txt gives each its
// -march), chosen at run time by quants_dispatch.cpp. Built without AVX2 (+FMA, F16C), it is the
// reference.
#ifndef TROUPE_QUANTS_ISA
#error "quants_fast.inl is included by quants_avx2.cpp and quants_avx512.cpp, which name the ISA"
#endif
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TROUPE_QUANTS_AVX2 1
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its -Wmaybe-uninitialized
// reports wherever they are inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/quant_blocks.hpp"
#include "kernels/cpu/quants.hpp"

namespace troupe::kernels::cpu::fast::TROUPE_QUANTS_ISA {
namespace {

struct x_blocks;
struct one_row_x;

/// What a matmul lays out once for all its weight rows, where a kernel takes it so (Q8_0 and
/// Q4_0 with VNNI); null otherwise.
struct prepared_x {
  const x_blocks* many = nullptr;      ///< two rows or more: every row's
  const one_row_x* one_row = nullptr;  ///< one row
};

#ifdef TROUPE_QUANTS_AVX2
using blocks::qk;
using blocks::qk_k;

// ---- F32, F16, BF16: a register of elements as float ----
// The reference's 32 lanes acc[0..32) are four registers of 8 (AVX2) or two of 16 (AVX-512):
// each lane takes the same fmas in the same order either way, so both give the same bits.

#ifdef __AVX512F__
using fvec = __m512;
constexpr int32_t fvec_lanes = 16;
fvec fzero() { return _mm512_setzero_ps(); }
fvec ffma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
fvec load_f32(const uint8_t* p, int64_t j) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + j); }
fvec load_f16(const uint8_t* p, int64_t j) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * j)));
}
fvec load_bf16(const uint8_t* p, int64_t j) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * j)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
__m256 halves(fvec v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
/// (acc[i] + acc[i + 8]) + (acc[i + 16] + acc[i + 24]), lane i of 8.
__m256 first_level(const fvec* a) { return _mm256_add_ps(halves(a[0]), halves(a[1])); }
#else
using fvec = __m256;
constexpr int32_t fvec_lanes = 8;
fvec fzero() { return _mm256_setzero_ps(); }
fvec ffma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
fvec load_f32(const uint8_t* p, int64_t j) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + j); }
fvec load_f16(const uint8_t* p, int64_t j) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j)));
}
fvec load_bf16(const uint8_t* p, int64_t j) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
__m256 first_level(const fvec* a) { return _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])); }
#endif
constexpr int32_t fvecs = 32 / fvec_lanes;  // registers per 32 lanes

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
/// from memory, and the rows of a matrix follow each other, so the next blocks are known. 8 KiB
/// ahead: one-thread decode measured 8-14% faster than 2 KiB on Q8_0, Q4_K_M, F16 and Q6_K (1 KiB
/// slower, 16 KiB no better); prefill unchanged.
template <int32_t bytes, int32_t ahead = 8192>
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

/// NW weight rows' dot products with R activation rows, out[k * R + r] = vec_dot(w[k], x[r]):
/// each register of weights is loaded once for the R rows and each of activations once for the
/// NW weight rows; every (k, r) pair keeps its own 32 lanes.
template <int NW, int R, int32_t element_bytes, fvec (*load)(const uint8_t*, int64_t),
          float (*load1)(const uint8_t*, int64_t)>
void dot_float(const uint8_t* const* w, const uint8_t* const* x, int32_t n, float* out) {
  fvec a[NW][R][fvecs];
  for (int k = 0; k < NW; k++)
    for (int r = 0; r < R; r++)
      for (fvec& v : a[k][r]) v = fzero();
  const int32_t body = n - n % 32;
  for (int64_t j = 0; j < body; j += 32) {
    for (int k = 0; k < NW; k++) prefetch_after<32 * element_bytes>(w[k] + j * element_bytes);
    for (int l = 0; l < fvecs; l++) {
      fvec wl[NW];
      for (int k = 0; k < NW; k++) wl[k] = load(w[k], j + fvec_lanes * l);
      for (int r = 0; r < R; r++) {
        const fvec xl = load(x[r], j + fvec_lanes * l);
        for (int k = 0; k < NW; k++) a[k][r][l] = ffma(wl[k], xl, a[k][r][l]);
      }
    }
  }
  for (int k = 0; k < NW; k++)
    for (int r = 0; r < R; r++) {
      const __m256 s = first_level(a[k][r]);
      const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // s[i] + s[i + 4]
      const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                  // t[i] + t[i + 2]
      float sum = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));                           // u[0] + u[1]
      for (int64_t j = body; j < n; j++) sum = std::fmaf(load1(w[k], j), load1(x[r], j), sum);
      out[k * R + r] = sum;
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

/// 32 products of unsigned quants q (each < 64) with int8 x as 16 int16 pair sums: every pair
/// stays within +-2 * 64 * 128, so maddubs never saturates.
__m256i pairs_u_i8(__m256i q, __m256i x) { return _mm256_maddubs_epi16(q, x); }

// ---- block dot products ----

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


/// Four blocks' int32 sums from their 8-lane partial sums.
__m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Each weight type below gives: of(block), its weights ready for every row; prepare(x block), an
// activation block ready for every weight row; partial(act), the block's products as 8 int32
// partial sums; and what those sums exceed the exact block sum by, from the weights
// (w_excess) or from the activations (x_excess), where has_w_excess / has_x_excess say so. All exact.

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/// Q8_0 with VNNI's u8 x s8 dot product: the activations go in as x + 128 (unsigned), so the
/// sums exceed the exact ones by 128 x the weights' sum.
struct q8_0_weights {
  struct act {
    __m256i u;
  };
  static constexpr bool has_w_excess = true, has_x_excess = false;
  __m256i w;
  static q8_0_weights of(const blocks::q8_0& b) { return {load32(b.qs)}; }
  static act prepare(const blocks::q8_0& x) {
    return {_mm256_xor_si256(load32(x.qs), _mm256_set1_epi8(static_cast<char>(0x80)))};
  }
  [[nodiscard]] __m256i partial(const act& x) const { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x.u, w); }
  [[nodiscard]] __m256i w_excess() const {
    return _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), w), 7);
  }
};
#else
/// Q8_0 widened to int16 (the usual sign-flip trick for maddubs gets -128 x -128 wrong, and
/// weights are whatever the file holds).
struct q8_0_weights {
  struct act {
    __m256i lo, hi;
  };
  static constexpr bool has_w_excess = false, has_x_excess = false;
  __m256i lo, hi;
  static __m256i widen(const int8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static q8_0_weights of(const blocks::q8_0& b) { return {widen(b.qs), widen(b.qs + 16)}; }
  static act prepare(const blocks::q8_0& x) { return {widen(x.qs), widen(x.qs + 16)}; }
  [[nodiscard]] __m256i partial(const act& x) const {
    return _mm256_add_epi32(_mm256_madd_epi16(lo, x.lo), _mm256_madd_epi16(hi, x.hi));
  }
};
#endif

/// Q4_0: nibbles 0..15 in element order, without their offset of 8, which the sums exceed the
/// exact ones by 8 x the activations' sum.
struct q4_0_weights {
  struct act {
    __m256i x;
  };
  static constexpr bool has_w_excess = false, has_x_excess = true;
  __m256i q;
  static q4_0_weights of(const blocks::q4_0& b) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    return {_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4))};
  }
  static act prepare(const blocks::q8_0& x) { return {load32(x.qs)}; }
  [[nodiscard]] __m256i partial(const act& x) const {
    return _mm256_madd_epi16(pairs_u_i8(q, x.x), _mm256_set1_epi16(1));
  }
  static __m256i x_excess(const act& x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), x.x), _mm256_set1_epi16(1));
  }
};

/// The scales of blocks x[0..4) (Q8_0 or Q4_0) as floats (exact), lane b for block b, built in
/// registers (no store-forwarding stall).
template <class Block>
__m128 block_scales(const Block* x) {
  __m128i d = _mm_setzero_si128();
  d = _mm_insert_epi16(d, x[0].d, 0);
  d = _mm_insert_epi16(d, x[1].d, 1);
  d = _mm_insert_epi16(d, x[2].d, 2);
  d = _mm_insert_epi16(d, x[3].d, 3);
  return _mm_cvtph_ps(d);
}

/// Blocks [body, nb) of every pair, in order, added to out[k * R + r]: each unpacked once for
/// every pair.
template <int NW, int R, class Block, class Weights>
void add_last_blocks(const Block* const* w, const blocks::q8_0* const* x, int32_t body, int32_t nb, float* out) {
  for (int32_t i = body; i < nb; i++) {
    Weights wb[NW];
    for (int k = 0; k < NW; k++) wb[k] = Weights::of(w[k][i]);
    for (int r = 0; r < R; r++) {
      const typename Weights::act a = Weights::prepare(x[r][i]);
      const float dx = blocks::f16_to_f32(x[r][i].d);
      for (int k = 0; k < NW; k++) {
        int32_t isum = hsum(wb[k].partial(a));
        if constexpr (Weights::has_w_excess) isum -= hsum(wb[k].w_excess());
        if constexpr (Weights::has_x_excess) isum -= hsum(Weights::x_excess(a));
        out[k * R + r] += static_cast<float>(isum) * (blocks::f16_to_f32(w[k][i].d) * dx);
      }
    }
  }
}

/// (lane 0 + lane 1) + (lane 2 + lane 3)
float sum_lanes(__m128 l) {
  const __m128 pairs = _mm_add_ps(l, _mm_shuffle_ps(l, l, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)));
}

/// Q8_0 and Q4_0, NW weight rows by R activation rows (out[k * R + r]): per pair, four blocks'
/// int32 sums at once, their products float(isum) * (dw * dx) in one register (lane b: block
/// i + b) added to the pair's four lanes — quants.hpp's order, each step rounded as the
/// reference rounds it. Weight blocks are unpacked once for the R rows, activation blocks once
/// for the NW weight rows.
template <int NW, int R, class Block, class Weights>
void dot_q8_0_family(const Block* const* w, const blocks::q8_0* const* x, int32_t nb, float* out) {
  using act = typename Weights::act;
  __m128 lanes[NW][R];
  for (auto& row : lanes)
    for (__m128& l : row) l = _mm_setzero_ps();
  const int32_t body = nb - nb % 4;
  for (int32_t i = 0; i < body; i += 4) {
    Weights wb[NW][4];
    __m128 dws[NW];
    __m128i w_excess[NW];
    for (int k = 0; k < NW; k++) {
      prefetch_after<4 * sizeof(Block)>(w[k] + i);
      for (int b = 0; b < 4; b++) wb[k][b] = Weights::of(w[k][i + b]);
      dws[k] = block_scales(w[k] + i);
      if constexpr (Weights::has_w_excess)
        w_excess[k] = hsum4(wb[k][0].w_excess(), wb[k][1].w_excess(), wb[k][2].w_excess(), wb[k][3].w_excess());
    }
    for (int r = 0; r < R; r++) {
      act a[4];
      for (int b = 0; b < 4; b++) a[b] = Weights::prepare(x[r][i + b]);
      const __m128 xs = block_scales(x[r] + i);
      __m128i x_excess = _mm_setzero_si128();
      if constexpr (Weights::has_x_excess)
        x_excess = hsum4(Weights::x_excess(a[0]), Weights::x_excess(a[1]), Weights::x_excess(a[2]),
                         Weights::x_excess(a[3]));
      for (int k = 0; k < NW; k++) {
        __m128i sums = hsum4(wb[k][0].partial(a[0]), wb[k][1].partial(a[1]), wb[k][2].partial(a[2]),
                             wb[k][3].partial(a[3]));
        if constexpr (Weights::has_w_excess) sums = _mm_sub_epi32(sums, w_excess[k]);
        if constexpr (Weights::has_x_excess) sums = _mm_sub_epi32(sums, x_excess);
        const __m128 products = _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(dws[k], xs));
        lanes[k][r] = _mm_add_ps(lanes[k][r], products);
      }
    }
  }
  for (int k = 0; k < NW; k++)
    for (int r = 0; r < R; r++) out[k * R + r] = sum_lanes(lanes[k][r]);
  add_last_blocks<NW, R, Block, Weights>(w, x, body, nb, out);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define TROUPE_VNNI_512 1
/// Two Q8_0 blocks' quants in one register, block a in the low half.
__m512i load_two(const int8_t* a, const int8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(a)), load32(b), 1);
}

__m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

/// Room for n elements in v, which only grows: the scratch of a product smaller than the one
/// before is not value-initialized again (a panel's re-zeroing showed in 16 streams' profile).
template <class T>
void grow_to(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

/// An activation row's blocks as the unsigned-weight kernels below take them: the weights go
/// into VNNI's u8 x s8 dot product unsigned (Q8_0's + 128, Q4_0's nibbles without their offset
/// of 8), so each block's sum exceeds the exact one by what only the activations decide: 128 x
/// the block's quant sum for Q8_0, 8 x it for Q4_0, taken here once for every weight row.
struct x_blocks {
  std::vector<int32_t> excess;  ///< row r's block b at r * nb + b
  std::vector<float> dx;        ///< the blocks' scales as float, likewise
};

/// `rows` rows of nb Q8_0 blocks each (x_row_bytes apart), for weights of type t (Q8_0 or Q4_0).
void prepare_x_blocks(x_blocks& out, const uint8_t* xq, int64_t x_row_bytes, int32_t rows, int32_t nb, weight_type t) {
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(nb);
  grow_to(out.excess, count);
  grow_to(out.dx, count);
  const int32_t offset = t == weight_type::q8_0 ? 128 : 8;
  for (int32_t r = 0; r < rows; r++) {
    const blocks::q8_0* x = as<blocks::q8_0>(xq + r * x_row_bytes);
    for (int32_t i = 0; i < nb; i++) {
      int32_t sum = 0;
      for (const int8_t q : x[i].qs) sum += q;
      const size_t at = static_cast<size_t>(r) * static_cast<size_t>(nb) + static_cast<size_t>(i);
      out.excess[at] = offset * sum;
      out.dx[at] = blocks::f16_to_f32(x[i].d);
    }
  }
}

// ---- Q8_0 and Q4_0 laid out sixteen rows at a time (quants.hpp's rows16) with VNNI ----

/// Per block of Block, the 64-byte registers of quants a rows16 group holds: Q8_0's eight
/// (unsigned), Q4_0's four (nibbles as stored).
template <class Block>
constexpr int32_t rows16_registers = sizeof(Block) == sizeof(blocks::q8_0) ? 8 : 4;

/// Output register g (of four) of a 4 x 4 transpose of dwords within each 128-bit lane: lane j
/// of r[m] holds row 4j + m's dwords 0..3, lane j of the result its dword g of rows 4j..4j+3.
void transpose_lanes(__m512i* r) {
  const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
  r[0] = _mm512_unpacklo_epi64(t0, t2);
  r[1] = _mm512_unpackhi_epi64(t0, t2);
  r[2] = _mm512_unpacklo_epi64(t1, t3);
  r[3] = _mm512_unpackhi_epi64(t1, t3);
}

/// Lane j: the 16 bytes at `p` + 4j + m's block (p: the sixteen rows' blocks).
template <class Block>
__m512i rows_lanes(const Block* const* p, int m, int offset) {
  const auto at = [&](int l) { return load16(reinterpret_cast<const uint8_t*>(p[l]) + offset); };
  __m512i v = _mm512_castsi128_si512(at(m));
  v = _mm512_inserti32x4(v, at(4 + m), 1);
  v = _mm512_inserti32x4(v, at(8 + m), 2);
  return _mm512_inserti32x4(v, at(12 + m), 3);
}

/// Sixteen rows' blocks p[0..16) as a rows16 group's registers, before the transpose: q[4h + m]
/// holds bytes 16h..16h+15 of rows m, 4 + m, 8 + m, 12 + m's quants (Q8_0's + 128).
void rows_quants(const blocks::q8_0* const* p, __m512i* q) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; h++)
    for (int m = 0; m < 4; m++)
      q[4 * h + m] = _mm512_xor_si512(rows_lanes(p, m, offsetof(blocks::q8_0, qs) + 16 * h), bias);
}
void rows_quants(const blocks::q4_0* const* p, __m512i* q) {
  for (int m = 0; m < 4; m++) q[m] = rows_lanes(p, m, offsetof(blocks::q4_0, qs));
}

/// Weight rows [first, first + 16 * groups) of w (Q8_0 or Q4_0, laid out as rows) into `out`
/// as rows16 groups (quants.hpp), group k at out + k * 16 * row_bytes.
template <class Block>
void repack_16_rows(uint8_t* out, const quant_matrix& w, int64_t first, int64_t groups) {
  constexpr int32_t regs = rows16_registers<Block>;
  const int32_t nb = w.n / qk;
  const int64_t w_row_bytes = row_bytes(w.type, w.n);
  const __m512i row_offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                 _mm512_set1_epi32(static_cast<int32_t>(w_row_bytes)));
  for (int64_t k = 0; k < groups; k++) {
    const Block* p[16];
    for (int l = 0; l < 16; l++) p[l] = as<Block>(w.row(first + 16 * k + l));
    uint8_t* q = out + k * 16 * w_row_bytes;
    uint8_t* d = q + int64_t{nb} * 64 * regs;
    // the group's rows are back to back: the next group's, prefetched a slice per block, arrive
    // while this one is laid out (sixteen rows read side by side defeat the hardware prefetcher)
    const uint8_t* next = w.row(first + 16 * (k + 1));
    for (int32_t b = 0; b < nb; b++, q += 64 * regs, d += 32) {
      prefetch_after<16 * sizeof(Block), 0>(next + 16 * sizeof(Block) * b);
      __m512i r[regs];
      rows_quants(p, r);
      for (int h = 0; h < regs; h += 4) transpose_lanes(r + h);
      for (int g = 0; g < regs; g++) _mm512_storeu_si512(q + 64 * g, r[g]);
      // each row's scale is the first 2 bytes of its block: 4 bytes read, the low 2 kept
      const __m512i d32 = _mm512_i32gather_epi32(row_offsets, p[0], 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm512_cvtepi32_epi16(d32));
      for (const Block*& row : p) row++;
    }
  }
}

/// Register g (0..7) of block b of a rows16 group's quants q: element l holds elements
/// 4g..4g+3 of row l's block, unsigned.
template <class Block>
__m512i rows16_quants(const uint8_t* q, int g) {
  if constexpr (rows16_registers<Block> == 8) {
    return _mm512_loadu_si512(q + 64 * g);
  } else {
    const __m512i raw = _mm512_loadu_si512(q + 64 * (g % 4));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    return g < 4 ? _mm512_and_si512(raw, m4) : _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
  }
}

/// A rows16 group (sixteen weight rows, nb blocks) by R activation rows: out[r][l] =
/// vec_dot(weight row l, x[r]), the same bits. Each block's sixteen exact sums come whole out of
/// eight dot products, started from -excess; their products float(isum) * (dw * dx) go, as
/// quants.hpp orders them, into four lane registers per row (block b into lane b mod 4) over
/// the first nb - nb mod 4 blocks, which then add as (0 + 1) + (2 + 3), and the last blocks in
/// order: the reference's steps for each of the sixteen outputs.
template <int R, class Block>
void dot_16_rows(const uint8_t* group, const blocks::q8_0* const* x, const int32_t* const* excess, const float* const* dx,
                 int32_t nb, float* const* out) {
  constexpr int32_t regs = rows16_registers<Block>;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(group + int64_t{nb} * 64 * regs);
  const auto products = [&](int32_t b, __m512 (&p)[R]) {
    const uint8_t* q = group + int64_t{b} * 64 * regs;
    prefetch_after<64 * regs>(q);
    prefetch_after<32>(scales + 16 * b);
    __m512i s[R];
    for (int r = 0; r < R; r++) s[r] = _mm512_set1_epi32(-excess[r][b]);
    for (int g = 0; g < 8; g++) {
      const __m512i wq = rows16_quants<Block>(q, g);
      for (int r = 0; r < R; r++) {
        int32_t four;
        std::memcpy(&four, x[r][b].qs + 4 * g, sizeof(four));
        s[r] = _mm512_dpbusd_epi32(s[r], wq, _mm512_set1_epi32(four));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 16 * b)));
    for (int r = 0; r < R; r++) p[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]), _mm512_mul_ps(dw, _mm512_set1_ps(dx[r][b])));
  };
  __m512 lanes[R][4];
  for (auto& row : lanes)
    for (__m512& l : row) l = _mm512_setzero_ps();
  const int32_t body = nb - nb % 4;
  for (int32_t i = 0; i < body; i += 4)
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
      __m512 p[R];
      products(i + c, p);
      for (int r = 0; r < R; r++) lanes[r][c] = _mm512_add_ps(lanes[r][c], p[r]);
    }
  __m512 sum[R];
  for (int r = 0; r < R; r++)
    sum[r] = _mm512_add_ps(_mm512_add_ps(lanes[r][0], lanes[r][1]), _mm512_add_ps(lanes[r][2], lanes[r][3]));
  for (int32_t b = body; b < nb; b++) {
    __m512 p[R];
    products(b, p);
    for (int r = 0; r < R; r++) sum[r] = _mm512_add_ps(sum[r], p[r]);
  }
  for (int r = 0; r < R; r++) _mm512_storeu_ps(out[r], sum[r]);
}
// ---- Q8_0 and Q4_0 decode (one activation row) with VNNI ----

/// A decode step's activation row laid out once for all the weight rows of a Q8_0 or Q4_0
/// matmul: its quants two blocks to a register, and its x_blocks.
struct one_row_x {
  struct pair {
    __m512i q;
  };
  std::vector<pair> q;  ///< blocks 2j, 2j + 1 in q[j]: for Q8_0 as stored, for Q4_0 by halves
                        ///< (a0-15 b0-15 a16-31 b16-31, the order a pair's nibbles unpack in)
  x_blocks blocks;
};

/// x: nb Q8_0 blocks, for weights of type t (Q8_0 or Q4_0).
void prepare_one_row(one_row_x& out, const blocks::q8_0* x, int32_t nb, weight_type t) {
  grow_to(out.q, static_cast<size_t>(nb / 2));
  prepare_x_blocks(out.blocks, reinterpret_cast<const uint8_t*>(x), 0, 1, nb, t);
  for (int32_t j = 0; j < nb / 2; j++) {
    const int8_t* a = x[2 * j].qs;
    const int8_t* b = x[2 * j + 1].qs;
    out.q[static_cast<size_t>(j)].q =
        t == weight_type::q8_0
            ? load_two(a, b)
            : _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(load16(b), load16(a))),
                                 _mm256_set_m128i(load16(b + 16), load16(a + 16)), 1);
  }
}

/// Two weight blocks as the dot product takes them (unsigned, in one_row_x's order), and the
/// fold_blocks immediates that bring a pair of such products' 128-bit lanes to block order.
struct q8_0_pair {
  static constexpr int fold_a = 0x88, fold_b = 0xDD;  // block a in lanes 0, 1
  static __m512i of(const blocks::q8_0* b) {
    return _mm512_xor_si512(load_two(b[0].qs, b[1].qs), _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};
struct q4_0_pair {
  static constexpr int fold_a = 0x44, fold_b = 0xEE;  // block a in lanes 0, 2
  static __m512i of(const blocks::q4_0* b) {
    const __m256i raw = _mm256_set_m128i(load16(b[1].qs), load16(b[0].qs));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
  }
};

/// Two pairs' products (blocks 0, 1 and 2, 3) folded to one 128-bit lane of 4 partial sums per
/// block, lane b for block b.
template <class Pair>
__m512i fold_pairs(__m512i p01, __m512i p23) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(p01, p23, Pair::fold_a), _mm512_shuffle_i32x4(p01, p23, Pair::fold_b));
}

/// Eight blocks' totals, element b for block b, from two fold_pairs results (blocks 0-3, 4-7).
__m256i block_totals(__m512i c0, __m512i c1) {
  const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi32(c0, c1), _mm512_unpackhi_epi32(c0, c1));
  const __m512i v = _mm512_add_epi32(u, _mm512_unpackhi_epi64(u, u));  // per lane: c0's total, c1's
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

/// One weight row against the prepared activation row (x: the row as stored, for the blocks
/// past the last whole four): the same sums and float steps as dot_q8_0_family<1, 1>, eight
/// blocks per step, two to each 512-bit dot product.
template <class Block, class Pair, class Weights>
float dot_one_row(const Block* w, const blocks::q8_0* x, const one_row_x& xp, int32_t nb) {
  const __m512i zero = _mm512_setzero_si512();
  __m128 lanes = _mm_setzero_ps();
  const int32_t body = nb - nb % 4;
  int32_t i = 0;
  for (; i + 8 <= body; i += 8) {
    prefetch_after<8 * sizeof(Block)>(w + i);
    const one_row_x::pair* xq = xp.q.data() + i / 2;
    const __m512i c0 = fold_pairs<Pair>(_mm512_dpbusd_epi32(zero, Pair::of(w + i), xq[0].q),
                                        _mm512_dpbusd_epi32(zero, Pair::of(w + i + 2), xq[1].q));
    const __m512i c1 = fold_pairs<Pair>(_mm512_dpbusd_epi32(zero, Pair::of(w + i + 4), xq[2].q),
                                        _mm512_dpbusd_epi32(zero, Pair::of(w + i + 6), xq[3].q));
    const __m256i sums = _mm256_sub_epi32(block_totals(c0, c1),
                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp.blocks.excess.data() + i)));
    const __m256 dw = _mm256_set_m128(block_scales(w + i + 4), block_scales(w + i));
    const __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, _mm256_loadu_ps(xp.blocks.dx.data() + i)));
    lanes = _mm_add_ps(lanes, _mm256_castps256_ps128(p));
    lanes = _mm_add_ps(lanes, _mm256_extractf128_ps(p, 1));
  }
  for (; i < body; i += 4) {
    const one_row_x::pair* xq = xp.q.data() + i / 2;
    const __m512i c = fold_pairs<Pair>(_mm512_dpbusd_epi32(zero, Pair::of(w + i), xq[0].q),
                                       _mm512_dpbusd_epi32(zero, Pair::of(w + i + 2), xq[1].q));
    const __m128i sums = _mm_sub_epi32(_mm256_castsi256_si128(block_totals(c, c)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(xp.blocks.excess.data() + i)));
    lanes = _mm_add_ps(lanes, _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(block_scales(w + i), _mm_loadu_ps(xp.blocks.dx.data() + i))));
  }
  float out = sum_lanes(lanes);
  const Block* wr[1] = {w};
  const blocks::q8_0* xr[1] = {x};
  add_last_blocks<1, 1, Block, Weights>(wr, xr, body, nb, &out);
  return out;
}
#endif

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
/// top two bits above them, mins 4-7 = C's high nibbles with B's top two bits. Loads 16 bytes:
/// the 12 and 4 of what follows them in the block (its quants or fifth bits).
__m128i scales_mins_k4(const uint8_t* packed) {
  constexpr int32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, top2 = 0x03030303;
  const __m128i words = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i acbc = _mm_shuffle_epi32(words, _MM_SHUFFLE(2, 1, 2, 0));
  const __m128i aabb = _mm_shuffle_epi32(words, _MM_SHUFFLE(1, 1, 0, 0));
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(acbc, _mm_setr_epi32(0, 0, 0, 4)), _mm_setr_epi32(low6, low4, low6, low4));
  const __m128i top = _mm_and_si128(_mm_srlv_epi32(aabb, _mm_setr_epi32(0, 6, 0, 6)), _mm_setr_epi32(0, top2, 0, top2));
  return _mm_or_si128(low, _mm_slli_epi32(top, 4));
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
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs_u_i8(lo, load32(xq)), s0));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs_u_i8(hi, load32(xq + 32)), s1));
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
          const __m256i p = pairs_u_i8(q, load32(x[r][i].qs + 128 * h + 32 * k));
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, scale));
        }
      }
    }
    const float dw = blocks::f16_to_f32(b.d);
    for (int r = 0; r < R; r++) sum[r] += (x[r][i].d * dw) * static_cast<float>(hsum(acc[r]));
  }
  for (int r = 0; r < R; r++) out[r] = sum[r];
}

#ifdef __AVX512BW__
#define TROUPE_K_QUANTS_512 1
/// 32 int16 lanes: the low 16 `lo`, the high 16 `hi`.
__m512i halves16(int16_t lo, int16_t hi) {
  return _mm512_inserti64x4(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi), 1);
}

/// acc + the int16 pairs' products with their scales, summed in pairs (exact): one VNNI
/// instruction where there is one.
__m512i scaled_add(__m512i acc, __m512i pairs, __m512i scales) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, pairs, scales);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, scales));
#endif
}

/// The totals of R <= 4 registers of 16 int32 (exact), lane r for register r (0 past R).
template <int R>
__m128i totals4(const __m512i* a) {
  if constexpr (R == 1)
    return _mm_cvtsi32_si128(hsum(_mm256_add_epi32(_mm512_castsi512_si256(a[0]), _mm512_extracti64x4_epi64(a[0], 1))));
  __m512i v[4];
  for (int r = 0; r < 4; r++) v[r] = r < R ? a[r] : _mm512_setzero_si512();
  const __m512i u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
  const __m512i u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/// Rows' Q8_K scales as lanes (rows past R: 0), built in registers: floats stored and then
/// loaded as a vector stall on store forwarding, once per super-block (45% of Q6_K's decode
/// samples, perf).
template <int R>
__m128 row_scales(const blocks::q8_k* const* x, int32_t i) {
  __m128 v = _mm_set_ss(x[0][i].d);
  if constexpr (R > 1) v = _mm_insert_ps(v, _mm_set_ss(x[1][i].d), 0x10);
  if constexpr (R > 2) v = _mm_insert_ps(v, _mm_set_ss(x[2][i].d), 0x20);
  if constexpr (R > 3) v = _mm_insert_ps(v, _mm_set_ss(x[3][i].d), 0x30);
  return v;
}

/// out[k * R + r] = lane r of sum[k].
template <int NW, int R>
void store_rows(const __m128* sum, float* out) {
  for (int k = 0; k < NW; k++) {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, sum[k]);
    for (int r = 0; r < R; r++) out[k * R + r] = lanes[r];
  }
}

/// Q4_K and Q5_K with 512-bit registers, NW weight rows by R activation rows: each 64-quant chunk
/// (sub-blocks 2c and 2c + 1, low and high nibbles of 32 bytes) unpacked once into one register
/// for every row, each activation chunk loaded once for every weight row; isum and msum as
/// dot_k_mins, the same integers, the same float steps.
template <int NW, int R, class Block>
void dot_k_mins_512(const Block* const* w, const blocks::q8_k* const* x, int32_t nb, float* out) {
  static_assert(R <= 4);
  const __m512i m4 = _mm512_set1_epi8(0xF), one = _mm512_set1_epi8(1), nibble_shift = halves16(0, 4);
  __m128 sum[NW];  // lane r: row r's
  for (__m128& v : sum) v = _mm_setzero_ps();
  for (int32_t i = 0; i < nb; i++) {
    __m512i scales[NW];
    __m128i mins[NW];
    __m512i acc[NW][R];
    for (int k = 0; k < NW; k++) {
      prefetch_after<sizeof(Block)>(&w[k][i]);
      const __m128i packed = scales_mins_k4(w[k][i].scales);
      scales[k] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(packed));  // int16 0-7
      mins[k] = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
      for (__m512i& a : acc[k]) a = _mm512_setzero_si512();
    }
    for (int32_t c = 0; c < 4; c++) {
      const __m512i pick = halves16(static_cast<int16_t>(2 * c), static_cast<int16_t>(2 * c + 1));
      __m512i q[NW], scale[NW];
      for (int k = 0; k < NW; k++) {
        const Block& b = w[k][i];
        q[k] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(load32(b.qs + 32 * c)), nibble_shift), m4);
        if (const uint8_t* qh = fifth_bits(b); qh != nullptr) {  // bits 2c and 2c + 1, worth 16
          const __m512i bits = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(load32(qh)), pick), one);
          q[k] = _mm512_or_si512(q[k], _mm512_slli_epi16(bits, 4));
        }
        scale[k] = _mm512_permutexvar_epi16(pick, scales[k]);
      }
      for (int r = 0; r < R; r++) {
        const __m512i xc = _mm512_loadu_si512(x[r][i].qs + 64 * c);
        for (int k = 0; k < NW; k++)
          acc[k][r] = scaled_add(acc[k][r], _mm512_maddubs_epi16(q[k], xc), scale[k]);
      }
    }
    if constexpr (R == 1) {  // decode: isum and msum reduced together, (xd * dw, xd * dmin) in one register
      const __m256i bsums = load32(x[0][i].bsums);
      const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
      const __m128 xd = _mm_set1_ps(x[0][i].d);
      for (int k = 0; k < NW; k++) {
        const __m256i a8 = _mm256_add_epi32(_mm512_castsi512_si256(acc[k][0]), _mm512_extracti64x4_epi64(acc[k][0], 1));
        const __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a8), _mm256_extracti128_si256(a8, 1));
        __m128i both = _mm_hadd_epi32(a4, _mm_madd_epi16(mins[k], pairs));
        both = _mm_hadd_epi32(both, both);  // (isum, msum, isum, msum)
        uint32_t d_dmin;                    // the f16 d and dmin side by side
        std::memcpy(&d_dmin, &w[k][i].d, sizeof(d_dmin));
        static_assert(offsetof(Block, dmin) == offsetof(Block, d) + 2);
        const __m128 scales = _mm_mul_ps(xd, _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int32_t>(d_dmin))));
        const __m128 terms = _mm_mul_ps(scales, _mm_cvtepi32_ps(both));  // (xd * dw) * isum, (xd * dmin) * msum
        sum[k] = _mm_add_ss(sum[k], _mm_sub_ss(terms, _mm_movehdup_ps(terms)));
      }
    } else {  // lane r of each register below is row r's (rows past R: 0)
      __m128i pairs[4];  // the chunks' activation sums: bsums[2j] + bsums[2j + 1]
      for (int r = 0; r < 4; r++) {
        pairs[r] = _mm_setzero_si128();
        if (r >= R) continue;
        const __m256i bsums = load32(x[r][i].bsums);
        pairs[r] = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
      }
      const __m128 xds = row_scales<R>(x, i);
      for (int k = 0; k < NW; k++) {
        const __m128 isum = _mm_cvtepi32_ps(totals4<R>(acc[k]));
        const __m128 msum = _mm_cvtepi32_ps(_mm_hadd_epi32(
            _mm_hadd_epi32(_mm_madd_epi16(mins[k], pairs[0]), _mm_madd_epi16(mins[k], pairs[1])),
            _mm_hadd_epi32(_mm_madd_epi16(mins[k], pairs[2]), _mm_madd_epi16(mins[k], pairs[3]))));
        const __m128 dw = _mm_set1_ps(blocks::f16_to_f32(w[k][i].d));
        const __m128 dmin = _mm_set1_ps(blocks::f16_to_f32(w[k][i].dmin));
        // (xd * dw) * isum - (xd * dmin) * msum, lane by lane
        sum[k] = _mm_add_ps(sum[k],
                            _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(xds, dw), isum), _mm_mul_ps(_mm_mul_ps(xds, dmin), msum)));
      }
    }
  }
  store_rows<NW, R>(sum, out);
}

/// Q6_K with 512-bit registers, NW weight rows by R activation rows: per half, two registers of
/// 64 quants (ql's low nibbles, then its high ones, with qh's bits), each four sub-blocks of 16
/// whose int16 pair sums take their own scale; the offset of 32 through bsums as dot_q6_k.
template <int NW, int R>
void dot_q6_k_512(const blocks::q6_k* const* w, const blocks::q8_k* const* x, int32_t nb, float* out) {
  static_assert(R <= 4);
  const __m512i m4 = _mm512_set1_epi8(0xF), m2_at_4 = _mm512_set1_epi8(0x30);
  __m128 sum[NW];  // lane r: row r's
  for (__m128& v : sum) v = _mm_setzero_ps();
  for (int32_t i = 0; i < nb; i++) {
    __m512i scales[NW];
    __m512i acc[NW][R];
    for (int k = 0; k < NW; k++) {
      const blocks::q6_k& b = w[k][i];
      prefetch_after<sizeof(blocks::q6_k)>(&b);
      const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
      scales[k] = _mm512_zextsi256_si512(s16);
      for (int r = 0; r < R; r++)  // -32 * sum of scale_j * bsums[j]
        acc[k][r] = _mm512_zextsi256_si512(_mm256_sub_epi32(
            _mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(s16, load32(x[r][i].bsums)), 5)));
    }
    for (int32_t h = 0; h < 2; h++)
      for (int32_t p = 0; p < 2; p++) {  // elements 128h + 64p .. + 64: sub-blocks 8h + 4p .. + 4
        const int16_t sb = static_cast<int16_t>(8 * h + 4 * p);
        const __m512i pick = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(sb + 1)), _mm_set1_epi16(sb))),
            _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(sb + 3)), _mm_set1_epi16(static_cast<int16_t>(sb + 2))),
            1);
        __m512i q[NW], scale[NW];
        for (int k = 0; k < NW; k++) {
          const blocks::q6_k& b = w[k][i];
          const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
          // qh's bits 4p + 2 * half and the next, moved to bits 4 and 5 of each byte
          const __m512i qh = _mm512_broadcast_i64x4(load32(b.qh + 32 * h));
          const __m512i top = _mm512_and_si512(p == 0 ? _mm512_sllv_epi16(qh, halves16(4, 2)) : _mm512_srlv_epi16(qh, halves16(0, 2)),
                                               m2_at_4);
          // (low nibble & 0x0F) | top in one ternary logic op (0xEA: (A & B) | C)
          q[k] = _mm512_ternarylogic_epi32(p == 0 ? ql : _mm512_srli_epi16(ql, 4), m4, top, 0xEA);
          scale[k] = _mm512_permutexvar_epi16(pick, scales[k]);
        }
        for (int r = 0; r < R; r++) {
          const __m512i xc = _mm512_loadu_si512(x[r][i].qs + 128 * h + 64 * p);
          for (int k = 0; k < NW; k++)
            acc[k][r] = scaled_add(acc[k][r], _mm512_maddubs_epi16(q[k], xc), scale[k]);
        }
      }
    const __m128 xds = row_scales<R>(x, i);
    for (int k = 0; k < NW; k++) {
      const __m128 dw = _mm_set1_ps(blocks::f16_to_f32(w[k][i].d));
      sum[k] = _mm_add_ps(sum[k], _mm_mul_ps(_mm_mul_ps(xds, dw), _mm_cvtepi32_ps(totals4<R>(acc[k]))));
    }
  }
  store_rows<NW, R>(sum, out);
}
#endif

/// Weight rows [i0, i1) of w, a multiple of NW of them, against the R activation rows x: row r's
/// output i at out[r * out_stride + i], vec_dot(w.row(i), x[r]), the same bits. The type is
/// dispatched once for the range; each kernel call takes NW weight rows, with the operands
/// prepared for it where there are.
template <int NW, int R>
void tile_range(float* out, int64_t out_stride, const uint8_t* const* x, [[maybe_unused]] const one_row_x* one_row,
                const quant_matrix& w, int64_t i0, int64_t i1) {
  const weight_type t = w.type;
  TROUPE_KERNEL_ASSERT(is_weight_type(static_cast<uint32_t>(t)));
  const int32_t n = w.n, nb = n / block_elements(t);
  TROUPE_KERNEL_ASSERT(nb * block_elements(t) == n && (i1 - i0) % NW == 0);
  const int64_t w_row_bytes = row_bytes(t, n);
  const auto each = [&](auto&& kernel) {
    for (int64_t i = i0; i < i1; i += NW) {
      const uint8_t* wr[NW];
      float sums[NW * R];
      for (int k = 0; k < NW; k++) wr[k] = w.data + (i + k) * w_row_bytes;
      kernel(wr, i, sums);
      for (int k = 0; k < NW; k++)
        for (int r = 0; r < R; r++) out[r * out_stride + i + k] = sums[k * R + r];
    }
  };
  using rows = const uint8_t* const*;
  const auto q8_0_x = as_rows<blocks::q8_0, R>(x);
  const auto q8_k_x = as_rows<blocks::q8_k, R>(x);
  switch (t) {
    case weight_type::f32: return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) { dot_float<NW, R, 4, load_f32, load1_f32>(wr, x, n, s); });
    case weight_type::f16:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) { dot_float<NW, R, 2, load_f16, load1_16<blocks::f16_to_f32>>(wr, x, n, s); });
    case weight_type::bf16:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) { dot_float<NW, R, 2, load_bf16, load1_16<blocks::bf16_to_f32>>(wr, x, n, s); });
    case weight_type::q8_0:
#ifdef TROUPE_VNNI_512
      if constexpr (R == 1)
        if (one_row != nullptr)
          return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
            for (int k = 0; k < NW; k++)
              s[k] = dot_one_row<blocks::q8_0, q8_0_pair, q8_0_weights>(as<blocks::q8_0>(wr[k]), q8_0_x.p[0], *one_row, nb);
          });
#endif
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
        dot_q8_0_family<NW, R, blocks::q8_0, q8_0_weights>(as_rows<blocks::q8_0, NW>(wr).p, q8_0_x.p, nb, s);
      });
    case weight_type::q4_0:
#ifdef TROUPE_VNNI_512
      if constexpr (R == 1)
        if (one_row != nullptr)
          return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
            for (int k = 0; k < NW; k++)
              s[k] = dot_one_row<blocks::q4_0, q4_0_pair, q4_0_weights>(as<blocks::q4_0>(wr[k]), q8_0_x.p[0], *one_row, nb);
          });
#endif
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
        dot_q8_0_family<NW, R, blocks::q4_0, q4_0_weights>(as_rows<blocks::q4_0, NW>(wr).p, q8_0_x.p, nb, s);
      });
#ifdef TROUPE_K_QUANTS_512
    case weight_type::q4_k:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) { dot_k_mins_512<NW, R>(as_rows<blocks::q4_k, NW>(wr).p, q8_k_x.p, nb, s); });
    case weight_type::q5_k:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) { dot_k_mins_512<NW, R>(as_rows<blocks::q5_k, NW>(wr).p, q8_k_x.p, nb, s); });
    case weight_type::q6_k:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) { dot_q6_k_512<NW, R>(as_rows<blocks::q6_k, NW>(wr).p, q8_k_x.p, nb, s); });
#else
    case weight_type::q4_k:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
        for (int k = 0; k < NW; k++) dot_k_mins<R>(as<blocks::q4_k>(wr[k]), q8_k_x.p, nb, s + k * R);
      });
    case weight_type::q5_k:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
        for (int k = 0; k < NW; k++) dot_k_mins<R>(as<blocks::q5_k>(wr[k]), q8_k_x.p, nb, s + k * R);
      });
    case weight_type::q6_k:
      return each([&](rows wr, [[maybe_unused]] int64_t i, float* s) {
        for (int k = 0; k < NW; k++) dot_q6_k<R>(as<blocks::q6_k>(wr[k]), q8_k_x.p, nb, s + k * R);
      });
#endif
    case weight_type::q8_k: break;
  }
  TROUPE_KERNEL_ASSERT(false);
}

/// Weight rows taken together by tile_range when there are more than max_rows activation rows
/// (prefill): each activation register then feeds this many weight rows. AVX2's 16 registers
/// hold one weight row's accumulators for max_rows rows; AVX-512's 32 hold three.
constexpr int32_t tile_weight_rows = fvec_lanes == 16 ? 3 : 1;

/// F32 weight rows taken together against one activation row (decode): each streams from
/// memory, and several streams in flight keep more of it busy than one does with its
/// prefetches. Measured side by side, one thread, 0.5b F32 file: 15.2 against 13.8 tok/s (F16 was
/// slower so: 24.5 against 27.2). AVX2's 16 registers hold one.
constexpr int32_t decode_f32_rows = fvec_lanes == 16 ? 8 : 1;

/// One activation row x against F32 weight rows [i0, i1), NW rows a kernel call.
template <int NW>
void f32_rows(float* out, const uint8_t* x, const quant_matrix& w, int64_t i0, int64_t i1) {
  const int64_t w_row_bytes = row_bytes(w.type, w.n);
  for (int64_t i = i0; i < i1; i += NW) {
    const uint8_t* wr[NW];
    for (int k = 0; k < NW; k++) wr[k] = w.data + (i + k) * w_row_bytes;
    dot_float<NW, 1, 4, load_f32, load1_f32>(wr, &x, w.n, out + i);
  }
}

/// tile_range for the num (1..max_rows) activation rows x.
template <int NW>
void tile_range(float* out, int64_t out_stride, const uint8_t* const* x, int32_t num, const one_row_x* one_row,
                const quant_matrix& w, int64_t i0, int64_t i1) {
  switch (num) {
    case 4: return tile_range<NW, 4>(out, out_stride, x, one_row, w, i0, i1);
    case 3: return tile_range<NW, 3>(out, out_stride, x, one_row, w, i0, i1);
    case 2: return tile_range<NW, 2>(out, out_stride, x, one_row, w, i0, i1);
    default: return tile_range<NW, 1>(out, out_stride, x, one_row, w, i0, i1);
  }
}
#endif  // TROUPE_QUANTS_AVX2

/// A product this large (multiply-adds) is split over the pool; below it, waking the workers
/// costs more than they save.
constexpr int64_t parallel_work_min = int64_t{1} << 18;

/// Prefill takes the weight rows a panel of about this many bytes at a time, all activation
/// rows against each panel: the panel stays in the core's cache (L2) while the activations
/// pass, instead of every activation row streaming past each weight row.
constexpr int64_t panel_bytes = 256 << 10;

#ifdef TROUPE_VNNI_512
/// rows16 groups [0, groups) at `at` (Q8_0 or Q4_0 weight rows i0 onwards) against every
/// activation row (xb: their x_blocks), max_rows rows to a kernel call.
template <class Block>
void groups_by_rows(float* out, const uint8_t* xq, int64_t x_row_bytes, const x_blocks& xb, const uint8_t* at,
                    const quant_matrix& w, int32_t rows, int64_t i0, int64_t groups) {
  const int32_t nb = w.n / qk;
  const int64_t group_bytes = 16 * row_bytes(w.type, w.n);
  for (int32_t r = 0; r < rows; r += max_rows) {
    const int32_t num = std::min(max_rows, rows - r);
    const blocks::q8_0* x[max_rows];
    const int32_t* excess[max_rows];
    const float* dx[max_rows];
    for (int32_t k = 0; k < num; k++) {
      x[k] = as<blocks::q8_0>(xq + (r + k) * x_row_bytes);
      excess[k] = xb.excess.data() + static_cast<size_t>(r + k) * static_cast<size_t>(nb);
      dx[k] = xb.dx.data() + static_cast<size_t>(r + k) * static_cast<size_t>(nb);
    }
    for (int64_t g = 0; g < groups; g++) {
      float* o[max_rows];
      for (int32_t k = 0; k < num; k++) o[k] = out + (r + k) * static_cast<int64_t>(w.d) + i0 + 16 * g;
      const uint8_t* group = at + g * group_bytes;
      switch (num) {
        case 4: dot_16_rows<4, Block>(group, x, excess, dx, nb, o); break;
        case 3: dot_16_rows<3, Block>(group, x, excess, dx, nb, o); break;
        case 2: dot_16_rows<2, Block>(group, x, excess, dx, nb, o); break;
        default: dot_16_rows<1, Block>(group, x, excess, dx, nb, o); break;
      }
    }
  }
}

/// Q8_0 or Q4_0 weight rows [i0, i0 + 16 * groups) of a matrix laid out as rows against every
/// activation row: laid out as rows16 once for all of them (a panel in the core's cache), then
/// groups_by_rows.
template <class Block>
void rows_by_16(float* out, const uint8_t* xq, int64_t x_row_bytes, const x_blocks& xb, const quant_matrix& w, int32_t rows,
                int64_t i0, int64_t groups) {
  // A slice of fewer than 16 rows has none: its thread's panel may never have been allocated.
  if (groups == 0) return;
  struct alignas(64) line {
    uint8_t bytes[64];
  };
  thread_local std::vector<line> panel;  // kept: its pages stay mapped between steps
  grow_to(panel, static_cast<size_t>((groups * 16 * row_bytes(w.type, w.n) + 63) / 64));
  uint8_t* at = panel.data()->bytes;
  repack_16_rows<Block>(at, w, i0, groups);
  groups_by_rows<Block>(out, xq, x_row_bytes, xb, at, w, rows, i0, groups);
}

/// matmul_outputs of a rows16 matrix, [begin, end) whole groups: straight from the matrix, a
/// panel of ~256 KiB at a time against every activation row.
void rows16_outputs(float* out, const uint8_t* xq, const x_blocks& xb, const quant_matrix& w, int32_t rows, int64_t begin,
                    int64_t end) {
  TROUPE_KERNEL_ASSERT(begin % 16 == 0 && end % 16 == 0);
  const int64_t x_row_bytes = row_bytes(dot_type(w.type), w.n), w_row_bytes = row_bytes(w.type, w.n);
  const int64_t panel = std::max<int64_t>(16, panel_bytes / w_row_bytes / 16 * 16);
  for (int64_t i0 = begin; i0 < end; i0 += panel) {
    const int64_t groups = (std::min(end, i0 + panel) - i0) / 16;
    const uint8_t* at = w.data + i0 * w_row_bytes;
    if (w.type == weight_type::q8_0)
      groups_by_rows<blocks::q8_0>(out, xq, x_row_bytes, xb, at, w, rows, i0, groups);
    else
      groups_by_rows<blocks::q4_0>(out, xq, x_row_bytes, xb, at, w, rows, i0, groups);
  }
}
#endif

/// Outputs [begin, end) of every row: each weight row is read once for all activation rows,
/// and each of its blocks unpacked once for up to max_rows of them.
void matmul_outputs(float* out, const uint8_t* xq, [[maybe_unused]] const prepared_x& xp, const quant_matrix& w, int32_t rows,
                    int64_t begin, int64_t end) {
  const int64_t x_row_bytes = row_bytes(dot_type(w.type), w.n);
#ifdef TROUPE_VNNI_512
  if (w.layout == matrix_layout::rows16) return rows16_outputs(out, xq, *xp.many, w, rows, begin, end);
#endif
  TROUPE_KERNEL_ASSERT(w.layout == matrix_layout::rows);
#ifdef TROUPE_QUANTS_AVX2
  int64_t panel = std::max<int64_t>(1, panel_bytes / row_bytes(w.type, w.n));
  if (xp.many != nullptr) panel = std::max<int64_t>(16, panel / 16 * 16);
  for (int64_t i0 = begin; i0 < end; i0 += panel) {
    const int64_t i1 = std::min(end, i0 + panel);
    int64_t tail = i0;  // the first row the kernels below take
#ifdef TROUPE_VNNI_512
    if (xp.many != nullptr) {
      const int64_t groups = (i1 - i0) / 16;
      if (w.type == weight_type::q8_0)
        rows_by_16<blocks::q8_0>(out, xq, x_row_bytes, *xp.many, w, rows, i0, groups);
      else
        rows_by_16<blocks::q4_0>(out, xq, x_row_bytes, *xp.many, w, rows, i0, groups);
      tail = i0 + 16 * groups;
    }
#endif
    for (int32_t r = 0; r < rows; r += max_rows) {
      const int32_t num = std::min(max_rows, rows - r);
      const uint8_t* x[max_rows];
      for (int32_t k = 0; k < num; k++) x[k] = xq + (r + k) * x_row_bytes;
      float* o = out + r * static_cast<int64_t>(w.d);
      int64_t i = tail;
      if (rows > max_rows && num == max_rows) {  // prefill: the panel's weights are in cache
        i = tail + (i1 - tail) / tile_weight_rows * tile_weight_rows;
        tile_range<tile_weight_rows>(o, w.d, x, num, xp.one_row, w, tail, i);
      }
      if (rows == 1 && decode_f32_rows > 1 && w.type == weight_type::f32) {  // decode
        i = tail + (i1 - tail) / decode_f32_rows * decode_f32_rows;
        f32_rows<decode_f32_rows>(o, x[0], w, tail, i);
      }
      tile_range<1>(o, w.d, x, num, xp.one_row, w, i, i1);
    }
  }
#else
  for (int64_t i = begin; i < end; i++)
    for (int32_t r = 0; r < rows; r++)
      out[r * static_cast<int64_t>(w.d) + i] = reference::vec_dot(w.row(i), xq + r * x_row_bytes, w.type, w.n);
#endif
}

/// A matmul's activations laid out once for every weight row where a kernel takes them so:
/// Q8_0 or Q4_0 with VNNI: as x_blocks for a rows16 matrix (any number of rows) and for
/// rows_by_16 (ggml's rows, two activation rows or more: 2.2x faster than the per-row kernels at
/// 2-4 rows); one row against ggml's rows as one_row_x (its kernel measured 1.6x faster than
/// rows_by_16, which lays the rows out per product, at one row).
prepared_x prepare(const uint8_t* xq, const quant_matrix& w, int32_t rows) {
#ifdef TROUPE_VNNI_512
  const int32_t nb = w.n / qk;
  if (w.type != weight_type::q8_0 && w.type != weight_type::q4_0) return {};
  if (rows == 1 && w.layout == matrix_layout::rows) {
    thread_local one_row_x prepared;  // kept: its pages stay mapped between steps
    prepare_one_row(prepared, as<blocks::q8_0>(xq), nb, w.type);
    return {nullptr, &prepared};
  }
  thread_local x_blocks prepared;  // kept: its pages stay mapped between steps
  prepare_x_blocks(prepared, xq, row_bytes(dot_type(w.type), w.n), rows, nb, w.type);
  return {&prepared, nullptr};
#else
  (void)xq, (void)w, (void)rows;
  return {};
#endif
}

}  // namespace

bool takes_rows16(weight_type t) {
#ifdef TROUPE_VNNI_512
  return t == weight_type::q8_0 || t == weight_type::q4_0;
#else
  (void)t;
  return false;
#endif
}

void repack_rows16(const quant_matrix& w, uint8_t* out) {
  TROUPE_KERNEL_ASSERT(takes_rows16(w.type) && w.layout == matrix_layout::rows && w.d % 16 == 0);
#ifdef TROUPE_VNNI_512
  if (w.type == weight_type::q8_0)
    repack_16_rows<blocks::q8_0>(out, w, 0, w.d / 16);
  else
    repack_16_rows<blocks::q4_0>(out, w, 0, w.d / 16);
#else
  (void)out;
#endif
}

float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n) {
#ifdef TROUPE_QUANTS_AVX2
  float out = 0.0f;
  tile_range<1, 1>(&out, 0, &x, nullptr, quant_matrix{w, t, 1, n}, 0, 1);
  return out;
#else
  return reference::vec_dot(w, x, t, n);
#endif
}

void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool) {
  TROUPE_KERNEL_ASSERT(rows >= 0 && (w.layout == matrix_layout::rows || takes_rows16(w.type)));
  const int64_t work = static_cast<int64_t>(w.d) * w.n * rows;
  const prepared_x xp = prepare(xq, w, rows);
  if (pool == nullptr || pool->num_threads() == 1 || work < parallel_work_min) {
    matmul_outputs(out, xq, xp, w, rows, 0, w.d);
    return;
  }
  const int64_t unit = w.layout == matrix_layout::rows16 ? 16 : 1;  // a rows16 group is split by no thread
  pool->parallel_for(w.d / unit, [&](int32_t, int64_t begin, int64_t end) {
    matmul_outputs(out, xq, xp, w, rows, begin * unit, end * unit);
  });
}

}  // namespace troupe::kernels::cpu::fast::TROUPE_QUANTS_ISA
