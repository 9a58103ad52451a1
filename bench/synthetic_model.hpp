#pragma once

// A llama2.c checkpoint of a chosen shape with seeded random weights, for benchmarks that need
// a model whose weights do not fit in cache (stories260K's 1 MB does: on it a step is
// compute-bound per token and batching has little to amortize). The tokens it produces are
// meaningless; the work per token is a real model's.

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::bench {

struct synthetic_shape {
  int32_t dim = 512;
  int32_t hidden_dim = 1376;
  int32_t n_layers = 8;
  int32_t n_heads = 8;
  int32_t n_kv_heads = 4;
  int32_t vocab_size = 512;  // matches tok512.bin
  int32_t seq_len = 512;
};

/// Writes the checkpoint to `path` (legacy llama2.c format, shared classifier).
inline void write_synthetic_checkpoint(const std::string& path, const synthetic_shape& s, uint32_t seed) {
  const int64_t head_size = s.dim / s.n_heads, kv_dim = head_size * s.n_kv_heads;
  const int64_t dim = s.dim, hidden = s.hidden_dim, layers = s.n_layers;
  // Tensor sizes in llama2.c's order; the norms (ones) are told apart from matrices (random).
  const std::vector<std::pair<int64_t, bool>> tensors = {
      {s.vocab_size * dim, false}, {layers * dim, true},          {layers * dim * dim, false},
      {layers * kv_dim * dim, false}, {layers * kv_dim * dim, false}, {layers * dim * dim, false},
      {layers * dim, true},          {layers * hidden * dim, false}, {layers * dim * hidden, false},
      {layers * hidden * dim, false}, {dim, true},                   {s.seq_len * head_size, true}};
  std::FILE* f = std::fopen(path.c_str(), "wb");
  TROUPE_ASSERT_MSG(f != nullptr, "cannot write the synthetic checkpoint");
  const int32_t header[7] = {s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size, s.seq_len};
  std::fwrite(header, sizeof(header), 1, f);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> buffer;
  for (const auto& [count, ones] : tensors) {
    buffer.resize(static_cast<size_t>(count));
    for (float& v : buffer) v = ones ? 1.0f : u(rng);
    std::fwrite(buffer.data(), sizeof(float), buffer.size(), f);
  }
  std::fclose(f);
}

/// Prompt `i` for the synthetic shape: BOS and `length` - 1 token ids drawn from [3, 512) with
/// seed i.
inline std::vector<int32_t> random_prompt(uint32_t i, int32_t length) {
  std::mt19937 rng(i);
  std::uniform_int_distribution<int32_t> id(3, 511);
  std::vector<int32_t> p{1};
  for (int32_t k = 1; k < length; k++) p.push_back(id(rng));
  return p;
}

}  // namespace troupe::bench
