#pragma once

// Test-only: whole kv::kv_blocks cut from a token list, with KV values that say which block and
// element they are, for the tier tests; float32 KV rows as bytes.

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/kv/chain_hash.hpp"
#include "runtime/kv/kv_block.hpp"

namespace troupe::testing {

/// Float32 KV rows as engine::kv_data and kv::kv_block hold them: the floats' bytes.
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// `n` floats of value `x`, as bytes.
inline std::vector<uint8_t> f32_bytes(size_t n, float x) { return f32_bytes(std::vector<float>(n, x)); }

/// The floats of f32 rows' bytes.
inline std::vector<float> f32_values(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

/// `n` tokens first, first + 1, ...: distinct, so every block has its own hash.
inline std::vector<int32_t> token_range(int32_t n, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = first + i;
  return tokens;
}

/// Block `index` of `tokens` in blocks of `block_size`, with 2 layers x 3 dims of KV whose
/// values encode (first token, block, element).
inline kv::kv_block block_of(const std::vector<int32_t>& tokens, int32_t index, int32_t block_size) {
  kv::kv_block b;
  const auto first = tokens.begin() + static_cast<ptrdiff_t>(index) * block_size;
  b.tokens.assign(first, first + block_size);
  b.parent_hash =
      index == 0 ? kv::root_hash_seed : kv::chain_hashes(tokens, block_size).at(static_cast<size_t>(index) - 1);
  b.hash = kv::chain_hash(b.parent_hash, b.tokens.data(), block_size);
  b.num_layers = 2;
  b.kv_dim = 3;
  std::vector<float> keys, values;
  for (int32_t i = 0; i < 2 * block_size * 3; ++i) {
    keys.push_back(static_cast<float>(1000 * tokens[0] + 100 * index + i));
    values.push_back(-static_cast<float>(1000 * tokens[0] + 100 * index + i));
  }
  b.keys = f32_bytes(keys);
  b.values = f32_bytes(values);
  return b;
}

inline bool same_block(const kv::kv_block& a, const kv::kv_block& b) {
  return a.hash == b.hash && a.parent_hash == b.parent_hash && a.tokens == b.tokens && a.num_layers == b.num_layers &&
         a.kv_dim == b.kv_dim && a.keys == b.keys && a.values == b.values && a.dtype == b.dtype;
}

}  // namespace troupe::testing
