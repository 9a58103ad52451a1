#pragma once

/// The load balancer's prefix directory: which prompt prefixes each engine's KV pool is believed
/// to hold, so a router can weigh cache affinity against load (router.hpp, `prefix_affinity`).
///
/// Blocks are named by the block-hash chain every pool uses (runtime/kv/chain_hash.hpp): equal
/// chain hashes mean equal prefixes, so "engine e holds the first n blocks of this prompt" is
/// "e's set holds the prompt's first n chain hashes".
///
/// What it records is approximate, by design: the prompts the balancer placed on each engine
/// (`record`), not the engine's pool itself. Each engine's set is bounded by its pool's
/// capacity in blocks and evicts least recently used first. A recorded prompt touches its
/// blocks from the last to the first, so within one prompt the tail is older than its prefix
/// and goes first — as an engine's pool frees a finished sequence's blocks tail first, and as
/// SGLang's cache-aware router evicts its radix tree's leaves. What it misses: a pool's own
/// evictions under pressure (preemption, other prompts' blocks), a prompt the engine refused,
/// and the hit rule (the engine computes at least the prompt's last token). A lost engine's
/// set is dropped (`forget`).
///
/// Deterministic: the hash map is only looked up, never iterated; eviction order is the list's.

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace troupe::balance {

class prefix_directory {
 public:
  /// One set per engine; engine i holds at most `capacity_blocks[i]` (>= 0) blocks.
  explicit prefix_directory(std::vector<int64_t> capacity_blocks);

  /// How many leading blocks of `chain` (a prompt's chain hashes, in order) engine `engine`
  /// holds: the first missing hash ends the prefix.
  [[nodiscard]] int64_t cached_blocks(size_t engine, const std::vector<uint64_t>& chain) const;
  /// Engine `engine` now holds every block of `chain`, the most recently used; the least
  /// recently used blocks beyond its capacity are dropped.
  void record(size_t engine, const std::vector<uint64_t>& chain);
  /// Engine `engine` holds nothing (it is lost).
  void forget(size_t engine);

  [[nodiscard]] size_t num_engines() const { return engines_.size(); }
  [[nodiscard]] int64_t num_blocks(size_t engine) const;
  /// Engine `engine`'s blocks, most recently used first (tests).
  [[nodiscard]] std::vector<uint64_t> blocks_by_recency(size_t engine) const;
  void check_invariants() const;

 private:
  struct engine_set {
    int64_t capacity_blocks = 0;
    std::list<uint64_t> by_recency;  // front = most recently used
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;  // hash -> its place in by_recency
  };

  std::vector<engine_set> engines_;
};

}  // namespace troupe::balance
