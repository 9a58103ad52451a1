// Fast kernels: the same arithmetic as reference.cpp, vectorized across independent outputs.
#include <cmath>
#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.hpp"

namespace troupe::kernels::cpu {
namespace {

// GCC/Clang vector extension: AVX registers with -march supporting them, two SSE registers
// otherwise. Lanes are independent outputs, never parts of one sum.
using v8f = float __attribute__((vector_size(32)));
static_assert(sizeof(v8f) == tile_width * sizeof(float));

inline v8f load(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store_first(float* p, v8f v, int32_t count) {
  std::memcpy(p, &v, static_cast<size_t>(count) * sizeof(float));
}

// Rows are processed in groups of `rows_per_group` to reuse each loaded weight tile; a row's
// arithmetic is the same in every group size, so grouping never changes its bits.
template <int rows_per_group>
void matmul_tile(float* out, const float* x, const float* tile, int32_t n, int32_t d,
                 int32_t col, int32_t row) {
  v8f acc[rows_per_group] = {};
  for (int32_t j = 0; j < n; j++) {
    const v8f w = load(tile + static_cast<int64_t>(j) * tile_width);  // w[col..col+8][j]
    for (int r = 0; r < rows_per_group; r++) acc[r] += w * x[static_cast<int64_t>(row + r) * n + j];
  }
  const int32_t count = d - col < tile_width ? d - col : tile_width;
  for (int r = 0; r < rows_per_group; r++)
    store_first(out + static_cast<int64_t>(row + r) * d + col, acc[r], count);
}

}  // namespace

packed_matrix pack_matrix(const float* w, int32_t d, int32_t n) {
  packed_matrix p;
  p.d = d;
  p.n = n;
  const int32_t num_tiles = (d + tile_width - 1) / tile_width;
  p.tiles.assign(static_cast<size_t>(num_tiles) * n * tile_width, 0.0f);
  for (int32_t i = 0; i < d; i++) {
    const int32_t t = i / tile_width;
    const int32_t lane = i % tile_width;
    for (int32_t j = 0; j < n; j++)
      p.tiles[(static_cast<size_t>(t) * n + j) * tile_width + lane] = w[static_cast<int64_t>(i) * n + j];
  }
  return p;
}

namespace fast {

void matmul(float* out, const float* x, const packed_matrix& w, int32_t rows) {
  constexpr int group = 4;
  const int32_t num_tiles = (w.d + tile_width - 1) / tile_width;
  for (int32_t t = 0; t < num_tiles; t++) {
    const float* tile = w.tiles.data() + static_cast<size_t>(t) * w.n * tile_width;
    const int32_t col = t * tile_width;
    int32_t row = 0;
    for (; row + group <= rows; row += group) matmul_tile<group>(out, x, tile, w.n, w.d, col, row);
    for (; row < rows; row++) matmul_tile<1>(out, x, tile, w.n, w.d, col, row);
  }
}

void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape) {
  const int32_t kv_mul = shape.n_heads / shape.n_kv_heads;
  const int32_t hs = shape.head_size;
  const float scale = std::sqrt(static_cast<float>(hs));
  const int32_t num_blocks = (num_positions + kv.block_size - 1) / kv.block_size;
  for (int32_t h = 0; h < shape.n_heads; h++) {
    const float* qh = q + h * hs;  // (head_size)
    const int32_t kv_offset = (h / kv_mul) * hs;
    for (int32_t b = 0; b < num_blocks; b++) {
      const float* k = kv.key_cache + static_cast<int64_t>(kv.block_table[b]) * kv.block_size * kv.kv_dim;
      const int32_t first = b * kv.block_size;
      const int32_t last = std::min(num_positions, first + kv.block_size);
      for (int32_t t = first; t < last; t++, k += kv.kv_dim) {
        float score = 0.0f;
        for (int32_t i = 0; i < hs; i++) score += qh[i] * k[kv_offset + i];
        scores[t] = score / scale;
      }
    }
    softmax(scores, num_positions);
    float* oh = out + h * hs;  // (head_size)
    std::memset(oh, 0, static_cast<size_t>(hs) * sizeof(float));
    for (int32_t b = 0; b < num_blocks; b++) {
      const float* v = kv.value_cache + static_cast<int64_t>(kv.block_table[b]) * kv.block_size * kv.kv_dim;
      const int32_t first = b * kv.block_size;
      const int32_t last = std::min(num_positions, first + kv.block_size);
      for (int32_t t = first; t < last; t++, v += kv.kv_dim)
        for (int32_t i = 0; i < hs; i++) oh[i] += scores[t] * v[kv_offset + i];
    }
  }
}

}  // namespace fast
}  // namespace troupe::kernels::cpu
