// Fast kernels: the same arithmetic as reference.cpp, vectorized across independent outputs.
#include <cmath>
#include <algorithm>
#include <cstring>

#ifdef __AVX512F__
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its -Wmaybe-uninitialized
// reports wherever they are inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/check.hpp"
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

/// Divides each of `num_rows` rows (row r: n[r] floats at x[r]) by its sum, each sum in order
/// as the reference's, the rows' chains of adds side by side: each add waits on its own row's
/// last, not on every row's.
template <int num_rows>
void divide_by_sums_in_order(float* const* x, const int32_t* n) {
  float s[num_rows] = {};
  int32_t common = n[0];
  for (int r = 1; r < num_rows; r++) common = std::min(common, n[r]);
  for (int32_t i = 0; i < common; i++)
    for (int r = 0; r < num_rows; r++) s[r] += x[r][i];
  for (int r = 0; r < num_rows; r++) {
    for (int32_t i = common; i < n[r]; i++) s[r] += x[r][i];
    divide(x[r], n[r], s[r]);
  }
}

/// softmax of each of `num_rows` (at most 8) rows (row r: n[r] floats at x[r]): fast::softmax's
/// bits, with the rows' sequential sums (latency-bound: one add per ~4 cycles) side by side.
void softmax_rows(float* const* x, const int32_t* n, int32_t num_rows, exp_source exp) {
  for (int32_t r = 0; r < num_rows; r++) exp_minus_max(x[r], n[r], exp);
  int32_t r = 0;
  for (; r + 8 <= num_rows; r += 8) divide_by_sums_in_order<8>(x + r, n + r);
  for (; r + 4 <= num_rows; r += 4) divide_by_sums_in_order<4>(x + r, n + r);
  for (; r < num_rows; r++) divide_by_sums_in_order<1>(x + r, n + r);
}

}  // namespace

void softmax(float* x, int32_t n, exp_source exp) { softmax_rows(&x, &n, 1, exp); }

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

// Attention a tile at a time: the tile's (row, head) pairs, those of one KV head after each
// other, pass over the K and V blocks together, so each block comes from memory once per pass
// (and from L1 for each group of up to 8 pairs) instead of once per pair, and up to 8 pairs'
// sequential sums (softmax, outputs) run side by side. Every score, softmax and output element
// takes the reference's operations in the reference's order, so the tiling never changes a bit.

/// Pairs in one pass, at most (fewer where the scratch holds fewer pairs' scores).
constexpr int32_t max_pairs = 64;
/// Pairs whose scores share a load of K, or whose outputs' adds run side by side.
constexpr int32_t pairs_per_group = 8;

/// The pairs of one pass: query, scores (position `first` of the pass at 0), output, the KV
/// head read, and the positions each attends, [from, to).
struct attention_pairs {
  const float* q[max_pairs];
  float* scores[max_pairs];
  float* out[max_pairs];
  int32_t kv_head[max_pairs];
  int32_t from[max_pairs], to[max_pairs];
  int32_t count = 0;
  int32_t first = 0, end = 0;  // the union of their positions
};

