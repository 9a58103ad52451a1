#include "sim/modelled_tier.hpp"

#include <string>

#include "runtime/common/error.hpp"

namespace troupe::sim {

modelled_tier::modelled_tier(int32_t block_size, int64_t capacity_blocks)
    : block_size_(block_size), capacity_blocks_(capacity_blocks) {
  TROUPE_ASSERT(block_size > 0 && capacity_blocks > 0);
}

expected<int64_t> modelled_tier::put(const kv::kv_block& block, kv::cache_class /*cls*/, int64_t /*now_ns*/) {
  TROUPE_ASSERT(static_cast<int32_t>(block.tokens.size()) == block_size_);
  if (blocks_.count(block.hash) != 0) return 0;
  if (num_blocks() >= capacity_blocks_)
    return fail(errc::overloaded, "the modelled disk tier is full (" + std::to_string(capacity_blocks_) + " blocks)");
  blocks_.emplace(block.hash, block);
  return 0;
}

std::optional<kv::kv_block> modelled_tier::get(uint64_t hash, int64_t /*now_ns*/) {
  const auto it = blocks_.find(hash);
  if (it == blocks_.end()) return std::nullopt;
  return it->second;
}

}  // namespace troupe::sim
