#pragma once

/// The simulator's model of a device below the host tier (`[disk_tier]`, docs/simulation.md):
/// a kv::lower_tier holding up to `capacity_blocks` blocks in memory, refusing more when full
/// as the disk tier does (tiers/disk_tier.hpp). What reading from it costs is modelled by the
/// host tier actor's `lower_read_cost` (latency + bytes / bandwidth on virtual time), not here.

#include <cstdint>
#include <map>
#include <optional>

#include "runtime/kv/lower_tier.hpp"

namespace troupe::sim {

class modelled_tier final : public kv::lower_tier {
 public:
  modelled_tier(int32_t block_size, int64_t capacity_blocks);

  [[nodiscard]] int32_t block_size() const override { return block_size_; }
  [[nodiscard]] expected<void> put(const kv::kv_block& block) override;
  [[nodiscard]] std::optional<kv::kv_block> get(uint64_t hash) override;
  [[nodiscard]] int64_t num_blocks() const override { return static_cast<int64_t>(blocks_.size()); }

 private:
  int32_t block_size_;
  int64_t capacity_blocks_;
  std::map<uint64_t, kv::kv_block> blocks_;  // by chain hash
};

}  // namespace troupe::sim
