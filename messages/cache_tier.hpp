#pragma once

/// The cache tier protocol (issue 14): ask a tier for the longest prefix it holds, store a
/// block in it, read one back. Blocks travel whole (kv::kv_block); a tier validates each block
/// and traffic class where it enters (kv::validate), since they may come from another process.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/kv_block.hpp"

namespace troupe::kv {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_block& x) {
  return f(x.hash, x.parent_hash, x.tokens, x.num_layers, x.kv_dim, x.keys, x.values, x.dtype);
}

}  // namespace troupe::kv

namespace troupe::msg {

/// -> tier: how many leading full blocks of `tokens` do you hold alive? Answered with the count
/// (an int32_t). Not a use of the blocks.
struct tier_lookup {
  std::vector<int32_t> tokens;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_lookup& x) {
  return f(x.tokens);
}

/// -> tier: keep `block` for traffic class `cls`. Answered with how many blocks it evicted to
/// make room (an int64_t), or an error naming what is wrong with the block.
struct tier_put {
  kv::kv_block block;
  kv::cache_class cls = kv::cache_class::chat;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_put& x) {
  return f(x.block, x.cls);
}

/// -> tier: the block named `hash`. Answered with a tier_got; a hit is a use of the block.
struct tier_get {
  uint64_t hash = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_get& x) {
  return f(x.hash);
}

/// tier -> asker: the block asked for, if the tier holds it alive.
struct tier_got {
  bool found = false;
  kv::kv_block block;  ///< empty unless found
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_got& x) {
  return f(x.found, x.block);
}

/// -> tier: copies of the leading full blocks of `tokens` from block `first_block` on that the
/// tier holds alive, at most `num_blocks_max` (kv::tier_store::get_prefix); each one sent is a
/// use. Answered with a tier_blocks, or an error if a count is negative or `budget_ns` is out
/// of 0..tier_fetch_budget_max_ns.
///
/// `budget_ns` (issue 54): how long the fetch may take and still pay — the asker's estimate of
/// when it would have the blocks by recomputing them (engine_core::plan_fetch). Blocks the tier
/// must read from below are read only while the reads fit in it: what has arrived by then is
/// the answer, the rest is recomputed. 0: no budget (the tier waits its own bound for below).
struct tier_fetch {
  std::vector<int32_t> tokens;
  int32_t first_block = 0;
  int32_t num_blocks_max = 0;
  int64_t budget_ns = 0;
};

/// The largest tier_fetch::budget_ns (and disk_fetch::budget_ns) accepted: 60 s.
inline constexpr int64_t tier_fetch_budget_max_ns = 60'000'000'000;

/// Why `what` (a message's name) refuses `budget_ns`: "" when it is in 0..tier_fetch_budget_max_ns.
inline std::string budget_refusal(const char* what, int64_t budget_ns) {
  if (budget_ns >= 0 && budget_ns <= tier_fetch_budget_max_ns) return {};
  return std::string(what) + ": budget_ns " + std::to_string(budget_ns) + " is outside 0.." +
         std::to_string(tier_fetch_budget_max_ns);
}

/// The deadlines a budget `b` (> 0) sets, with margins for the messages' way: the tier waits
/// for the tier below at most lower_wait_ns(b), and the asker for the tier at most
/// fetch_wait_ns(b), so that the tier's answer — with what arrived — reaches the asker first.
inline constexpr int64_t lower_wait_ns(int64_t b) { return b + b / 4 + 10'000'000; }
inline constexpr int64_t fetch_wait_ns(int64_t b) { return b + b / 2 + 20'000'000; }

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_fetch& x) {
  return f(x.tokens, x.first_block, x.num_blocks_max, x.budget_ns);
}

/// tier -> asker: the blocks a tier_fetch found, in chain order (none: a miss).
struct tier_blocks {
  std::vector<kv::kv_block> blocks;
  /// Per block, 1 if the tier read it from the tier below (the disk tier); empty: none.
  std::vector<uint8_t> from_lower;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_blocks& x) {
  return f(x.blocks, x.from_lower);
}

/// tier -> asker (stats_atom): the tier's counters, after dropping what has expired.
struct tier_report {
  int64_t num_blocks = 0;
  int64_t capacity_blocks = 0;
  int64_t num_hits = 0;         ///< blocks read back (tier_get, tier_fetch)
  int64_t num_evictions = 0;    ///< blocks dropped for room (LRU)
  int64_t num_expirations = 0;  ///< blocks dropped because their class's TTL passed
  // The disk tier below it (0 without one):
  int64_t num_disk_blocks = 0;
  int64_t num_disk_puts = 0;     ///< evicted blocks written to it
  int64_t num_disk_refused = 0;  ///< evicted blocks it refused (full, or an I/O error): dropped
  int64_t num_disk_hits = 0;     ///< blocks a fetch read back from it
  int64_t num_disk_expirations = 0;  ///< blocks it dropped because their class's TTL passed
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_report& x) {
  return f(x.num_blocks, x.capacity_blocks, x.num_hits, x.num_evictions, x.num_expirations, x.num_disk_blocks,
           x.num_disk_puts, x.num_disk_refused, x.num_disk_hits, x.num_disk_expirations);
}

/// tier -> balancer (msg::tier_report_to): the chain hashes the tier holds, all of them
/// (`snapshot`) or the change since report `seq` - 1 (kv::tier_store::take_events), for the
/// prefix directory (runtime/balance/prefix_directory.hpp). `tier_index` is the balancer's
/// number of the tier. `lower`: the hashes of the disk tier below it (a stream of its own,
/// numbered apart), relayed by the host tier.
struct tier_events {
  int32_t tier_index = 0;
  uint64_t seq = 0;  ///< 1, 2, ...
  bool snapshot = false;
  std::vector<uint64_t> added;
  std::vector<uint64_t> removed;
  bool lower = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_events& x) {
  return f(x.tier_index, x.seq, x.snapshot, x.added, x.removed, x.lower);
}

}  // namespace troupe::msg
