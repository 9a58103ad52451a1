#pragma once

/// The disk tier protocol (issue 14; actors/disk_tier_actor.hpp): the host tier writes the
/// blocks it evicts to the tier below it, reads back the blocks it lacks, and asks for its
/// counters. Blocks travel whole (kv::kv_block, serialized as in messages/cache_tier.hpp); the
/// disk tier actor validates each block and class where it enters, since they may come from
/// another process.

#include <cstdint>
#include <vector>

#include "messages/cache_tier.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/kv_block.hpp"

namespace troupe::msg {

/// -> disk tier: keep `block`, used now with traffic class `cls` (the class of its last use in
/// the tier above). Answered with a disk_stored, or an invalid_argument error naming what is
/// wrong with the block or the class.
struct disk_put {
  kv::kv_block block;
  kv::cache_class cls = kv::cache_class::chat;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, disk_put& x) {
  return f(x.block, x.cls);
}

/// disk tier -> asker: whether it kept the block, and how many blocks it evicted to make room.
/// Not stored: it cannot hold the block (bigger than the whole tier) or writing it failed; the
/// block is dropped.
struct disk_stored {
  bool stored = false;
  int64_t num_evicted = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, disk_stored& x) {
  return f(x.stored, x.num_evicted);
}

/// -> disk tier: the blocks named `hashes` (chain hashes, in chain order: the blocks the tier
/// above lacks of a prefix). Answered with a disk_blocks holding the leading run of them it has
/// alive, stopping at the first it lacks; each one read is a use. With `budget_ns` > 0 (at most
/// msg::tier_fetch_budget_max_ns) it stops reading once the reads would end after that long
/// (the simulator's modelled reads) or have taken that long (a device's): the answer is what
/// arrived within the budget.
struct disk_fetch {
  std::vector<uint64_t> hashes;
  int64_t budget_ns = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, disk_fetch& x) {
  return f(x.hashes, x.budget_ns);
}

/// disk tier -> asker: the blocks a disk_fetch found, in its order (none: the first was missing).
struct disk_blocks {
  std::vector<kv::kv_block> blocks;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, disk_blocks& x) {
  return f(x.blocks);
}

/// disk tier -> asker (stats_atom): its counters, after dropping what has expired.
struct disk_report {
  int64_t num_blocks = 0;
  int64_t num_stored = 0;       ///< blocks it kept (disk_put answered stored)
  int64_t num_refused = 0;      ///< blocks it could not keep (too big for it, or an I/O error)
  int64_t num_hits = 0;         ///< blocks disk_fetch read back
  int64_t num_expirations = 0;  ///< blocks dropped because their class's TTL passed
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, disk_report& x) {
  return f(x.num_blocks, x.num_stored, x.num_refused, x.num_hits, x.num_expirations);
}

}  // namespace troupe::msg
