#pragma once

/// A tier below the host tier (docs/kv-tiers.md): the blocks the host tier evicts go down to
/// it, and a fetch reads from it the blocks the host tier lacks. The disk tier
/// (tiers/disk_tier.hpp) is one; the simulator models a device with another
/// (sim/modelled_tier.hpp). Like the disk tier, a full lower tier refuses new blocks.

#include <cstdint>
#include <optional>

#include "runtime/common/error.hpp"
#include "runtime/kv/kv_block.hpp"

namespace troupe::kv {

class lower_tier {
 public:
  lower_tier() = default;
  lower_tier(const lower_tier&) = default;
  lower_tier(lower_tier&&) = default;
  lower_tier& operator=(const lower_tier&) = default;
  lower_tier& operator=(lower_tier&&) = default;
  virtual ~lower_tier() = default;

  /// Tokens per block: blocks of another size are not this tier's.
  [[nodiscard]] virtual int32_t block_size() const = 0;
  /// Keeps `block` (consistent, of block_size tokens). Already held: nothing to do. Errors:
  /// overloaded when the tier is full (nothing changes), io_error.
  [[nodiscard]] virtual expected<void> put(const kv_block& block) = 0;
  /// The block named `hash`, or nullopt.
  [[nodiscard]] virtual std::optional<kv_block> get(uint64_t hash) = 0;
  [[nodiscard]] virtual int64_t num_blocks() const = 0;
};

}  // namespace troupe::kv
