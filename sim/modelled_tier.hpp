#pragma once

/// The simulator's model of a device below the host tier (`[disk_tier]`, docs/simulation.md):
/// a kv::lower_tier holding up to `capacity_blocks` blocks in memory. Unlike the disk tier
/// (tiers/disk_tier.hpp, which evicts by LRU and TTL), it keeps what it holds for the whole
/// run and refuses more when full: classes and times are taken and ignored, and the capacity
/// sweeps of docs/simulation.md measure that device. What reading from it costs is modelled
/// by the host tier actor's `lower_read_cost` (latency + bytes / bandwidth on virtual time).

#include <cstdint>
#include <map>
#include <optional>

#include "runtime/kv/lower_tier.hpp"

namespace troupe::sim {

class modelled_tier final : public kv::lower_tier {
 public:
  modelled_tier(int32_t block_size, int64_t capacity_blocks);

  [[nodiscard]] int32_t block_size() const override { return block_size_; }
  /// Keeps `block` (never evicts: 0); overloaded when full.
  [[nodiscard]] expected<int64_t> put(const kv::kv_block& block, kv::cache_class cls, int64_t now_ns) override;
  [[nodiscard]] std::optional<kv::kv_block> get(uint64_t hash, int64_t now_ns) override;
  [[nodiscard]] int64_t num_blocks() const override { return static_cast<int64_t>(blocks_.size()); }
  /// Blocks never expire here.
  int64_t expire(int64_t /*now_ns*/) override { return 0; }
  [[nodiscard]] int64_t num_expirations() const override { return 0; }

 private:
  int32_t block_size_;
  int64_t capacity_blocks_;
  std::map<uint64_t, kv::kv_block> blocks_;  // by chain hash
};

}  // namespace troupe::sim
