#pragma once

/// The block-hash chain that names cached KV blocks everywhere (the engine's pool, the tiers):
/// full block i of a token list hashes to
/// `XXH3_64bits_withSeed(tokens of block i as int32 bytes, seed = hash of block i-1)`, with
/// `root_hash_seed` for block 0. Equal chain hashes mean (up to a 64-bit collision) equal
/// prefixes, so a returning prompt finds its cached blocks by hashing its own.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::kv {

/// Seed of the chain hash of a sequence's first block ("troupe" in ASCII).
inline constexpr uint64_t root_hash_seed = 0x74726f757065ULL;

/// The chain hash of one block of `block_size` tokens whose predecessor hashed to `parent_hash`.
[[nodiscard]] uint64_t chain_hash(uint64_t parent_hash, const int32_t* block_tokens, int32_t block_size);

/// The chain hashes of every full block of `tokens`, in order (a partial last block has none).
[[nodiscard]] std::vector<uint64_t> chain_hashes(const std::vector<int32_t>& tokens, int32_t block_size);

/// How many leading full blocks of `tokens` a store holds, walking the chain until
/// `holds(hash, parent_hash, block_tokens)` (whether the store has a live block of that hash
/// whose own parent hash and tokens are those: comparing them keeps a single 64-bit collision
/// from producing a wrong hit) is false.
template <class Holds>
[[nodiscard]] int32_t longest_held_prefix(const std::vector<int32_t>& tokens, int32_t block_size, Holds&& holds) {
  const size_t num_blocks = tokens.size() / static_cast<size_t>(block_size);
  uint64_t parent = root_hash_seed;
  int32_t found = 0;
  for (size_t i = 0; i < num_blocks; ++i) {
    const int32_t* block_tokens = tokens.data() + i * static_cast<size_t>(block_size);
    const uint64_t hash = chain_hash(parent, block_tokens, block_size);
    if (!holds(hash, parent, block_tokens)) break;
    found++;
    parent = hash;
  }
  return found;
}

}  // namespace troupe::kv
