#pragma once

/// One cache tier's bookkeeping (host memory today; the pattern of any tier): KV blocks keyed by
/// their chain hash (kv/chain_hash.hpp), at most `capacity_blocks` of them, evicted least
/// recently used, each living `ttl` of its traffic class (kv/cache_class.hpp) past its last use.
///
/// Time. Every call takes `now_ns` from the caller's clock (the actor system's, or a simulator's
/// virtual one), never reads one: a test runs days in a few calls. Time never goes backwards
/// (assert). A block put or got at t with class c is alive while now < t + ttl(c) and expired
/// from then on: an expired block is never returned and is dropped by the next `expire`, `put`
/// or `get` of it (counted in num_expirations).
///
/// Recency. `put` and a successful `get` are uses: the block moves to the most recent end and
/// its expiry restarts with the class of that use (a re-put may change the class). The prefix
/// lookup is not a use: asking is not reading. When a `put` finds the tier full, expired blocks
/// go first, then the least recently used; the evicted blocks are returned so that the caller
/// can demote them to the next tier down.
///
/// Lookup. `longest_prefix` hashes a token list's full blocks along the chain and counts the
/// leading ones present and alive; a block counts only if its stored tokens and parent hash
/// equal the query's, so a single 64-bit collision cannot produce a wrong hit (as in the pool).
///
/// Events. Every hash entering or leaving the tier is logged (kv::lru_ttl's log): `take_events`
/// is the net change since the last take, what the tier reports to the balancer's prefix
/// directory; after an overflow the full list is `hashes`. A block expired but not dropped yet
/// is still listed: `expire` first.
///
/// The recency and expiry bookkeeping is kv/lru_ttl.hpp's, shared with the disk tier.
/// Determinism: ordered containers only; ties cannot occur (recency is a counter).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/kv_block.hpp"
#include "runtime/kv/lru_ttl.hpp"

namespace troupe::kv {

struct tier_config {
  int32_t block_size = 16;
  int64_t capacity_blocks = 0;
  int64_t chat_ttl_ns = 7 * day_ns;   ///< the seed's chat lifetime
  int64_t agent_ttl_ns = 3 * day_ns;  ///< the seed's agent lifetime
};

/// A block a put evicted, with the class of its last use (the tier below keeps it as that class).
struct evicted_tier_block {
  kv_block block;
  cache_class cls = cache_class::chat;
};

class tier_store {
 public:
  /// errc::invalid_argument unless block_size, capacity_blocks and both TTLs are > 0.
  [[nodiscard]] static expected<tier_store> create(const tier_config& config);

  /// How many leading full blocks of `tokens` the tier holds alive at `now_ns`. Not a use.
  [[nodiscard]] int32_t longest_prefix(const std::vector<int32_t>& tokens, int64_t now_ns) const;

  /// Stores `block` (whole, of block_size tokens: asserted) with class `cls`; a block already
  /// held is only used again, and replaced if `block` has more layers (a sliding-window model's
  /// block with its window rows over the copy without them: docs/kv-tiers.md, "Window state").
  /// Returns the blocks evicted to make room, least recent first.
  [[nodiscard]] std::vector<evicted_tier_block> put(kv_block block, cache_class cls, int64_t now_ns);

  /// The block named `hash`, used again (recency and expiry), or nullptr if absent or expired
  /// (an expired one is dropped). Valid until the next mutating call.
  [[nodiscard]] const kv_block* get(uint64_t hash, int64_t now_ns);

  /// A tier below this one: the block named a hash, if it has it alive at `now_ns` (the
  /// fetch's own time; a read is a use there too).
  using lower_tier = std::function<std::optional<kv_block>(uint64_t hash, int64_t now_ns)>;

  /// Copies of the leading full blocks of `tokens` from block `first_block` on that the tier
  /// holds alive — or, for a block it lacks, that `lower` (if any) has — at most
  /// `num_blocks_max` of them, stopping at the first neither has; a block from this tier is a
  /// use (`get`). A block counts only if its parent hash and tokens are the query's. What an
  /// engine promotes into its pool after its own prefix of `first_block` blocks.
  [[nodiscard]] std::vector<kv_block> get_prefix(const std::vector<int32_t>& tokens, int32_t first_block,
                                                 int32_t num_blocks_max, int64_t now_ns,
                                                 const lower_tier& lower = {});

  /// Drops every block expired at `now_ns`; returns how many.
  int64_t expire(int64_t now_ns);

  [[nodiscard]] bool contains(uint64_t hash) const { return blocks_.count(hash) != 0; }
  [[nodiscard]] int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  [[nodiscard]] int64_t capacity_blocks() const { return config_.capacity_blocks; }
  [[nodiscard]] int32_t block_size() const { return config_.block_size; }
  [[nodiscard]] int64_t ttl_ns(cache_class cls) const { return lives_.ttl_ns(cls); }
  [[nodiscard]] int64_t num_hits() const { return num_hits_; }
  [[nodiscard]] int64_t num_evictions() const { return num_evictions_; }
  [[nodiscard]] int64_t num_expirations() const { return num_expirations_; }
  /// The hashes that entered and left the tier since the last take (the prefix directory's).
  [[nodiscard]] cache_events take_events() { return lives_.take_events(); }
  /// Held blocks' hashes, ascending.
  [[nodiscard]] std::vector<uint64_t> hashes() const { return lives_.hashes(); }
  /// Held blocks' hashes, least recently used first (O(num_blocks), for tests and debugging).
  [[nodiscard]] std::vector<uint64_t> lru_order() const { return lives_.lru_order(); }

  /// Aborts unless: the index, the recency order and the expiry order hold the same blocks,
  /// each entry's expiry is its last use + its class's TTL, each block is whole and its hash is
  /// its chain hash, the tier is within capacity and no counter is negative.
  void check_invariants() const;

 private:
  explicit tier_store(const tier_config& config)
      : config_(config), lives_(config.chat_ttl_ns, config.agent_ttl_ns) {}

  /// Removes `hash` from the blocks and their lifetimes and returns its block.
  kv_block remove(uint64_t hash);

  tier_config config_;
  std::map<uint64_t, kv_block> blocks_;  // chain hash -> block
  lru_ttl lives_;                        // their last uses: recency and expiry orders
  int64_t num_hits_ = 0;
  int64_t num_evictions_ = 0;
  int64_t num_expirations_ = 0;
};

}  // namespace troupe::kv
