#include "runtime/kv/kv_block.hpp"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

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

}  // namespace troupe::kv
