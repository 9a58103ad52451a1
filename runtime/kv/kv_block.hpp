#pragma once

/// One cached KV block outside the engine's pool, as the tiers hold it (host memory, disk): its
/// name in the block-hash chain, the tokens that name it, and its keys and values for every
/// layer in the type of the pool that demoted it (its bytes follow the type). Plain data; the
/// disk tier writes it with messages/kv_block.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/plan/kv_data.hpp"  // holds_kv

namespace troupe::kv {

struct kv_block {
  uint64_t hash = 0;            ///< chain_hash(parent_hash, tokens)
  uint64_t parent_hash = 0;     ///< the previous block's hash; root_hash_seed for a first block
  std::vector<int32_t> tokens;  ///< (block_size)
  int32_t num_layers = 0;
  int32_t kv_dim = 0;
  std::vector<uint8_t> keys;    ///< (num_layers, block_size) rows of kv_row_bytes(dtype, kv_dim)
  std::vector<uint8_t> values;  ///< the same shape
  kv_dtype dtype = kv_dtype::f32;

  /// Bytes of payload (tokens, keys, values) the block holds.
  [[nodiscard]] int64_t num_bytes() const;
};

/// Whether `block` is whole: tokens present, keys and values of (num_layers, tokens) rows of its
/// type each (holds_kv), and `hash` the chain hash of its tokens after `parent_hash`.
[[nodiscard]] bool is_consistent(const kv_block& block);

/// `is_consistent` for a block from elsewhere (a message): errc::invalid_argument naming what
/// is wrong — not `block_size` tokens, or dimensions, data and hash that do not agree.
[[nodiscard]] expected<void> validate(const kv_block& block, int32_t block_size);

/// XXH3 over every field in order (integers little-endian, then the token, key and value bytes,
/// then the type's byte unless f32, so that f32 blocks keep their checksums): what the disk tier
/// stores beside a block to detect a corrupted file.
[[nodiscard]] uint64_t checksum(const kv_block& block);

/// The rows of `layers` (ascending, each below kv.num_layers) of a consistent `kv`, in that
/// order: a sliding-window model's global layers, what its tiers keep of a block outside its
/// window state (docs/kv-tiers.md, "Window state").
[[nodiscard]] engine::kv_data kv_layers(const engine::kv_data& kv, const std::vector<int32_t>& layers);

/// The inverse: `kv` (one layer per entry of `layers`, ascending, each below `num_layers`) as
/// those layers' rows of `num_layers` layers, every other layer's rows zero.
[[nodiscard]] engine::kv_data kv_spread(const engine::kv_data& kv, const std::vector<int32_t>& layers,
                                        int32_t num_layers);

}  // namespace troupe::kv
