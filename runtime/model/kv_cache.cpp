#include "runtime/model/kv_cache.hpp"

#include <algorithm>

namespace troupe::model {

kv_cache::kv_cache(const model_config& c, int32_t num_blocks, int32_t block_size)
    : n_layers_(c.n_layers), num_blocks_(num_blocks), block_size_(block_size), kv_dim_(c.kv_dim()) {
  TROUPE_ASSERT(num_blocks > 0);
  TROUPE_ASSERT(block_size > 0);
  const size_t size = static_cast<size_t>(n_layers_) * num_blocks_ * block_size_ * kv_dim_;
  keys_ = page_buffer<float>(size);
  values_ = page_buffer<float>(size);
}

void kv_cache::copy_block(int32_t src, int32_t dst) {
  TROUPE_ASSERT(src >= 0 && src < num_blocks_);
  TROUPE_ASSERT(dst >= 0 && dst < num_blocks_);
  const int64_t block_floats = static_cast<int64_t>(block_size_) * kv_dim_;
  for (int32_t l = 0; l < n_layers_; l++) {
    std::copy_n(keys(l) + src * block_floats, block_floats, keys(l) + dst * block_floats);
    std::copy_n(values(l) + src * block_floats, block_floats, values(l) + dst * block_floats);
  }
}

namespace {

// Calls f(layer, key, value, row) for every layer and position < num_tokens: the position's key
// element d sits at key + d * block_size in the layer's keys (transposed within a block), its
// value row at `value` in the layer's values, and its row in the flat (layer, token, kv_dim)
// layout at `row`.
template <class F>
void for_each_slot(const int32_t* block_table, int32_t num_tokens, int32_t n_layers, int32_t block_size,
                   int32_t kv_dim, int32_t num_blocks, F&& f) {
  const int64_t block_floats = static_cast<int64_t>(block_size) * kv_dim;
  for (int32_t l = 0; l < n_layers; l++)
    for (int32_t p = 0; p < num_tokens; p++) {
      const int32_t block = block_table[p / block_size];
      TROUPE_ASSERT(block >= 0 && block < num_blocks);
      const int32_t slot = p % block_size;
      const int64_t row = (static_cast<int64_t>(l) * num_tokens + p) * kv_dim;  // in the flat layout
      f(l, block * block_floats + slot,                                // key d at + d * block_size
        block * block_floats + static_cast<int64_t>(slot) * kv_dim,    // value row
        row);
    }
}

}  // namespace

void kv_cache::gather(const int32_t* block_table, int32_t num_tokens, float* keys_out, float* values_out) const {
  for_each_slot(block_table, num_tokens, n_layers_, block_size_, kv_dim_, num_blocks_,
                [&](int32_t l, int64_t key, int64_t value, int64_t row) {
                  const float* k = keys(l) + key;
                  for (int32_t d = 0; d < kv_dim_; d++) keys_out[row + d] = k[static_cast<int64_t>(d) * block_size_];
                  std::copy_n(values(l) + value, kv_dim_, values_out + row);
                });
}

void kv_cache::scatter(const int32_t* block_table, int32_t num_tokens, const float* keys_in, const float* values_in) {
  for_each_slot(block_table, num_tokens, n_layers_, block_size_, kv_dim_, num_blocks_,
                [&](int32_t l, int64_t key, int64_t value, int64_t row) {
                  float* k = keys(l) + key;
                  for (int32_t d = 0; d < kv_dim_; d++) k[static_cast<int64_t>(d) * block_size_] = keys_in[row + d];
                  std::copy_n(values_in + row, kv_dim_, values(l) + value);
                });
}

}  // namespace troupe::model
