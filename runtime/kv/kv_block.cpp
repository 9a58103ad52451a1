#include "runtime/kv/kv_block.hpp"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <string>

#include "runtime/common/error.hpp"
#include "runtime/kv/chain_hash.hpp"

namespace troupe::kv {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the checksum hashes integers and floats as in memory");

int64_t kv_block::num_bytes() const {
  return static_cast<int64_t>(sizeof(int32_t) * tokens.size() + keys.size() + values.size());
}

bool is_consistent(const kv_block& block) {
  if (block.tokens.empty()) return false;
  if (!holds_kv(block.num_layers, static_cast<int64_t>(block.tokens.size()), block.kv_dim, block.dtype,
                block.keys.size(), block.values.size()))
    return false;
  return chain_hash(block.parent_hash, block.tokens.data(), static_cast<int32_t>(block.tokens.size())) == block.hash;
}

expected<void> validate(const kv_block& block, int32_t block_size) {
  if (static_cast<int64_t>(block.tokens.size()) != block_size)
    return fail(errc::invalid_argument, "a KV block must hold " + std::to_string(block_size) + " tokens, got " +
                                            std::to_string(block.tokens.size()));
  if (!is_consistent(block))
    return fail(errc::invalid_argument,
                "a KV block's dimensions do not match its data, or its hash is not its tokens' chain hash");
  return {};
}

uint64_t checksum(const kv_block& block) {
  XXH3_state_t state;
  TROUPE_ASSERT(XXH3_64bits_reset(&state) == XXH_OK);
  const auto add = [&state](const void* data, size_t bytes) {
    if (bytes > 0) TROUPE_ASSERT(XXH3_64bits_update(&state, data, bytes) == XXH_OK);
  };
  const auto num_tokens = static_cast<int64_t>(block.tokens.size());
  add(&block.hash, sizeof block.hash);
  add(&block.parent_hash, sizeof block.parent_hash);
  add(&num_tokens, sizeof num_tokens);
  add(&block.num_layers, sizeof block.num_layers);
  add(&block.kv_dim, sizeof block.kv_dim);
  add(block.tokens.data(), sizeof(int32_t) * block.tokens.size());
  add(block.keys.data(), block.keys.size());
  add(block.values.data(), block.values.size());
  if (block.dtype != kv_dtype::f32) {
    const auto type = static_cast<uint8_t>(block.dtype);
    add(&type, sizeof type);
  }
  return XXH3_64bits_digest(&state);
}

namespace {

/// Bytes of one layer's rows of `kv`.
size_t layer_bytes(const engine::kv_data& kv) {
  return static_cast<size_t>(kv.num_tokens) * static_cast<size_t>(kv_row_bytes(kv.dtype, kv.kv_dim));
}

bool ascending_below(const std::vector<int32_t>& layers, int32_t num_layers) {
  for (size_t i = 0; i < layers.size(); i++)
    if (layers[i] < 0 || layers[i] >= num_layers || (i > 0 && layers[i] <= layers[i - 1])) return false;
  return true;
}

/// Copies layer `from` of `src` to layer `to` of `dst` (both of `n` bytes a layer).
void copy_layer(const engine::kv_data& src, size_t from, engine::kv_data& dst, size_t to, size_t n) {
  std::copy_n(src.keys.begin() + static_cast<std::ptrdiff_t>(from * n), n, dst.keys.begin() + static_cast<std::ptrdiff_t>(to * n));
  std::copy_n(src.values.begin() + static_cast<std::ptrdiff_t>(from * n), n,
              dst.values.begin() + static_cast<std::ptrdiff_t>(to * n));
}

}  // namespace

engine::kv_data kv_layers(const engine::kv_data& kv, const std::vector<int32_t>& layers) {
  TROUPE_ASSERT(kv.consistent() && ascending_below(layers, kv.num_layers));
  const size_t n = layer_bytes(kv);
  engine::kv_data out{static_cast<int32_t>(layers.size()), kv.kv_dim, kv.num_tokens,
                      std::vector<uint8_t>(n * layers.size()), std::vector<uint8_t>(n * layers.size()), kv.dtype};
  for (size_t i = 0; i < layers.size(); i++) copy_layer(kv, static_cast<size_t>(layers[i]), out, i, n);
  return out;
}

engine::kv_data kv_spread(const engine::kv_data& kv, const std::vector<int32_t>& layers, int32_t num_layers) {
  TROUPE_ASSERT(kv.consistent() && kv.num_layers == static_cast<int32_t>(layers.size()) &&
                ascending_below(layers, num_layers));
  const size_t n = layer_bytes(kv);
  engine::kv_data out{num_layers, kv.kv_dim, kv.num_tokens, std::vector<uint8_t>(n * static_cast<size_t>(num_layers), 0),
                      std::vector<uint8_t>(n * static_cast<size_t>(num_layers), 0), kv.dtype};
  for (size_t i = 0; i < layers.size(); i++) copy_layer(kv, i, out, static_cast<size_t>(layers[i]), n);
  return out;
}

}  // namespace troupe::kv
