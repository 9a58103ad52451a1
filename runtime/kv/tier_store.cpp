#include "runtime/kv/tier_store.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/kv/chain_hash.hpp"

namespace troupe::kv {

expected<tier_store> tier_store::create(const tier_config& config) {
  if (config.block_size <= 0)
    return fail(errc::invalid_argument, "block_size must be > 0, got " + std::to_string(config.block_size));
  if (config.capacity_blocks <= 0)
    return fail(errc::invalid_argument, "capacity_blocks must be > 0, got " + std::to_string(config.capacity_blocks));
  if (auto ok = lru_ttl::check_ttls(config.chat_ttl_ns, config.agent_ttl_ns); !ok) return tl::unexpected(ok.error());
  return tier_store(config);
}

int32_t tier_store::longest_prefix(const std::vector<int32_t>& tokens, int64_t now_ns) const {
  TROUPE_ASSERT_MSG(now_ns >= lives_.now_ns(), "the tier's clock went backwards");
  const auto block_bytes = sizeof(int32_t) * static_cast<size_t>(config_.block_size);
  return longest_held_prefix(tokens, config_.block_size, [&](uint64_t hash, uint64_t parent, const int32_t* block_tokens) {
    const auto it = blocks_.find(hash);
    return it != blocks_.end() && lives_.is_alive(hash, now_ns) && it->second.parent_hash == parent &&
           std::memcmp(it->second.tokens.data(), block_tokens, block_bytes) == 0;
  });
}

kv_block tier_store::remove(uint64_t hash) {
  const auto it = blocks_.find(hash);
  TROUPE_ASSERT(it != blocks_.end());
  lives_.remove(hash);
  kv_block block = std::move(it->second);
  blocks_.erase(it);
  return block;
}

std::vector<evicted_tier_block> tier_store::put(kv_block block, cache_class cls, int64_t now_ns) {
  TROUPE_ASSERT_MSG(static_cast<int32_t>(block.tokens.size()) == config_.block_size, "a block of another size");
  TROUPE_ASSERT_MSG(is_consistent(block), "an inconsistent block (validate it where it enters)");
  lives_.advance_clock(now_ns);
  std::vector<evicted_tier_block> evicted;
  if (lives_.is_alive(block.hash, now_ns)) {
    lives_.use(block.hash, cls, now_ns);
    // A sliding-window model's block with its window rows replaces the copy without them.
    kv_block& held = blocks_.at(block.hash);
    if (block.num_layers > held.num_layers) held = std::move(block);
    return evicted;
  }
  expire(now_ns);  // an expired copy of this block goes too
  while (num_blocks() >= config_.capacity_blocks) {
    const uint64_t lru = *lives_.least_recent();
    const cache_class lru_cls = lives_.class_of(lru);
    evicted.push_back({remove(lru), lru_cls});
    num_evictions_++;
  }
  const uint64_t hash = block.hash;
  blocks_.emplace(hash, std::move(block));
  lives_.use(hash, cls, now_ns);
  return evicted;
}

const kv_block* tier_store::get(uint64_t hash, int64_t now_ns) {
  lives_.advance_clock(now_ns);
  const auto it = blocks_.find(hash);
  if (it == blocks_.end()) return nullptr;
  if (!lives_.is_alive(hash, now_ns)) {
    (void)remove(hash);
    num_expirations_++;
    return nullptr;
  }
  lives_.use(hash, lives_.class_of(hash), now_ns);
  num_hits_++;
  return &it->second;
}

std::vector<kv_block> tier_store::get_prefix(const std::vector<int32_t>& tokens, int32_t first_block,
                                            int32_t num_blocks_max, int64_t now_ns, const lower_tier& lower) {
  TROUPE_ASSERT(first_block >= 0 && num_blocks_max >= 0);
  lives_.advance_clock(now_ns);
  const std::vector<uint64_t> hashes = chain_hashes(tokens, config_.block_size);
  const size_t end = std::min(hashes.size(), size_t(first_block) + size_t(num_blocks_max));
  std::vector<kv_block> out;
  for (size_t i = size_t(first_block); i < end; i++) {
    const uint64_t parent = i == 0 ? root_hash_seed : hashes[i - 1];
    const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(i * size_t(config_.block_size));
    std::optional<kv_block> b;
    if (const kv_block* held = get(hashes[i], now_ns)) b = *held;
    else if (lower) b = lower(hashes[i], now_ns);
    if (!b || b->parent_hash != parent || b->tokens.size() != size_t(config_.block_size) ||
        !std::equal(b->tokens.begin(), b->tokens.end(), first))
      break;
    out.push_back(std::move(*b));
  }
  return out;
}

int64_t tier_store::expire(int64_t now_ns) {
  lives_.advance_clock(now_ns);
  int64_t n = 0;
  for (auto hash = lives_.first_expired(now_ns); hash; hash = lives_.first_expired(now_ns)) {
    (void)remove(*hash);
    n++;
  }
  num_expirations_ += n;
  return n;
}

void tier_store::check_invariants() const {
  TROUPE_ASSERT_MSG(num_blocks() <= config_.capacity_blocks, "the tier is over capacity");
  lives_.check_invariants();
  TROUPE_ASSERT(lives_.size() == num_blocks());
  for (const auto& [hash, block] : blocks_) {
    TROUPE_ASSERT_MSG(block.hash == hash, "a block is filed under another hash");
    TROUPE_ASSERT_MSG(lives_.contains(hash), "a held block has no lifetime");
    TROUPE_ASSERT(static_cast<int32_t>(block.tokens.size()) == config_.block_size);
    TROUPE_ASSERT_MSG(is_consistent(block), "a held block is inconsistent");
  }
  TROUPE_ASSERT(num_hits_ >= 0 && num_evictions_ >= 0 && num_expirations_ >= 0);
}

}  // namespace troupe::kv
