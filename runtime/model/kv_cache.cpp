#include "runtime/model/kv_cache.hpp"

#include <algorithm>

namespace troupe::model {

kv_cache::kv_cache(const model_config& c, int32_t num_blocks, int32_t block_size)
    : n_layers_(c.n_layers), num_blocks_(num_blocks), block_size_(block_size), kv_dim_(c.kv_dim()) {
  TROUPE_ASSERT(num_blocks > 0);
  TROUPE_ASSERT(block_size > 0);
  const size_t size = static_cast<size_t>(n_layers_) * num_blocks_ * block_size_ * kv_dim_;
  keys_.assign(size, 0.0f);
  values_.assign(size, 0.0f);
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

}  // namespace troupe::model
