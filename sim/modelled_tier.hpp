#pragma once

/// The simulator's model of a device below the host tier (`[disk_tier]`, docs/simulation.md):
/// a kv::lower_tier holding up to `capacity_blocks` blocks in memory, evicting as the disk tier
/// does (actors/edge/disk_tier.hpp): least recently used first, and by TTL per traffic class on the
/// caller's clock (kv::lru_ttl, with the disk tier's default lifetimes: 7 days chat, 3 agent).
/// It sits behind the production disk tier actor (actors/disk_tier_actor.hpp), whose
/// `lower_read_cost` models what reading from it costs (latency + bytes / bandwidth on virtual
/// time).

#include <cstdint>
#include <map>
#include <optional>

#include "runtime/kv/lower_tier.hpp"
#include "runtime/kv/lru_ttl.hpp"

namespace troupe::sim {

class modelled_tier final : public kv::lower_tier {
 public:
  modelled_tier(int32_t block_size, int64_t capacity_blocks);

  [[nodiscard]] int32_t block_size() const override { return block_size_; }
  /// Keeps `block` as the most recent use with class `cls`; returns how many blocks it evicted
  /// (expired ones first, then the least recently used) to make room.
  [[nodiscard]] expected<int64_t> put(const kv::kv_block& block, kv::cache_class cls, int64_t now_ns) override;
  /// The block, if held and alive at `now_ns` (then it is the most recent use, keeping its class).
  [[nodiscard]] std::optional<kv::kv_block> get(uint64_t hash, int64_t now_ns) override;
  [[nodiscard]] int64_t num_blocks() const override { return static_cast<int64_t>(blocks_.size()); }
  int64_t expire(int64_t now_ns) override;
  [[nodiscard]] int64_t num_expirations() const override { return num_expirations_; }
  [[nodiscard]] kv::cache_events take_events() override { return lives_.take_events(); }
  [[nodiscard]] std::vector<uint64_t> hashes() const override { return lives_.hashes(); }
  [[nodiscard]] int64_t num_evictions() const { return num_evictions_; }

  /// Aborts unless the blocks and their lifetimes agree and the capacity holds.
  void check_invariants() const;

 private:
  void remove(uint64_t hash);

  int32_t block_size_;
  int64_t capacity_blocks_;
  std::map<uint64_t, kv::kv_block> blocks_;  // by chain hash
  kv::lru_ttl lives_;
  int64_t num_expirations_ = 0;
  int64_t num_evictions_ = 0;
};

}  // namespace troupe::sim