/// f(std::integral_constant<int, count>{}) for count 1..8: a pass's group size as a template
/// argument (one register per pair).
template <class F>
void with_count(int32_t count, F&& f) {
  switch (count) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

/// Lanes of V (positions; float: one) of one K block scored for P queries: lane l sums q·k over
/// i in order, as the reference, then divides by scale. k: the block's feature 0 at this lane 0.
template <class V, int P>
void score_lanes(float* const* at, const float* const* q, const float* k, int32_t hs, int32_t bs, float scale) {
  V acc[P] = {};
  for (int32_t i = 0; i < hs; i++) {
    const V kv = load<V>(k + static_cast<int64_t>(i) * bs);
    for (int p = 0; p < P; p++) acc[p] += q[p][i] * kv;
  }
  for (int p = 0; p < P; p++) {
    const V s = acc[p] / scale;
    std::memcpy(at[p], &s, sizeof(s));
  }
}

/// Pairs [p0, p0 + P)'s scores over n positions of one K block from position t (kb: the
/// block's KV head at t): 16, then 8 positions per register, then one at a time.
template <int P>
void score_block(const attention_pairs& w, int32_t p0, const float* kb, int32_t t, int32_t n, int32_t hs, int32_t bs,
                 float scale) {
  float* at[P];
  const float* const* q = w.q + p0;
  const auto point = [&](int32_t s) {
    for (int p = 0; p < P; p++) at[p] = w.scores[p0 + p] + (t - w.first) + s;
  };
  int32_t s = 0;
  for (; s + matmul_tile_width <= n; s += matmul_tile_width) point(s), score_lanes<v16f, P>(at, q, kb + s, hs, bs, scale);
  for (; s + tile_width <= n; s += tile_width) point(s), score_lanes<v8f, P>(at, q, kb + s, hs, bs, scale);
  for (; s < n; s++) point(s), score_lanes<float, P>(at, q, kb + s, hs, bs, scale);
}

/// The pairs' scores over positions [first, end) of their union, block by block, each block
/// scored for every pair while it is in L1, up to 8 pairs of one KV head per load. A pair's
/// lanes outside its own positions are computed and never read.
void score_pairs(const attention_pairs& w, const paged_kv& kv, int32_t hs, float scale) {
  const int32_t bs = kv.block_size;
  const int64_t block_floats = static_cast<int64_t>(kv.kv_dim) * bs;
  for (int32_t t = w.first; t < w.end;) {
    const int32_t from = t % bs, n = std::min(bs - from, w.end - t);
    const float* block = kv.key_cache + kv.block_table[t / bs] * block_floats + from;
    for (int32_t p0 = 0, p1 = 0; p0 < w.count; p0 = p1) {
      for (p1 = p0 + 1; p1 < w.count && p1 - p0 < pairs_per_group && w.kv_head[p1] == w.kv_head[p0];) p1++;
      const float* kb = block + static_cast<int64_t>(w.kv_head[p0]) * hs * bs;
      with_count(p1 - p0, [&](auto p) { score_block<p()>(w, p0, kb, t, n, hs, bs, scale); });
    }
    t += n;
  }
}

/// For each of G pairs, out[g] (hs) += Σ a[g][u] v[g][u] over n positions, element by element
/// in order (as the reference: a product, then an add), a register of 16 or 8 elements (float:
/// one) of each pair side by side (G chains of adds).
template <class V, int G>
int32_t add_values_lanes(float* const* out, const float* const* a, const float* const* v, int64_t v_stride, int32_t n,
                         int32_t hs, int32_t j) {
  constexpr int32_t width = sizeof(V) / sizeof(float);
  for (; j + width <= hs; j += width) {
    V acc[G];
    for (int g = 0; g < G; g++) acc[g] = load<V>(out[g] + j);
    for (int32_t u = 0; u < n; u++)
      for (int g = 0; g < G; g++) acc[g] += a[g][u] * load<V>(v[g] + u * v_stride + j);
    for (int g = 0; g < G; g++) std::memcpy(out[g] + j, &acc[g], sizeof(acc[g]));
  }
  return j;
}

template <int G>
void add_values(float* const* out, const float* const* a, const float* const* v, int64_t v_stride, int32_t n,
                int32_t hs) {
  int32_t j = add_values_lanes<v16f, G>(out, a, v, v_stride, n, hs, 0);
  j = add_values_lanes<v8f, G>(out, a, v, v_stride, n, hs, j);
  add_values_lanes<float, G>(out, a, v, v_stride, n, hs, j);
}

/// The pairs' outputs: each the sum over its positions, in order, of score x value, a V block
/// read once for all of them, up to 8 pairs with the same positions in it side by side.
void value_pairs(const attention_pairs& w, const paged_kv& kv, int32_t hs) {
  const int32_t bs = kv.block_size;
  for (int32_t p = 0; p < w.count; p++) std::memset(w.out[p], 0, static_cast<size_t>(hs) * sizeof(float));
  for (int32_t t = w.first; t < w.end;) {
    const int32_t from = t % bs, n = std::min(bs - from, w.end - t);
    const float* vb = kv.value_cache + (static_cast<int64_t>(kv.block_table[t / bs]) * bs + from) * kv.kv_dim;
    const auto range = [&](int32_t p) { return std::pair{std::max(t, w.from[p]), std::min(t + n, w.to[p])}; };
    for (int32_t p0 = 0, p1 = 0; p0 < w.count; p0 = p1) {
      const auto [lo, hi] = range(p0);
      for (p1 = p0 + 1; p1 < w.count && p1 - p0 < pairs_per_group && range(p1) == range(p0);) p1++;
      if (lo >= hi) continue;
      float* out[pairs_per_group];
      const float* a[pairs_per_group];
      const float* v[pairs_per_group];
      for (int32_t p = p0; p < p1; p++) {
        out[p - p0] = w.out[p];
        a[p - p0] = w.scores[p] + (lo - w.first);
        v[p - p0] = vb + static_cast<int64_t>(lo - t) * kv.kv_dim + static_cast<int64_t>(w.kv_head[p]) * hs;
      }
      with_count(p1 - p0, [&](auto g) { add_values<g()>(out, a, v, kv.kv_dim, hi - lo, hs); });
    }
    t += n;
  }
}

/// Scores, softmax and outputs of one pass's pairs.
void attend_pairs(attention_pairs& w, const paged_kv& kv, const attention_shape& shape, float scale, exp_source exp) {
  const int32_t hs = shape.head_size;
  score_pairs(w, kv, hs, scale);
  float* own[max_pairs];  // each pair's scores from its own first position
  int32_t n[max_pairs];
  for (int32_t p = 0; p < w.count; p++) {
    own[p] = w.scores[p] + (w.from[p] - w.first);
    n[p] = w.to[p] - w.from[p];
    if (shape.softcap > 0)
      for (int32_t i = 0; i < n[p]; i++) own[p][i] = soft_cap(own[p][i], shape.softcap);
  }
  softmax_rows(own, n, w.count, exp);
  value_pairs(w, kv, hs);
}

}  // namespace

