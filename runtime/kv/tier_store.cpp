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
  if (config.chat_ttl_ns <= 0)
    return fail(errc::invalid_argument, "chat_ttl_ns must be > 0, got " + std::to_string(config.chat_ttl_ns));
  if (config.agent_ttl_ns <= 0)
    return fail(errc::invalid_argument, "agent_ttl_ns must be > 0, got " + std::to_string(config.agent_ttl_ns));
  return tier_store(config);
}

int64_t tier_store::ttl_ns(cache_class cls) const {
  return cls == cache_class::agent ? config_.agent_ttl_ns : config_.chat_ttl_ns;
}

void tier_store::advance_clock(int64_t now_ns) {
  TROUPE_ASSERT_MSG(now_ns >= now_ns_, "the tier's clock went backwards");
  now_ns_ = now_ns;
}

int32_t tier_store::longest_prefix(const std::vector<int32_t>& tokens, int64_t now_ns) const {
  TROUPE_ASSERT_MSG(now_ns >= now_ns_, "the tier's clock went backwards");
  const auto block_bytes = sizeof(int32_t) * static_cast<size_t>(config_.block_size);
  return longest_held_prefix(tokens, config_.block_size, [&](uint64_t hash, uint64_t parent, const int32_t* block_tokens) {
    const auto it = entries_.find(hash);
    return it != entries_.end() && it->second.expiry_ns > now_ns && it->second.block.parent_hash == parent &&
           std::memcmp(it->second.block.tokens.data(), block_tokens, block_bytes) == 0;
  });
}

void tier_store::use(uint64_t hash, entry& e, cache_class cls, int64_t now_ns) {
  recency_.erase(e.recency);
  expiries_.erase({e.expiry_ns, hash});
  file(hash, e, cls, now_ns);
}

void tier_store::file(uint64_t hash, entry& e, cache_class cls, int64_t now_ns) {
  e.cls = cls;
  e.last_use_ns = now_ns;
  e.expiry_ns = now_ns + ttl_ns(cls);
  e.recency = next_recency_++;
  recency_.emplace(e.recency, hash);
  expiries_.emplace(e.expiry_ns, hash);
}

kv_block tier_store::remove(uint64_t hash) {
  const auto it = entries_.find(hash);
  TROUPE_ASSERT(it != entries_.end());
  recency_.erase(it->second.recency);
  expiries_.erase({it->second.expiry_ns, hash});
  kv_block block = std::move(it->second.block);
  entries_.erase(it);
  return block;
}

std::vector<kv_block> tier_store::put(kv_block block, cache_class cls, int64_t now_ns) {
  TROUPE_ASSERT_MSG(static_cast<int32_t>(block.tokens.size()) == config_.block_size, "a block of another size");
  TROUPE_ASSERT_MSG(is_consistent(block), "an inconsistent block (validate it where it enters)");
  advance_clock(now_ns);
  std::vector<kv_block> evicted;
  const auto held = entries_.find(block.hash);
  if (held != entries_.end() && held->second.expiry_ns > now_ns) {
    use(block.hash, held->second, cls, now_ns);
    return evicted;
  }
  expire(now_ns);  // an expired copy of this block goes too
  while (num_blocks() >= config_.capacity_blocks) {
    evicted.push_back(remove(recency_.begin()->second));
    num_evictions_++;
  }
  const uint64_t hash = block.hash;
  entry& e = entries_[hash];
  e.block = std::move(block);
  file(hash, e, cls, now_ns);
  return evicted;
}

const kv_block* tier_store::get(uint64_t hash, int64_t now_ns) {
  advance_clock(now_ns);
  const auto it = entries_.find(hash);
  if (it == entries_.end()) return nullptr;
  if (it->second.expiry_ns <= now_ns) {
    (void)remove(hash);
    num_expirations_++;
    return nullptr;
  }
  use(hash, it->second, it->second.cls, now_ns);
  num_hits_++;
  return &it->second.block;
}

std::vector<kv_block> tier_store::get_prefix(const std::vector<int32_t>& tokens, int32_t first_block,
                                            int32_t num_blocks_max, int64_t now_ns, const lower_tier& lower) {
  TROUPE_ASSERT(first_block >= 0 && num_blocks_max >= 0);
  advance_clock(now_ns);
  const std::vector<uint64_t> hashes = chain_hashes(tokens, config_.block_size);
  const size_t end = std::min(hashes.size(), size_t(first_block) + size_t(num_blocks_max));
  std::vector<kv_block> out;
  for (size_t i = size_t(first_block); i < end; i++) {
    const uint64_t parent = i == 0 ? root_hash_seed : hashes[i - 1];
    const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(i * size_t(config_.block_size));
    std::optional<kv_block> b;
    if (const kv_block* held = get(hashes[i], now_ns)) b = *held;
    else if (lower) b = lower(hashes[i]);
    if (!b || b->parent_hash != parent || b->tokens.size() != size_t(config_.block_size) ||
        !std::equal(b->tokens.begin(), b->tokens.end(), first))
      break;
    out.push_back(std::move(*b));
  }
  return out;
}

int64_t tier_store::expire(int64_t now_ns) {
  advance_clock(now_ns);
  int64_t n = 0;
  while (!expiries_.empty() && expiries_.begin()->first <= now_ns) {
    (void)remove(expiries_.begin()->second);
    n++;
  }
  num_expirations_ += n;
  return n;
}

std::vector<uint64_t> tier_store::lru_order() const {
  std::vector<uint64_t> order;
  order.reserve(recency_.size());
  for (const auto& [recency, hash] : recency_) order.push_back(hash);
  return order;
}

void tier_store::check_invariants() const {
  TROUPE_ASSERT_MSG(num_blocks() <= config_.capacity_blocks, "the tier is over capacity");
  TROUPE_ASSERT(recency_.size() == entries_.size());
  TROUPE_ASSERT(expiries_.size() == entries_.size());
  for (const auto& [hash, e] : entries_) {
    TROUPE_ASSERT_MSG(e.block.hash == hash, "a block is filed under another hash");
    TROUPE_ASSERT(static_cast<int32_t>(e.block.tokens.size()) == config_.block_size);
    TROUPE_ASSERT_MSG(is_consistent(e.block), "a held block is inconsistent");
    TROUPE_ASSERT_MSG(e.expiry_ns == e.last_use_ns + ttl_ns(e.cls), "an expiry is not last use + TTL");
    TROUPE_ASSERT(e.last_use_ns <= now_ns_);
    TROUPE_ASSERT(e.recency < next_recency_);
    const auto r = recency_.find(e.recency);
    TROUPE_ASSERT_MSG(r != recency_.end() && r->second == hash, "the recency order lost a block");
    TROUPE_ASSERT_MSG(expiries_.count({e.expiry_ns, hash}) == 1, "the expiry order lost a block");
  }
  TROUPE_ASSERT(num_hits_ >= 0 && num_evictions_ >= 0 && num_expirations_ >= 0);
}

}  // namespace troupe::kv
