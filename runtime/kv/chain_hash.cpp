#include "runtime/kv/chain_hash.hpp"

#include <xxhash.h>

#include "runtime/common/error.hpp"

namespace troupe::kv {

uint64_t chain_hash(uint64_t parent_hash, const int32_t* block_tokens, int32_t block_size) {
  TROUPE_ASSERT(block_size > 0);
  return XXH3_64bits_withSeed(block_tokens, sizeof(int32_t) * static_cast<size_t>(block_size), parent_hash);
}

std::vector<uint64_t> chain_hashes(const std::vector<int32_t>& tokens, int32_t block_size) {
  TROUPE_ASSERT(block_size > 0);
  const size_t num_blocks = tokens.size() / static_cast<size_t>(block_size);
  std::vector<uint64_t> hashes;
  hashes.reserve(num_blocks);
  uint64_t parent = root_hash_seed;
  for (size_t i = 0; i < num_blocks; ++i) {
    parent = chain_hash(parent, tokens.data() + i * static_cast<size_t>(block_size), block_size);
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace troupe::kv
