#pragma once

/// The KV memory itself: fixed-size blocks of keys and values for every layer. Which block
/// belongs to which sequence is decided elsewhere (runtime/kv's block manager); this only
/// stores floats and copies blocks.

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/common/page_buffer.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::model {

class kv_cache {
 public:
  /// A pool of `num_blocks` blocks of `block_size` token slots for a model of shape `c`.
  kv_cache(const model_config& c, int32_t num_blocks, int32_t block_size);

  [[nodiscard]] int32_t num_blocks() const { return num_blocks_; }
  [[nodiscard]] int32_t block_size() const { return block_size_; }
  [[nodiscard]] int32_t kv_dim() const { return kv_dim_; }
  [[nodiscard]] int32_t num_layers() const { return n_layers_; }
  /// Bytes of a pool of `num_blocks` blocks of `block_size` slots for a model of shape `c`: keys
  /// and values of every layer, block and slot.
  [[nodiscard]] static int64_t bytes_of(const model_config& c, int32_t num_blocks, int32_t block_size) {
    return int64_t{2} * c.n_layers * num_blocks * block_size * c.kv_dim() * static_cast<int64_t>(sizeof(float));
  }
  /// Bytes of this pool (resident only as blocks are first written: runtime/common/page_buffer.hpp).
  [[nodiscard]] int64_t bytes() const { return static_cast<int64_t>((keys_.size() + values_.size()) * sizeof(float)); }

  /// Keys of `layer`: (num_blocks, kv_dim, block_size), transposed within each block.
  [[nodiscard]] float* keys(int32_t layer) { return keys_.data() + layer_offset(layer); }
  [[nodiscard]] const float* keys(int32_t layer) const { return keys_.data() + layer_offset(layer); }
  /// Values of `layer`: (num_blocks, block_size, kv_dim).
  [[nodiscard]] float* values(int32_t layer) { return values_.data() + layer_offset(layer); }
  [[nodiscard]] const float* values(int32_t layer) const { return values_.data() + layer_offset(layer); }

  /// Copies every layer's keys and values of block `src` to block `dst` (copy-on-write forks).
  void copy_block(int32_t src, int32_t dst);

  /// Copies the keys and values of positions [0, num_tokens) of the sequence whose blocks are
  /// `block_table` into `keys` and `values`, each laid out (n_layers, num_tokens, kv_dim):
  /// a layout that does not depend on the block size (prefill/decode KV transfer).
  void gather(const int32_t* block_table, int32_t num_tokens, float* keys, float* values) const;
  /// The inverse of `gather`: writes positions [0, num_tokens) into the table's blocks.
  void scatter(const int32_t* block_table, int32_t num_tokens, const float* keys, const float* values);

 private:
  [[nodiscard]] int64_t layer_offset(int32_t layer) const {
    TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
    return static_cast<int64_t>(layer) * num_blocks_ * block_size_ * kv_dim_;
  }

  int32_t n_layers_;
  int32_t num_blocks_;
  int32_t block_size_;
  int32_t kv_dim_;
  page_buffer<float> keys_;    // (layer, num_blocks, kv_dim, block_size)
  page_buffer<float> values_;  // (layer, num_blocks, block_size, kv_dim)
};

}  // namespace troupe::model