void attention_rows(float* out, const float* q, int64_t stride, float* scores, int64_t scores_floats,
                    const paged_kv& kv, int32_t num_positions, int32_t num_rows, const attention_shape& shape,
                    exp_source exp) {
  const int32_t kv_mul = shape.n_heads / shape.n_kv_heads, hs = shape.head_size;
  const float scale = shape.divisor > 0 ? shape.divisor : std::sqrt(static_cast<float>(hs));
  const int64_t row_floats = num_positions + num_rows - 1 - shape.first_position(num_positions);  // a pair's scores
  TROUPE_KERNEL_ASSERT(row_floats <= scores_floats);
  const int32_t pass_pairs = static_cast<int32_t>(std::min<int64_t>(max_pairs, scores_floats / row_floats));
  attention_pairs w;
  const auto flush = [&] {
    if (w.count > 0) attend_pairs(w, kv, shape, scale, exp);
    w.count = 0;
  };
  for (int32_t g = 0; g < shape.n_kv_heads; g++)
    for (int32_t r = 0; r < num_rows; r++)
      for (int32_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
        const int32_t p = w.count++;
        w.q[p] = q + r * stride + h * hs;
        w.out[p] = out + r * stride + h * hs;
        w.scores[p] = scores + p * row_floats;
        w.kv_head[p] = g;
        w.to[p] = num_positions + r;
        w.from[p] = shape.first_position(w.to[p]);
        w.first = p == 0 ? w.from[p] : std::min(w.first, w.from[p]);
        w.end = p == 0 ? w.to[p] : std::max(w.end, w.to[p]);
        if (w.count == pass_pairs) flush();
      }
  flush();
}

void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape, exp_source exp) {
  attention_rows(out, q, 0, scores, static_cast<int64_t>(shape.n_heads) * num_positions, kv, num_positions, 1, shape,
                 exp);
}

}  // namespace fast
}  // namespace troupe::kernels::cpu
