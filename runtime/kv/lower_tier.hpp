#pragma once

/// A tier below the host tier (docs/kv-tiers.md): the blocks the host tier evicts go down to
/// it, and a fetch reads from it the blocks the host tier lacks. The disk tier
/// (actors/edge/disk_tier.hpp) is one; the simulator models a device with another
/// (sim/modelled_tier.hpp). Time comes from the caller (`now_ns`, never backwards): the disk
/// tier actor that owns it (actors/disk_tier_actor.hpp) passes its clock's. What a full tier does is the implementation's: the disk tier
/// evicts (LRU, TTL by class), the modelled device refuses.

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/cache_event_log.hpp"
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
  /// Keeps `block` (consistent, of block_size tokens), used at `now_ns` with class `cls`; a
  /// block already held is only used again. Returns how many blocks it evicted to make room.
  /// Errors: overloaded when the block cannot be kept (nothing changes), io_error.
  [[nodiscard]] virtual expected<int64_t> put(const kv_block& block, cache_class cls, int64_t now_ns) = 0;
  /// The block named `hash` if held (alive) at `now_ns`, or nullopt.
  [[nodiscard]] virtual std::optional<kv_block> get(uint64_t hash, int64_t now_ns) = 0;
  [[nodiscard]] virtual int64_t num_blocks() const = 0;
  /// Drops every block expired at `now_ns`; returns how many.
  virtual int64_t expire(int64_t now_ns) = 0;
  /// Blocks dropped so far because their class's TTL passed.
  [[nodiscard]] virtual int64_t num_expirations() const = 0;
  /// The hashes it started and stopped holding since the last take (kv::lru_ttl's log), and all
  /// it holds, ascending: what its host tier reports to the balancer's prefix directory.
  [[nodiscard]] virtual cache_events take_events() = 0;
  [[nodiscard]] virtual std::vector<uint64_t> hashes() const = 0;
};

}  // namespace troupe::kv
