#pragma once

/// KV as plain data, independent of any block layout: what a step imports into a replica's
/// blocks, exports or reads out of them (runtime/plan/step.hpp), and what a prefill engine ships
/// to a decode engine. On the floor of runtime/ (plan/): it includes nothing above it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/plan/ids.hpp"
#include "runtime/plan/kv_dtype.hpp"

namespace troupe::kv {

/// Whether `num_keys` and `num_values` are each num_layers * num_tokens rows of kv_dim values
/// as `dtype` stores them (kv_row_bytes): the KV of num_tokens positions. The values may come
/// from another process: a negative size, a product past 64 bits, a type that is none of
/// kv_dtype's, or q8_0 rows not of whole blocks of 32 never match.
[[nodiscard]] bool holds_kv(int64_t num_layers, int64_t num_tokens, int64_t kv_dim, kv_dtype dtype, size_t num_keys,
                            size_t num_values);

}  // namespace troupe::kv

namespace troupe::engine {

/// The KV of a sequence's first `num_tokens` positions, independent of any block layout: what a
/// prefill engine ships to a decode engine (prefill/decode disaggregation). Per layer, token
/// rows of `kv_dim` values in position order, each row as the pool that read it stores it
/// (`dtype`: f32 little-endian floats, f16, or Q8_0 blocks), so its bytes follow the type.
struct kv_data {
  int32_t num_layers = 0;
  int32_t kv_dim = 0;
  int32_t num_tokens = 0;
  std::vector<uint8_t> keys;    ///< (num_layers, num_tokens) rows of kv_row_bytes(dtype, kv_dim)
  std::vector<uint8_t> values;  ///< the same shape
  kv::kv_dtype dtype = kv::kv_dtype::f32;

  /// Whether the vectors hold exactly num_layers * num_tokens rows each (kv::holds_kv).
  [[nodiscard]] bool consistent() const {
    return kv::holds_kv(num_layers, num_tokens, kv_dim, dtype, keys.size(), values.size());
  }
};

/// KV computed elsewhere, to be written into this replica's blocks before a step runs.
struct kv_import {
  std::vector<int32_t> block_table;  ///< covers at least kv.num_tokens slots
  kv_data kv;
};

/// KV a step read back out of a sequence's blocks (positions [0, kv.num_tokens)).
struct kv_export {
  kv::seq_id seq = 0;
  kv_data kv;
};

/// KV to read back out of the pool (a drained request forwarded with its KV): positions
/// [0, num_tokens) of the blocks of `block_table`, read before anything in the plan writes a
/// block, so the blocks may already be free (and reused by this very plan).
struct kv_readout {
  std::vector<int32_t> block_table;  ///< covers at least num_tokens slots
  int32_t num_tokens = 0;            ///< > 0
};

/// Positions [first, first + num_tokens) of `kv` (clipped to kv.num_tokens), in the same layout.
[[nodiscard]] inline kv_data kv_slice(const kv_data& kv, int32_t first, int32_t num_tokens) {
  first = std::min(std::max(first, 0), kv.num_tokens);
  kv_data out{kv.num_layers, kv.kv_dim, std::min(num_tokens, kv.num_tokens - first), {}, {}, kv.dtype};
  const size_t row = static_cast<size_t>(kv::kv_row_bytes(kv.dtype, kv.kv_dim));
  for (int32_t l = 0; l < kv.num_layers; l++) {
    const size_t from = (static_cast<size_t>(l) * static_cast<size_t>(kv.num_tokens) + static_cast<size_t>(first)) * row;
    const size_t n = static_cast<size_t>(out.num_tokens) * row;
    out.keys.insert(out.keys.end(), kv.keys.begin() + from, kv.keys.begin() + from + n);
    out.values.insert(out.values.end(), kv.values.begin() + from, kv.values.begin() + from + n);
  }
  return out;
}

}  // namespace troupe::engine
