#include "sim/modelled_tier.hpp"

#include "runtime/common/error.hpp"

namespace troupe::sim {

modelled_tier::modelled_tier(int32_t block_size, int64_t capacity_blocks)
    : block_size_(block_size), capacity_blocks_(capacity_blocks), lives_(7 * kv::day_ns, 3 * kv::day_ns) {
  TROUPE_ASSERT(block_size > 0 && capacity_blocks > 0);
}

expected<int64_t> modelled_tier::put(const kv::kv_block& block, kv::cache_class cls, int64_t now_ns) {
  TROUPE_ASSERT(static_cast<int32_t>(block.tokens.size()) == block_size_);
  lives_.advance_clock(now_ns);
  if (lives_.is_alive(block.hash, now_ns)) {
    lives_.use(block.hash, cls, now_ns);
    return 0;
  }
  (void)expire(now_ns);  // an expired copy of this block goes too
  int64_t n = 0;
  for (; num_blocks() >= capacity_blocks_; n++) {
    const std::optional<uint64_t> lru = lives_.least_recent();
    TROUPE_ASSERT(lru.has_value());
    remove(*lru);
  }
  num_evictions_ += n;
  blocks_.emplace(block.hash, block);
  lives_.use(block.hash, cls, now_ns);
  return n;
}

std::optional<kv::kv_block> modelled_tier::get(uint64_t hash, int64_t now_ns) {
  lives_.advance_clock(now_ns);
  const auto it = blocks_.find(hash);
  if (it == blocks_.end()) return std::nullopt;
  if (!lives_.is_alive(hash, now_ns)) {
    remove(hash);
    num_expirations_++;
    return std::nullopt;
  }
  lives_.use(hash, lives_.class_of(hash), now_ns);
  return it->second;
}

int64_t modelled_tier::expire(int64_t now_ns) {
  lives_.advance_clock(now_ns);
  int64_t n = 0;
  for (auto hash = lives_.first_expired(now_ns); hash; hash = lives_.first_expired(now_ns), n++) remove(*hash);
  num_expirations_ += n;
  return n;
}

void modelled_tier::remove(uint64_t hash) {
  TROUPE_ASSERT(blocks_.erase(hash) == 1);
  lives_.remove(hash);
}

void modelled_tier::check_invariants() const {
  lives_.check_invariants();
  TROUPE_ASSERT(num_blocks() <= capacity_blocks_);
  TROUPE_ASSERT(lives_.size() == num_blocks());
  for (const auto& [hash, block] : blocks_) TROUPE_ASSERT(lives_.contains(hash) && block.hash == hash);
}

}  // namespace troupe::sim
