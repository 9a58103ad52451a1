#pragma once

/// The load balancer's prefix directory: which prompt prefixes each engine's KV pool holds, so a
/// router can weigh cache affinity against load (router.hpp, `prefix_affinity`).
///
/// Blocks are named by the block-hash chain every pool uses (runtime/kv/chain_hash.hpp): equal
/// chain hashes mean equal prefixes, so "engine e holds the first n blocks of this prompt" is
/// "e's set holds the prompt's first n chain hashes".
///
/// Each engine's set has two parts:
/// - the pool's own: the cached chain hashes its block manager reported (kv::block_manager's
///   cache events, carried by the engine's load reports: `apply`). A snapshot replaces it; a
///   change applies only to the report before it. A gap in the reports' numbers, or a change
///   that does not fit (it removes a hash the set lacks, adds one it holds, or outgrows the
///   capacity), drops it: the engine is out of sync and is asked for a snapshot once
///   (pool_sync::ask_snapshot) until one arrives.
/// - the prompts the balancer placed there (`record`), each with the engine's number of its
///   placement (its n-th received work item), bounded by the pool's capacity in blocks, least
///   recently used evicted first (a prompt touches its blocks last to first, so its tail goes
///   before its prefix). While the engine is in sync, a placed prompt counts only until a report
///   that covers its placement (`covered`): from then on the pool speaks for it. So a burst of
///   requests with one prefix still goes together between two reports. While it is not in sync
///   (no report yet, an engine whose block size differs from the directory's, or sync lost),
///   placed prompts stay until evicted: the approximation the directory falls back to, which
///   misses the pool's own evictions and the prompts it refused.
///
/// A lost engine's set is dropped whole (`forget`).
///
/// Cache tiers (a node's host-memory tier: actors/cache_tier_actor) have two sets each, of the
/// reported part only (a tier is never placed on): the host tier's own hashes and its lower
/// (disk) tier's, each kept current by its reports by the same rules (`apply_tier`: snapshot,
/// numbered changes, sync lost on a gap or a change that does not fit, a snapshot asked for
/// once). A fetch from a host tier reads through to its disk tier, so a tier's prefix is the
/// leading run of hashes in either set. Any engine can fetch from any tier, so a tier's prefix
/// is what every engine could start from (balancer_policy.hpp).
///
/// Deterministic: the hash containers are only looked up, never iterated into a decision;
/// eviction order is the list's.

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace troupe::balance {

/// An engine pool's cached chain hashes as its load report tells them (msg::load_report).
struct pool_events {
  uint64_t seq = 0;  ///< the report's number in the engine's stream (1, 2, ...); 0: none
  bool snapshot = false;  ///< `added` is every hash the pool holds; else the change since seq - 1
  std::vector<uint64_t> added;
  std::vector<uint64_t> removed;
};

/// What `apply` made of a pool's report.
enum class pool_sync {
  in_sync,            ///< applied
  ask_snapshot,       ///< sync lost now (or the report came unasked while out of sync): ask for a snapshot
  awaiting_snapshot,  ///< out of sync, a snapshot asked for already
};

class prefix_directory {
 public:
  /// One set per engine; engine i holds at most `capacity_blocks[i]` (>= 0) blocks; likewise
  /// two per cache tier (its host level and its lower level; none given: 0).
  explicit prefix_directory(std::vector<int64_t> capacity_blocks, std::vector<int64_t> tier_capacity_blocks = {},
                            std::vector<int64_t> lower_capacity_blocks = {});

  /// How many leading blocks of `chain` (a prompt's chain hashes, in order) engine `engine`
  /// holds, by its pool's report or a placed prompt: the first missing hash ends the prefix.
  [[nodiscard]] int64_t cached_blocks(size_t engine, const std::vector<uint64_t>& chain) const;
  /// Engine `engine` was given `chain` as its work item `work_item` (no lower than the last
  /// recorded there): its blocks are the most recently placed, the least recently placed
  /// beyond the capacity are dropped.
  void record(size_t engine, const std::vector<uint64_t>& chain, int64_t work_item);
  /// A report from engine `engine` that has received `num_received` work items: while the
  /// engine is in sync, the placed prompts among them no longer count.
  void covered(size_t engine, int64_t num_received);
  /// Engine `engine`'s pool reported `events` (seq > 0; counts within the capacity: checked by
  /// the caller, where they enter).
  [[nodiscard]] pool_sync apply(size_t engine, const pool_events& events);
  /// Engine `engine` holds nothing (it is lost), and is not in sync.
  void forget(size_t engine);

  /// How many leading blocks of `chain` cache tier `tier` holds in either level, by its reports.
  [[nodiscard]] int64_t tier_cached_blocks(size_t tier, const std::vector<uint64_t>& chain) const;
  /// Cache tier `tier` reported `events` of its host level, or of its lower level (as `apply`).
  [[nodiscard]] pool_sync apply_tier(size_t tier, const pool_events& events, bool lower = false);
  /// Cache tier `tier` holds nothing at either level (it is lost), and is not in sync.
  void forget_tier(size_t tier);

  [[nodiscard]] size_t num_engines() const { return engines_.size(); }
  [[nodiscard]] size_t num_tiers() const { return tiers_.size(); }
  [[nodiscard]] int64_t tier_capacity_blocks(size_t tier, bool lower = false) const {
    return level(tier, lower).capacity_blocks;
  }
  [[nodiscard]] bool tier_in_sync(size_t tier, bool lower = false) const { return level(tier, lower).in_sync; }
  [[nodiscard]] int64_t num_tier_blocks(size_t tier, bool lower = false) const {
    return static_cast<int64_t>(level(tier, lower).pool.size());
  }
  [[nodiscard]] int64_t capacity_blocks(size_t engine) const { return engines_.at(engine).capacity_blocks; }
  [[nodiscard]] bool in_sync(size_t engine) const { return engines_.at(engine).in_sync; }
  /// Blocks of the placed prompts that still count.
  [[nodiscard]] int64_t num_placed_blocks(size_t engine) const;
  /// Blocks the pool reported.
  [[nodiscard]] int64_t num_pool_blocks(size_t engine) const;
  /// Engine `engine`'s placed blocks, most recently placed first (tests).
  [[nodiscard]] std::vector<uint64_t> blocks_by_recency(size_t engine) const;
  void check_invariants() const;

 private:
  struct placed_block {
    uint64_t hash = 0;
    int64_t work_item = 0;  // the engine's number of the latest placement that holds it
  };
  struct engine_set {
    int64_t capacity_blocks = 0;
    std::list<placed_block> by_recency;  // front = most recently placed (highest work item)
    std::unordered_map<uint64_t, std::list<placed_block>::iterator> where;  // hash -> its place in by_recency
    std::unordered_set<uint64_t> pool;  // the pool's reported hashes; empty unless in_sync
    bool in_sync = false;
    bool snapshot_asked = false;  // out of sync, a snapshot asked for
    uint64_t seq = 0;             // the last applied report's, while in_sync
  };

  /// Drops the pool's part; the caller is to ask for a snapshot unless one was asked already.
  static pool_sync lose_sync(engine_set& e);
  static int64_t held_prefix(const engine_set& e, const std::vector<uint64_t>& chain);
  static pool_sync apply_to(engine_set& e, const pool_events& events);
  static void clear(engine_set& e);
  static void check_set(const engine_set& e);
  [[nodiscard]] const engine_set& level(size_t tier, bool lower) const {
    return lower ? lower_tiers_.at(tier) : tiers_.at(tier);
  }
  static void drop_oldest_placed(engine_set& e);

  std::vector<engine_set> engines_;
  std::vector<engine_set> tiers_;        // the pool part only: nothing is placed on a tier
  std::vector<engine_set> lower_tiers_;  // their lower levels, likewise
};

}  // namespace troupe::balance
