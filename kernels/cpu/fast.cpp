// Fast kernels: the same arithmetic as reference.cpp, vectorized across independent outputs.
#include <cmath>
#include <algorithm>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <cstdint>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/ops.hpp"

namespace troupe::kernels::cpu {
namespace {

// GCC/Clang vector extension: AVX registers with -march supporting them, two SSE registers
// otherwise. Lanes are independent outputs, never parts of one sum.
using v8f = float __attribute__((vector_size(32)));
static_assert(sizeof(v8f) == tile_width * sizeof(float));

// The matmul's tiles: AVX-512 registers with -march supporting them, two or four narrower
// ones otherwise.
using v16f = float __attribute__((vector_size(64)));
static_assert(sizeof(v16f) == matmul_tile_width * sizeof(float));

template <class V = v8f>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

inline void store_first(float* p, v16f v, int32_t count) {
  std::memcpy(p, &v, static_cast<size_t>(count) * sizeof(float));
}

// A block of `num_rows` rows x `num_tiles` tiles keeps num_rows * num_tiles independent sums in
// registers, so the adds overlap instead of waiting on one another. Each sum still runs over j
// in order, so the blocking never changes a result's bits.
// How far ahead each tile's stream is prefetched (floats): enough lines in flight that a block
// with several rows, whose arithmetic is as slow as the memory, keeps both busy.
constexpr int32_t prefetch_floats = 1024;

template <int num_rows, int num_tiles>
void matmul_block(float* out, const float* x, const packed_matrix& w, int32_t tile, int32_t row) {
  const int32_t n = w.n;
  const float* tiles = w.tiles.data() + static_cast<size_t>(tile) * n * matmul_tile_width;
  v16f acc[num_rows][num_tiles] = {};
  for (int32_t j = 0; j < n; j++) {
    for (int t = 0; t < num_tiles; t++) {
      const float* at = tiles + (static_cast<size_t>(t) * n + j) * matmul_tile_width;
      if (num_rows > 1) __builtin_prefetch(at + prefetch_floats);  // a 64-byte line per j
      const v16f wv = load<v16f>(at);  // w[cols][j]
      for (int r = 0; r < num_rows; r++) acc[r][t] += wv * x[static_cast<int64_t>(row + r) * n + j];
    }
  }
  for (int t = 0; t < num_tiles; t++) {
    const int32_t col = (tile + t) * matmul_tile_width;
    const int32_t count = w.d - col < matmul_tile_width ? w.d - col : matmul_tile_width;
    for (int r = 0; r < num_rows; r++)
      store_first(out + static_cast<int64_t>(row + r) * w.d + col, acc[r][t], count);
  }
}

using v16i = int32_t __attribute__((vector_size(64)));

/// 16 int8 values at `p`, sign-extended to int32 lanes (GCC scalarizes __builtin_convertvector
/// for this shape, so AVX-512's instruction is named where it exists).
inline v16i widen16(const int8_t* p) {
#ifdef __AVX512F__
  return reinterpret_cast<v16i>(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  using v16b = int8_t __attribute__((vector_size(16)));
  v16b b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, v16i);
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool have_vnni = true;
#else
constexpr bool have_vnni = false;
#endif

/// One group's exact int32 dot products of 16 outputs at once, for each of the block's rows and
/// tiles: int8 weights widened, times the row's int8 activation, one j at a time.
template <int num_rows, int num_tiles>
void q80_group_dots(v16i (&dot)[num_rows][num_tiles], const int8_t* xq, const int8_t* tiles, int32_t n, int32_t row,
                    int32_t begin, int32_t end) {
  for (int32_t j = begin; j < end; j++) {
    for (int t = 0; t < num_tiles; t++) {
      const int8_t* at = tiles + (static_cast<size_t>(t) * n + j) * matmul_tile_width;
      if (num_rows > 1 && (j & 3) == 0) __builtin_prefetch(at + 4 * prefetch_floats);  // a line per 4 j
      const v16i wv = widen16(at);
      for (int r = 0; r < num_rows; r++) dot[r][t] += wv * static_cast<int32_t>(xq[static_cast<int64_t>(row + r) * n + j]);
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/// The same dot products from quad-packed tiles, 4 j per instruction: VNNI multiplies unsigned
/// by signed bytes, so the activations go in as x + 128 (the sign bit flipped) and the caller
/// takes 128 x the group's weight sum back off. Integer sums are exact in any order.
template <int num_rows, int num_tiles>
void q80_group_dots_vnni(v16i (&dot)[num_rows][num_tiles], const int8_t* xq, const int8_t* tiles, int32_t n,
                         int32_t row, int32_t begin, int32_t end) {
  for (int32_t j = begin; j < end; j += 4) {
    for (int t = 0; t < num_tiles; t++) {
      const int8_t* at = tiles + (static_cast<size_t>(t) * n + j) * matmul_tile_width;
      if (num_rows > 1) __builtin_prefetch(at + 4 * prefetch_floats);  // a line per 4 j
      const __m512i wv = _mm512_loadu_si512(at);
      for (int r = 0; r < num_rows; r++) {
        uint32_t x4;
        std::memcpy(&x4, xq + static_cast<int64_t>(row + r) * n + j, sizeof(x4));
        const __m512i xu = _mm512_set1_epi32(static_cast<int32_t>(x4 ^ 0x80808080u));
        dot[r][t] = reinterpret_cast<v16i>(_mm512_dpbusd_epi32(reinterpret_cast<__m512i>(dot[r][t]), xu, wv));
      }
    }
  }
}
#endif

// The Q8_0 twin of matmul_block: per group, exact int32 dot products of 16 outputs at once,
// then each output's float steps in the reference's order: sum += float(dot) * weight scale *
// activation scale, group by group.
template <int num_rows, int num_tiles>
void matmul_q80_block(float* out, const int8_t* xq, const float* xs, const packed_q80& w, int32_t tile,
                      int32_t row) {
  const int32_t n = w.n, gs = w.group_size, groups = n / gs;
  const int8_t* tiles = w.tiles.data() + static_cast<size_t>(tile) * n * matmul_tile_width;
  const float* scales = w.scales.data() + static_cast<size_t>(tile) * groups * matmul_tile_width;
  v16f acc[num_rows][num_tiles] = {};
  for (int32_t g = 0; g < groups; g++) {
    v16i dot[num_rows][num_tiles] = {};
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (w.quads) {
      q80_group_dots_vnni(dot, xq, tiles, n, row, g * gs, (g + 1) * gs);
      const int32_t* sums = w.sums.data() + static_cast<size_t>(tile) * groups * matmul_tile_width;
      for (int t = 0; t < num_tiles; t++) {
        v16i sum;
        std::memcpy(&sum, sums + (static_cast<size_t>(t) * groups + g) * matmul_tile_width, sizeof(sum));
        for (int r = 0; r < num_rows; r++) dot[r][t] -= sum * 128;
      }
    } else
#endif
      q80_group_dots(dot, xq, tiles, n, row, g * gs, (g + 1) * gs);
    for (int t = 0; t < num_tiles; t++) {
      const v16f s = load<v16f>(scales + (static_cast<size_t>(t) * groups + g) * matmul_tile_width);
      for (int r = 0; r < num_rows; r++)
        acc[r][t] += __builtin_convertvector(dot[r][t], v16f) * s * xs[static_cast<int64_t>(row + r) * groups + g];
    }
  }
  for (int t = 0; t < num_tiles; t++) {
    const int32_t col = (tile + t) * matmul_tile_width;
    const int32_t count = w.d - col < matmul_tile_width ? w.d - col : matmul_tile_width;
    for (int r = 0; r < num_rows; r++)
      store_first(out + static_cast<int64_t>(row + r) * w.d + col, acc[r][t], count);
  }
}

}  // namespace

void quantize_q80(int8_t* q, float* s, const float* x, int32_t n, int32_t group_size) {
  for (int32_t g = 0; g < n / group_size; g++) {
    const float* xg = x + static_cast<int64_t>(g) * group_size;  // (group_size)
    float x_max = 0.0f;
    for (int32_t i = 0; i < group_size; i++) x_max = std::fabs(xg[i]) > x_max ? std::fabs(xg[i]) : x_max;
    const float scale = x_max / 127.0f;
    s[g] = scale;
    for (int32_t i = 0; i < group_size; i++) {
      // |x / scale| <= 127 up to rounding, so the rounded value lands in [-127, 127]; the test
      // keeps a NaN (a broken model) from becoming undefined behaviour.
      const float rounded = scale > 0.0f ? std::round(xg[i] / scale) : 0.0f;
      q[static_cast<int64_t>(g) * group_size + i] =
          rounded >= -127.0f && rounded <= 127.0f ? static_cast<int8_t>(rounded) : int8_t{0};
    }
  }
}

packed_matrix pack_matrix(const float* w, int32_t d, int32_t n) {
  packed_matrix p;
  p.d = d;
  p.n = n;
  const int32_t num_tiles = (d + matmul_tile_width - 1) / matmul_tile_width;
  p.tiles.assign(static_cast<size_t>(num_tiles) * n * matmul_tile_width, 0.0f);
  for (int32_t i = 0; i < d; i++) {
    const int32_t t = i / matmul_tile_width;
    const int32_t lane = i % matmul_tile_width;
    for (int32_t j = 0; j < n; j++)
      p.tiles[(static_cast<size_t>(t) * n + j) * matmul_tile_width + lane] = w[static_cast<int64_t>(i) * n + j];
  }
  return p;
}

packed_q80 pack_q80(const q80_matrix& w) {
  packed_q80 p;
  p.d = w.d;
  p.n = w.n;
  p.group_size = w.group_size;
  p.quads = have_vnni && w.n % 4 == 0 && w.group_size % 4 == 0;
  const int32_t num_tiles = (w.d + matmul_tile_width - 1) / matmul_tile_width, groups = w.n / w.group_size;
  p.tiles.assign(static_cast<size_t>(num_tiles) * w.n * matmul_tile_width, 0);
  p.scales.assign(static_cast<size_t>(num_tiles) * groups * matmul_tile_width, 0.0f);
  if (p.quads) p.sums.assign(p.scales.size(), 0);
  for (int32_t i = 0; i < w.d; i++) {
    const size_t t = static_cast<size_t>(i / matmul_tile_width), lane = static_cast<size_t>(i % matmul_tile_width);
    for (int32_t j = 0; j < w.n; j++) {
      const int8_t q = w.q[static_cast<int64_t>(i) * w.n + j];
      if (!p.quads) {
        p.tiles[(t * w.n + j) * matmul_tile_width + lane] = q;
        continue;
      }
      const size_t quad = static_cast<size_t>(j & ~3), in_quad = static_cast<size_t>(j & 3);
      p.tiles[(t * w.n + quad) * matmul_tile_width + lane * 4 + in_quad] = q;
      p.sums[(t * groups + j / w.group_size) * matmul_tile_width + lane] += q;
    }
    for (int32_t g = 0; g < groups; g++)
      p.scales[(t * groups + g) * matmul_tile_width + lane] = w.s[static_cast<int64_t>(i) * groups + g];
  }
  return p;
}

namespace fast {

namespace {

// The two products' blocks, for the tile loop below: `block<R, T>(tile, row)` computes rows
// row..row+R-1 against tiles tile..tile+T-1.
struct f32_blocks {
  float* out;
  const float* x;
  const packed_matrix& w;
  template <int num_rows, int num_tiles>
  void block(int32_t tile, int32_t row) const {
    matmul_block<num_rows, num_tiles>(out, x, w, tile, row);
  }
};

struct q80_blocks {
  float* out;
  const int8_t* xq;
  const float* xs;
  const packed_q80& w;
  template <int num_rows, int num_tiles>
  void block(int32_t tile, int32_t row) const {
    matmul_q80_block<num_rows, num_tiles>(out, xq, xs, w, tile, row);
  }
};

/// Rows `row`..`rows` (fewer than 4) against `num_tiles` tiles from `tile`, in one block.
template <int num_tiles, class Blocks>
void last_rows(const Blocks& b, int32_t tile, int32_t row, int32_t rows) {
  switch (rows - row) {
    case 3: b.template block<3, num_tiles>(tile, row); break;
    case 2: b.template block<2, num_tiles>(tile, row); break;
    case 1: b.template block<1, num_tiles>(tile, row); break;
    default: break;
  }
}

// Tiles outer, rows inner: a panel of 4 tiles (4 x n x 16 floats: 256 KiB for n = 1024) is read
// from memory once per product and from cache by the batch's other rows, where rows outer read
// every weight once per 4 rows (and once per row left over). Each output's sum runs over j in
// the same order whatever the blocking, so the bits are those of the reference.
// With 32 vector registers (AVX-512), a batch of 16 rows or more goes 8 rows at a time first:
// 8 x 2 blocks keep 16 sums in registers and load each weight vector once per 8 rows, halving
// the weight traffic per multiply-add of 4 x 2 blocks, which at 64 rows is what a 4-tile panel
// (1 MiB at n = 4096, more than L2) streams at the core. Below 16 rows they lost: 8 clients of
// the bundled model on 2 executor threads ran at 1.05x the reference with them, 1.34-1.44x
// without (bench_serve --clients 8 --threads 2).
#if defined(__AVX512F__)
constexpr bool eight_row_blocks = true;
#else
constexpr bool eight_row_blocks = false;
#endif

/// Rows first_row..rows against tiles first_tile..end_tile.
template <class Blocks>
void tile_loop(const Blocks& b, int32_t first_row, int32_t rows, int32_t first_tile, int32_t end_tile) {
  int32_t t = first_tile;
  for (; t + 4 <= end_tile; t += 4) {
    int32_t row = first_row;
    if constexpr (eight_row_blocks)
      for (; rows - first_row >= 16 && row + 8 <= rows; row += 8) {
        b.template block<8, 2>(t, row);
        b.template block<8, 2>(t + 2, row);
      }
    for (; row + 4 <= rows; row += 4) {  // 4 x 2 blocks: 8 sums in registers
      b.template block<4, 2>(t, row);
      b.template block<4, 2>(t + 2, row);
    }
    last_rows<4>(b, t, row, rows);
  }
  for (; t < end_tile; t++) {
    int32_t row = first_row;
    for (; row + 4 <= rows; row += 4) b.template block<4, 1>(t, row);
    last_rows<1>(b, t, row, rows);
  }
}

// Below this many multiply-adds (~2 us on one core) a product is done before its chunks would
// have been handed out and collected (~1 us with the pool's workers watching: thread_pool.hpp;
// the threshold was 2^18 while starting them meant waking them).
constexpr int64_t parallel_matmul_min_work = int64_t{1} << 15;

/// The tile loop over a product's `num_tiles` tiles, split among the pool's threads when the
/// product is large enough: in panels of 4 tiles (so they stay whole), or, where there are fewer
/// panels than threads (a narrow matrix: d <= 64 is one panel) and at least 8 rows, in groups of
/// 4 rows that read the whole matrix each.
template <class Blocks>
void run_tiles(const Blocks& b, int32_t rows, int32_t d, int32_t n, thread_pool* pool) {
  const int32_t num_tiles = (d + matmul_tile_width - 1) / matmul_tile_width;
  const int64_t work = static_cast<int64_t>(rows) * n * d;
  if (pool == nullptr || pool->num_threads() == 1 || work < parallel_matmul_min_work) {
    tile_loop(b, 0, rows, 0, num_tiles);
    return;
  }
  const int32_t num_panels = (num_tiles + 3) / 4;
  if (num_panels < pool->num_threads() && rows >= 8) {
    const int32_t groups = rows / 4;  // the last takes the rows left over
    pool->parallel_for(groups, [&](int32_t, int64_t begin, int64_t end) {
      tile_loop(b, static_cast<int32_t>(4 * begin), end == groups ? rows : static_cast<int32_t>(4 * end), 0,
                num_tiles);
    });
    return;
  }
  pool->parallel_for(num_panels, [&](int32_t, int64_t begin, int64_t end) {
    tile_loop(b, 0, rows, static_cast<int32_t>(4 * begin), std::min(num_tiles, static_cast<int32_t>(4 * end)));
  });
}

}  // namespace

void matmul(float* out, const float* x, const packed_matrix& w, int32_t rows, thread_pool* pool) {
  run_tiles(f32_blocks{out, x, w}, rows, w.d, w.n, pool);
}

void matmul_q80(float* out, const int8_t* xq, const float* xs, const packed_q80& w, int32_t rows,
                thread_pool* pool) {
  run_tiles(q80_blocks{out, xq, xs, w}, rows, w.d, w.n, pool);
}

/// The kernels' exp of each lane of a float vector V (VI: its int32 twin): cpu::exp's
/// operations, lane by lane.
template <class V, class VI>
V exp_lanes(V x) {
  const V lo = V{} + detail::exp_lo;
  const V hi = V{} + detail::exp_hi;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  return detail::exp_formula(x, [](V n) {
    const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;
    V scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return scale;
  });
}

void shifted_exp(float* out, const float* x, int32_t n, float shift) {
  int32_t i = 0;
  constexpr int32_t width = sizeof(v16f) / sizeof(float);
  for (; i + width <= n; i += width) {
    const v16f e = exp_lanes<v16f, v16i>(load<v16f>(x + i) - shift);
    std::memcpy(out + i, &e, sizeof(e));
  }
  for (; i < n; i++) out[i] = cpu::exp(x[i] - shift);
}

namespace {

/// x[i] = exp(x[i] - max x) in place, as the reference (max is order-free: any grouping gives
/// the reference's value).
void exp_minus_max(float* x, int32_t n, exp_source exp) {
  constexpr int32_t width = sizeof(v16f) / sizeof(float);
  float max_val = x[0];
  int32_t i = 0;
  if (n >= width) {
    v16f m = load<v16f>(x);
    for (i = width; i + width <= n; i += width) {
      const v16f v = load<v16f>(x + i);
      m = v > m ? v : m;
    }
    for (int l = 0; l < width; l++) max_val = m[l] > max_val ? m[l] : max_val;
  }
  for (; i < n; i++) max_val = x[i] > max_val ? x[i] : max_val;
  if (exp == exp_source::libm)
    for (i = 0; i < n; i++) x[i] = std::exp(x[i] - max_val);
  else
    shifted_exp(x, x, n, max_val);  // element by element: in place is fine
}

void divide(float* x, int32_t n, float sum) {
  int32_t i = 0;
  for (; i + tile_width <= n; i += tile_width) store(x + i, load(x + i) / sum);
  for (; i < n; i++) x[i] /= sum;
}

/// Divides each of `num_rows` rows of n floats (row r at x + r * n) by its sum, each sum in
/// order as the reference's, num_rows chains of adds side by side: each add waits on its own
/// row's last, not on every row's.
template <int num_rows>
void divide_by_sums_in_order(float* x, int32_t n) {
  float s[num_rows] = {};
  for (int32_t i = 0; i < n; i++)
    for (int r = 0; r < num_rows; r++) s[r] += x[static_cast<int64_t>(r) * n + i];
  for (int r = 0; r < num_rows; r++) divide(x + static_cast<int64_t>(r) * n, n, s[r]);
}

/// softmax of each of `num_rows` rows of n floats (row r at x + r * n): fast::softmax's bits,
/// with the rows' sequential sums (latency-bound: one add per ~4 cycles) computed 8 or 4 at a
/// time.
void softmax_rows(float* x, int32_t num_rows, int32_t n, exp_source exp) {
  for (int32_t r = 0; r < num_rows; r++) exp_minus_max(x + static_cast<int64_t>(r) * n, n, exp);
  int32_t r = 0;
  for (; r + 8 <= num_rows; r += 8) divide_by_sums_in_order<8>(x + static_cast<int64_t>(r) * n, n);
  for (; r + 4 <= num_rows; r += 4) divide_by_sums_in_order<4>(x + static_cast<int64_t>(r) * n, n);
  for (; r < num_rows; r++) divide_by_sums_in_order<1>(x + static_cast<int64_t>(r) * n, n);
}

}  // namespace

void softmax(float* x, int32_t n, exp_source exp) {
  exp_minus_max(x, n, exp);
  divide_by_sums_in_order<1>(x, n);
}

void swiglu(float* hb, const float* hb2, int32_t n, exp_source exp) {
  if (exp == exp_source::libm) return reference::swiglu(hb, hb2, n, exp);
  int32_t i = 0;
  constexpr int32_t width = sizeof(v16f) / sizeof(float);
  for (; i + width <= n; i += width) {
    v16f v = load<v16f>(hb + i);
    v *= 1.0f / (1.0f + exp_lanes<v16f, v16i>(-v));
    const v16f out = v * load<v16f>(hb2 + i);
    std::memcpy(hb + i, &out, sizeof(out));
  }
  reference::swiglu(hb + i, hb2 + i, n - i, exp);
}

namespace {

// Scores of one head over `count` positions of one block from slot `from` into sh: lane l of a
// register sums q·k over i in order, as the reference; two registers (16 positions) per pass
// keep two independent sums in flight.
void block_scores(float* sh, const float* qh, const float* kb, int32_t hs, int32_t bs, int32_t from,
                  int32_t count, float scale) {
  kb += from;
  int32_t s = 0;
  for (; s + 2 * tile_width <= count; s += 2 * tile_width) {
    v8f acc0 = {}, acc1 = {};
    for (int32_t i = 0; i < hs; i++) {
      const float* k = kb + static_cast<int64_t>(i) * bs + s;
      acc0 += qh[i] * load(k);
      acc1 += qh[i] * load(k + tile_width);
    }
    store(sh + s, acc0 / scale);
    store(sh + s + tile_width, acc1 / scale);
  }
  for (; s + tile_width <= count; s += tile_width) {
    v8f acc = {};
    for (int32_t i = 0; i < hs; i++) acc += qh[i] * load(kb + static_cast<int64_t>(i) * bs + s);
    store(sh + s, acc / scale);
  }
  for (; s < count; s++) {
    float score = 0.0f;
    for (int32_t i = 0; i < hs; i++) score += qh[i] * kb[static_cast<int64_t>(i) * bs + s];
    sh[s] = score / scale;
  }
}

// out[h] = Σ_t a[h][t] v[t] for `num_heads` heads (at most 8; all 8 when the template's
// `all_eight`, so the head loop unrolls) of head_size 8 at once, one register each, t in order
// from `first` (the reference's order per element); a head's scores row holds position
// first + i at i. Each head's scores row and value offset are found once, not per position.
template <bool all_eight>
void weighted_values_8(float* out, const float* scores, const paged_kv& kv, int32_t first, int32_t num_positions,
                       int32_t first_head, int32_t num_heads, int32_t kv_mul) {
  const int32_t heads = all_eight ? tile_width : num_heads, count = num_positions - first;
  const float* a[tile_width];
  int32_t offset[tile_width];
  for (int32_t j = 0; j < heads; j++) {
    a[j] = scores + static_cast<int64_t>(first_head + j) * count - first;
    offset[j] = (first_head + j) / kv_mul * tile_width;
  }
  v8f acc[tile_width] = {};
  const int32_t bs = kv.block_size;
  for (int32_t t = first; t < num_positions;) {
    const int32_t from = t % bs, n = std::min(bs - from, num_positions - t);
    const float* vb = kv.value_cache + (static_cast<int64_t>(kv.block_table[t / bs]) * bs + from) * kv.kv_dim;
    for (int32_t s = 0; s < n; s++) {
      const float* v = vb + static_cast<int64_t>(s) * kv.kv_dim;
      for (int32_t j = 0; j < heads; j++) acc[j] += a[j][t + s] * load(v + offset[j]);
    }
    t += n;
  }
  for (int32_t j = 0; j < heads; j++) store(out + (first_head + j) * tile_width, acc[j]);
}

void weighted_values(float* out, const float* scores, const paged_kv& kv, int32_t first, int32_t num_positions,
                     const attention_shape& shape) {
  const int32_t kv_mul = shape.n_heads / shape.n_kv_heads;
  const int32_t hs = shape.head_size, count = num_positions - first;
  if (hs == tile_width) {
    for (int32_t h = 0; h < shape.n_heads; h += tile_width) {
      if (shape.n_heads - h >= tile_width)
        weighted_values_8<true>(out, scores, kv, first, num_positions, h, tile_width, kv_mul);
      else
        weighted_values_8<false>(out, scores, kv, first, num_positions, h, shape.n_heads - h, kv_mul);
    }
    return;
  }
  std::memset(out, 0, static_cast<size_t>(shape.n_heads) * hs * sizeof(float));
  for (int32_t t = first; t < num_positions; t++) {
    const float* v = kv.value_cache + (static_cast<int64_t>(kv.block_table[t / kv.block_size]) * kv.block_size +
                                       t % kv.block_size) * kv.kv_dim;
    for (int32_t h = 0; h < shape.n_heads; h++) {
      const float a = scores[static_cast<int64_t>(h) * count + t - first];
      const float* vh = v + (h / kv_mul) * hs;
      float* oh = out + h * hs;
      int32_t i = 0;
      for (; i + tile_width <= hs; i += tile_width) store(oh + i, load(oh + i) + a * load(vh + i));
      for (; i < hs; i++) oh[i] += a * vh[i];
    }
  }
}

}  // namespace

void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape, exp_source exp) {
  const int32_t kv_mul = shape.n_heads / shape.n_kv_heads;
  const int32_t hs = shape.head_size, bs = kv.block_size;
  const float scale = shape.divisor > 0 ? shape.divisor : std::sqrt(static_cast<float>(hs));
  const int32_t first = shape.first_position(num_positions), count = num_positions - first;
  const int64_t block_floats = static_cast<int64_t>(kv.kv_dim) * bs;
  for (int32_t h = 0; h < shape.n_heads; h++) {
    const float* qh = q + h * hs;  // (head_size)
    float* sh = scores + static_cast<int64_t>(h) * count;  // (count): position first + i at i
    const int64_t kv_offset = static_cast<int64_t>(h / kv_mul) * hs * bs;
    for (int32_t t = first; t < num_positions;) {
      const int32_t from = t % bs, n = std::min(bs - from, num_positions - t);
      block_scores(sh + (t - first), qh, kv.key_cache + kv.block_table[t / bs] * block_floats + kv_offset, hs, bs,
                   from, n, scale);
      t += n;
    }
    if (shape.softcap > 0)
      for (int32_t i = 0; i < count; i++) sh[i] = soft_cap(sh[i], shape.softcap);
  }
  softmax_rows(scores, shape.n_heads, count, exp);
  weighted_values(out, scores, kv, first, num_positions, shape);
}

}  // namespace fast
}  // namespace troupe::kernels::cpu
