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

// A block of `num_rows` rows x `num_tiles` tiles keeps num_rows * num_tiles independent sums in
// registers, so the adds overlap instead of waiting on one another. Each sum still runs over j
// in order, so the blocking never changes a result's bits.
template <int num_rows, int num_tiles>
void matmul_block(float* out, const float* x, const packed_matrix& w, int32_t tile, int32_t row) {
  const int32_t n = w.n;
  const float* tiles = w.tiles.data() + static_cast<size_t>(tile) * n * tile_width;
  v8f acc[num_rows][num_tiles] = {};
  for (int32_t j = 0; j < n; j++) {
    for (int t = 0; t < num_tiles; t++) {
      const v8f wv = load(tiles + (static_cast<size_t>(t) * n + j) * tile_width);  // w[cols][j]
      for (int r = 0; r < num_rows; r++) acc[r][t] += wv * x[static_cast<int64_t>(row + r) * n + j];
    }
  }
  for (int t = 0; t < num_tiles; t++) {
    const int32_t col = (tile + t) * tile_width;
    const int32_t count = w.d - col < tile_width ? w.d - col : tile_width;
    for (int r = 0; r < num_rows; r++)
      store_first(out + static_cast<int64_t>(row + r) * w.d + col, acc[r][t], count);
  }
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
  const int32_t num_tiles = (w.d + tile_width - 1) / tile_width;
  int32_t row = 0;
  for (; row + 4 <= rows; row += 4) {
    int32_t t = 0;
    for (; t + 2 <= num_tiles; t += 2) matmul_block<4, 2>(out, x, w, t, row);
    for (; t < num_tiles; t++) matmul_block<4, 1>(out, x, w, t, row);
  }
  for (; row < rows; row++) {
    int32_t t = 0;
    for (; t + 4 <= num_tiles; t += 4) matmul_block<1, 4>(out, x, w, t, row);
    for (; t < num_tiles; t++) matmul_block<1, 1>(out, x, w, t, row);
  }
}

void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape) {
  const int32_t kv_mul = shape.n_heads / shape.n_kv_heads;
  const int32_t hs = shape.head_size;
  const float scale = std::sqrt(static_cast<float>(hs));
  auto slot = [&kv](int32_t t) {
    return (static_cast<int64_t>(kv.block_table[t / kv.block_size]) * kv.block_size +
            t % kv.block_size) * kv.kv_dim;
  };
  // Scores of 8 positions at once: lane l sums q·k(t + l) over i in order, as the reference.
  for (int32_t h = 0; h < shape.n_heads; h++) {
    const float* qh = q + h * hs;  // (head_size)
    const int32_t kv_offset = (h / kv_mul) * hs;
    float* sh = scores + static_cast<int64_t>(h) * num_positions;  // (num_positions)
    int32_t t = 0;
    for (; t + tile_width <= num_positions; t += tile_width) {
      const float* k[tile_width];
      for (int l = 0; l < tile_width; l++) k[l] = kv.key_cache + slot(t + l) + kv_offset;
      v8f acc = {};
      for (int32_t i = 0; i < hs; i++) {
        const v8f kt = {k[0][i], k[1][i], k[2][i], k[3][i], k[4][i], k[5][i], k[6][i], k[7][i]};
        acc += qh[i] * kt;
      }
      acc /= scale;
      std::memcpy(sh + t, &acc, sizeof(acc));
    }
    for (; t < num_positions; t++) {
      const float* k = kv.key_cache + slot(t) + kv_offset;
      float score = 0.0f;
      for (int32_t i = 0; i < hs; i++) score += qh[i] * k[i];
      sh[t] = score / scale;
    }
    softmax(sh, num_positions);
  }
  // Weighted values position by position (the reference's order), all heads side by side so
  // their independent sums overlap.
  std::memset(out, 0, static_cast<size_t>(shape.n_heads) * hs * sizeof(float));
  for (int32_t t = 0; t < num_positions; t++) {
    const float* v = kv.value_cache + slot(t);  // (kv_dim)
    for (int32_t h = 0; h < shape.n_heads; h++) {
      const float a = scores[static_cast<int64_t>(h) * num_positions + t];
      const float* vh = v + (h / kv_mul) * hs;
      float* oh = out + h * hs;
      for (int32_t i = 0; i < hs; i++) oh[i] += a * vh[i];
    }
  }
}

}  // namespace fast
}  // namespace troupe::kernels::cpu
