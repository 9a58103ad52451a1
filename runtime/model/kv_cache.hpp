#pragma once

/// The KV memory itself: fixed-size blocks of keys and values for every layer, stored in the
/// cache's type (kv_dtype). Which block belongs to which sequence is decided elsewhere
/// (runtime/kv's block manager); this only stores values and copies blocks.

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/common/page_buffer.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/plan/kv_dtype.hpp"

namespace troupe::model {

using kv::kv_dtype;  // the cache's type, from the floor (runtime/plan)

/// The KV type a model is served in when none is configured: f32 for float32 weights (llama2.c
/// checkpoints and F32 GGUF files keep their goldens, and runq.c's Q8_0 checkpoints its arithmetic),
/// f16 for a GGUF file with any matrix in another type (what llama.cpp stores by default).
[[nodiscard]] kv_dtype default_kv_dtype(const checkpoint& ck);
/// The same, from the file's header alone (read_header), before the weights load.
[[nodiscard]] kv_dtype default_kv_dtype(const model_header& header);

/// Whether a model of shape `c` can keep its KV as `t` (q8_0: kv_dim a multiple of 32);
/// errc::invalid_argument naming the type otherwise.
[[nodiscard]] expected<void> check_kv_dtype(const model_config& c, kv_dtype t);

/// The longest context — at most `model_context`, a multiple of `block_size` and at least one
/// block — such that `weight_bytes` and a KV pool holding one request of it (`bytes_per_token`
/// per position) fit in 90% of `available` bytes: the default `--ctx-size`. `model_context`
/// where `available` is unknown (negative).
[[nodiscard]] int32_t context_that_fits(int32_t model_context, int64_t weight_bytes, int64_t bytes_per_token,
                                        int64_t available, int32_t block_size);

/// The layers [first, end) a move of KV touches; the default is every layer. Moves of different
/// layers touch disjoint memory, so a step's moves can run layer by layer beside the forward
/// pass (kernels/cpu/layer_stream.hpp, runtime/engine/step_executor.cpp).
struct layer_range {
  int32_t first = 0;
  int32_t end = -1;  ///< -1: the pool's last layer + 1
};

class kv_cache {
 public:
  /// A pool of `num_blocks` blocks of `block_size` token slots for a model of shape `c`, stored
  /// as `dtype` (check_kv_dtype must pass: an always-on assertion).
  kv_cache(const model_config& c, int32_t num_blocks, int32_t block_size, kv_dtype dtype = kv_dtype::f32);

  [[nodiscard]] int32_t num_blocks() const { return num_blocks_; }
  [[nodiscard]] int32_t block_size() const { return block_size_; }
  [[nodiscard]] int32_t kv_dim() const { return kv_dim_; }
  [[nodiscard]] int32_t num_layers() const { return n_layers_; }
  [[nodiscard]] kv_dtype dtype() const { return dtype_; }
  /// Bytes of a pool of `num_blocks` blocks of `block_size` slots for a model of shape `c`: keys
  /// and values of every layer, block and slot, as `dtype`.
  [[nodiscard]] static int64_t bytes_of(const model_config& c, int32_t num_blocks, int32_t block_size,
                                        kv_dtype dtype) {
    return int64_t{2} * c.n_layers * num_blocks * block_size * kv_row_bytes(dtype, c.kv_dim());
  }
  /// Bytes of this pool (resident only as blocks are first written: runtime/common/page_buffer.hpp).
  [[nodiscard]] int64_t bytes() const { return static_cast<int64_t>(keys_.size() + values_.size()); }

  /// An f32 pool's keys of `layer`: (num_blocks, kv_dim, block_size), transposed within each
  /// block. Other types are read a block at a time (read_block).
  [[nodiscard]] float* keys(int32_t layer) { return reinterpret_cast<float*>(keys_.data() + f32_offset(layer)); }
  [[nodiscard]] const float* keys(int32_t layer) const {
    return reinterpret_cast<const float*>(keys_.data() + f32_offset(layer));
  }
  /// An f32 pool's values of `layer`: (num_blocks, block_size, kv_dim).
  [[nodiscard]] float* values(int32_t layer) { return reinterpret_cast<float*>(values_.data() + f32_offset(layer)); }
  [[nodiscard]] const float* values(int32_t layer) const {
    return reinterpret_cast<const float*>(values_.data() + f32_offset(layer));
  }

  /// Stores the key and value (kv_dim each) of `slot` (block * block_size + index in the block)
  /// in `layer`, converted to the pool's type.
  void write(int32_t layer, int64_t slot, const float* key, const float* value);
  /// Block `block` of `layer` as an f32 pool holds it: keys (kv_dim, block_size) transposed,
  /// values (block_size, kv_dim) — the stored values converted back, exactly.
  void read_block(int32_t layer, int32_t block, float* keys, float* values) const;

  /// Copies the keys and values of block `src` to block `dst` in `which` layers (copy-on-write
  /// forks).
  void copy_block(int32_t src, int32_t dst, layer_range which = {});

  /// Copies the keys and values of positions [0, num_tokens) of the sequence whose blocks are
  /// `block_table` into `keys` and `values`, each (n_layers, num_tokens) rows as this pool stores
  /// them (kv_row_bytes(dtype(), kv_dim) bytes; f32 rows as little-endian floats): a layout that
  /// does not depend on the block size (prefill/decode KV transfer, drain, the tiers).
  /// `which`: only those layers' rows are copied (the others' are left as they are).
  void gather(const int32_t* block_table, int32_t num_tokens, uint8_t* keys, uint8_t* values,
              layer_range which = {}) const;
  /// The inverse of `gather` for rows of type `from`: writes positions [0, num_tokens) into the
  /// table's blocks, the rows' bytes as they are where `from` is the pool's type, else their
  /// values converted; `which` layers only.
  void scatter(const int32_t* block_table, int32_t num_tokens, const uint8_t* keys, const uint8_t* values,
               kv_dtype from, layer_range which = {});

 private:
  /// `which` with its end resolved, checked against the pool's layers.
  [[nodiscard]] layer_range resolve(layer_range which) const;
  [[nodiscard]] int64_t layer_bytes() const { return int64_t{num_blocks_} * block_size_ * row_bytes_; }
  [[nodiscard]] int64_t layer_offset(int32_t layer) const {
    TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
    return layer * layer_bytes();
  }
  [[nodiscard]] int64_t f32_offset(int32_t layer) const {
    TROUPE_ASSERT_MSG(dtype_ == kv_dtype::f32, "only an f32 pool is read as floats in place");
    return layer_offset(layer);
  }
  /// Where feature 0 of `slot`'s key is in an f32 pool's layer: keys are transposed within a
  /// block, feature d of slot s at (block, d, s), so feature d is d * block_size further on.
  [[nodiscard]] int64_t f32_key_offset(int64_t slot) const {
    return slot / block_size_ * kv_dim_ * block_size_ + slot % block_size_;
  }
  /// Offset of slot `slot`'s row in `layer` of a pool of another type than f32.
  [[nodiscard]] int64_t row_offset(int32_t layer, int64_t slot) const { return layer_offset(layer) + slot * row_bytes_; }

  int32_t n_layers_;
  int32_t num_blocks_;
  int32_t block_size_;
  int32_t kv_dim_;
  kv_dtype dtype_;
  int64_t row_bytes_;            // one slot's key (or value) row
  page_buffer<uint8_t> keys_;    // f32: (layer, num_blocks, kv_dim, block_size); else (layer, slot, row)
  page_buffer<uint8_t> values_;  // (layer, num_blocks, block_size, kv_dim) as rows of the type
};

}  // namespace troupe::model
