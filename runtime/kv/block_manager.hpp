#pragma once

/// Paged KV-cache block manager: fixed-size blocks, per-sequence block tables, refcounts,
/// copy-on-write fork of the partial last block, and a prefix cache over block-hash chains.
///
/// Modelled on vLLM v1's `KVCacheManager` and nano-vllm's `BlockManager`. It decides which block
/// ids hold which token slots; it never touches KV bytes (the executor does, including the copy
/// that `fork` returns).
///
/// Free queue. Blocks with refcount 0 sit in one exact FIFO, initially 0, 1, ..., N-1.
/// Allocation pops the front; a block whose refcount drops to 0 is appended at the back; `free`
/// appends a sequence's blocks in reverse table order, so its tail blocks (least likely to be
/// shared) are evicted first. A free block keeps its hash and can still be hit; the hash leaves
/// the index only when the block is popped for a new allocation (counted in `num_evictions`).
/// Eviction is therefore exactly LRU over cached-but-free blocks. The queue is an intrusive
/// doubly-linked list over block ids, so a prefix hit on a free block unlinks it in O(1).
///
/// Prefix cache. Blocks are named by their chain hash (kv/chain_hash.hpp). `commit` registers each block once it is fully computed. The
/// index holds one block per hash: a second block committed with a hash already indexed stays
/// unhashed. Every cached block also stores its own token ids and its parent's chain hash, and
/// `find_prefix` accepts a block only if both equal the query's, so a single 64-bit collision
/// cannot produce a wrong hit (a wrong hit would need colliding chain hashes over identical
/// block contents). A hit never covers the whole token list: at least one token is left to
/// compute, because the logits come from computing it.
///
/// Sequences. `allocate` on an unknown id creates the sequence (installing the prefix hit first);
/// on a known id it only grows the table (the hit must then be empty). A `prefix_hit` is valid
/// until the next mutating call. Unknown ids in `free`/`fork`/`block_table` are programmer
/// errors (assert); `try_free` is the checked variant for user-supplied ids.
///
/// Tiers (issue 14). With `record_evictions`, every eviction is logged (`take_evictions`) with
/// what a lower tier needs to keep the block: its chain hash, parent hash and tokens (its KV is
/// the executor's, read out by block id before anything overwrites it). `insert_cached` is the
/// way back up: a block from a lower tier becomes a free cached block at the back of the free
/// queue, as if a sequence had just freed it, so a later `find_prefix` hits it.
///
/// Window state (issue 54, point 5; kv/hit_rule.hpp). With `window_tokens` (a sliding-window
/// model whose tiers keep only the global layers' KV), each cached block knows whether it holds
/// its sliding layers' rows (`holds_window`: a block inserted from a tier without them does not)
/// and whether it is demoted with them (`evicted_block::with_window`): a sequence's last
/// committed blocks, those holding the window state at its end, are marked so when it is freed,
/// as are blocks inserted with their rows. Both marks go when the block is evicted.
///
/// Cache events (issue 14, the balancer's prefix directory). Every chain hash entering the
/// index (`commit`, `insert_cached`) or leaving it (an eviction) is logged (kv::cache_event_log,
/// bounded by 2 × num_blocks events); `take_cache_events` returns the net change since the last
/// take, so a consumer that applies each take to its copy of the cached hashes holds exactly
/// `cached_hashes()` (after an overflow it starts over from `cached_hashes()`).
///
/// Determinism: per-sequence state lives in a `std::map`; the hash index (kv::hash_index) is
/// only looked up, never iterated to make a decision.

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/cache_event_log.hpp"
#include "runtime/kv/chain_hash.hpp"
#include "runtime/kv/hash_index.hpp"
#include "runtime/plan/ids.hpp"

namespace troupe::kv {

/// The pool's shape. `num_blocks * block_size` must fit in int32 (token counts are int32).
struct block_manager_config {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  bool record_evictions = false;  ///< log evicted cached blocks for take_evictions (a tier below)
  /// The model's sliding window when a tier below keeps only the global layers' KV (see the
  /// header comment); 0: every block is demoted with every layer.
  int32_t window_tokens = 0;
};

/// A cached block the pool evicted: its block id (whose KV is still intact until a step writes
/// it) and its name in the chain.
struct evicted_block {
  block_id block = 0;
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  std::vector<int32_t> tokens;  ///< (block_size)
  /// Whether a tier below keeps its sliding layers' rows too: always without window_tokens;
  /// with it, only for a block holding a freed sequence's window state (see the header comment).
  bool with_window = true;
};

/// The longest cached prefix of a token list: block ids in order, covering `num_tokens` tokens.
struct prefix_hit {
  std::vector<block_id> blocks;
  int32_t num_tokens = 0;
};

/// Owns one replica's pool of KV blocks and every sequence's block table.
class block_manager {
 public:
  /// Validates `config`: errc::invalid_argument if a size is <= 0 or the pool overflows int32.
  [[nodiscard]] static expected<block_manager> create(const block_manager_config& config);

  /// The longest chain of cached full blocks that prefixes `tokens`, at most
  /// `(tokens.size() - 1) / block_size` blocks.
  [[nodiscard]] prefix_hit find_prefix(const std::vector<int32_t>& tokens) const;

  /// Whether `allocate(seq, num_tokens_total, hit)` would find enough free blocks. Hit blocks
  /// sitting in the free queue are reused, so they do not count as fresh blocks.
  [[nodiscard]] bool can_allocate(seq_id seq, int32_t num_tokens_total,
                                  const prefix_hit& hit = {}) const;

  /// Grows `seq`'s table to cover `num_tokens_total` slots; creates `seq` on first call, with
  /// the hit's blocks installed first (refcount + 1). Asserts `can_allocate`.
  void allocate(seq_id seq, int32_t num_tokens_total, const prefix_hit& hit = {});

  /// Registers chain hashes for every block of `seq` that the first `num_computed_tokens` of
  /// `tokens` fill completely and that is not registered yet.
  void commit(seq_id seq, const std::vector<int32_t>& tokens, int32_t num_computed_tokens);

  /// Shrinks `seq`'s table to the blocks that hold `num_tokens_total` slots (<= what it holds):
  /// speculative decoding's rollback of the slots its rejected drafts took. The dropped blocks
  /// are the sequence's own (refcount 1) and carry no hash (only computed tokens are
  /// committed); they join the free queue's back, last block first, as `free` would put them.
  void truncate(seq_id seq, int32_t num_tokens_total);
  /// Whether `fork(parent, ...)` would find a block for the partial last block's copy.
  [[nodiscard]] bool can_fork(seq_id parent) const;

  /// Creates `child` sharing every full block of `parent`; a partly filled last block is
  /// replaced by a fresh block, returned as the one copy the executor must do first.
  [[nodiscard]] std::vector<block_copy> fork(seq_id parent, seq_id child);

  /// Drops `seq`; blocks reaching refcount 0 join the free queue's back in reverse table order,
  /// keeping their hashes until evicted. With window_tokens, the cached blocks holding the
  /// window state at the end of its committed blocks are marked to keep it when demoted.
  /// Asserts that `seq` exists.
  void free(seq_id seq);

  /// Puts a block known to a lower tier into the prefix cache: pops the free queue's front
  /// (evicting it if cached), registers it under chain_hash(parent_hash, tokens) and appends it
  /// at the back of the free queue, refcount 0. `with_window`: whether its KV includes the
  /// sliding layers' rows (with window_tokens; see the header comment). Asserts a free block,
  /// `block_size` tokens and a hash not indexed yet (`has_block`). The caller writes the block's
  /// KV before a step reads it.
  [[nodiscard]] block_id insert_cached(uint64_t parent_hash, const std::vector<int32_t>& tokens,
                                       bool with_window = true);

  /// Moves the hit's blocks that are free to the back of the free queue (tail first, so its
  /// head is evicted last), as if just freed: a prefix about to be extended is not evicted by
  /// the allocations that extend it. Returns how many were free.
  int32_t refresh(const prefix_hit& hit);

  /// The evictions since the last call, in order (always empty without record_evictions).
  [[nodiscard]] std::vector<evicted_block> take_evictions();

  /// The cache events since the last call (see the header comment); starts the log over.
  [[nodiscard]] cache_events take_cache_events();
  /// Every chain hash the index holds, ascending.
  [[nodiscard]] std::vector<uint64_t> cached_hashes() const;

  /// `free` for ids that come from users: errc::not_found if `seq` does not exist.
  [[nodiscard]] expected<void> try_free(seq_id seq);

  [[nodiscard]] bool contains(seq_id seq) const { return sequences_.count(seq) != 0; }
  [[nodiscard]] const std::vector<block_id>& block_table(seq_id seq) const;
  /// Token slots `seq`'s table covers.
  [[nodiscard]] int32_t num_tokens(seq_id seq) const;
  [[nodiscard]] int32_t refcount(block_id block) const;
  /// Whether the index holds a block named `hash`.
  [[nodiscard]] bool has_block(uint64_t hash) const { return hash_index_.find(hash) != hash_index::none; }
  /// Whether `block` carries a chain hash in the index (referenced or free).
  [[nodiscard]] bool is_cached(block_id block) const;
  /// Whether `block` holds its sliding layers' rows: all but a block inserted without them.
  [[nodiscard]] bool holds_window(block_id block) const;
  [[nodiscard]] int32_t window_tokens() const { return config_.window_tokens; }

  [[nodiscard]] int32_t block_size() const { return config_.block_size; }
  /// Blocks that hold `num_tokens` (>= 0) tokens: the ceiling of num_tokens / block_size.
  [[nodiscard]] int32_t num_blocks_for(int32_t num_tokens) const;
  [[nodiscard]] int32_t num_blocks() const { return config_.num_blocks; }
  /// Blocks with refcount 0, cached or not.
  [[nodiscard]] int32_t num_free_blocks() const { return num_free_blocks_; }
  [[nodiscard]] int32_t num_used_blocks() const { return config_.num_blocks - num_free_blocks_; }
  [[nodiscard]] int32_t num_cached_blocks() const;
  [[nodiscard]] int32_t num_sequences() const;
  /// Cached blocks whose hash left the index because they were reallocated.
  [[nodiscard]] int64_t num_evictions() const { return num_evictions_; }
  /// Free blocks in queue order (front first); O(num_free_blocks), for tests and debugging.
  [[nodiscard]] std::vector<block_id> free_queue() const;

  /// Aborts unless every structural invariant holds (see the .cpp for the list).
  void check_invariants() const;
  /// The checks over the contiguous per-block arrays and the sequences — refcounts equal table
  /// references, free blocks linked both ways and referenced ones nowhere, tables cover their
  /// tokens, as many hashed blocks as index entries — but not the walk of the free queue, the
  /// index's slot structure, its two-way agreement with the blocks, or re-hashing every cached
  /// block's tokens: cheap enough to run after every step of a long simulation.
  void check_structure() const;
  /// check_structure's checks, and the index's, for what changed since the last call: each
  /// block whose refcount, free-queue links or hash changed (links both ways or none, in the
  /// index under its hash, its hash re-computed from its tokens) and each sequence allocated,
  /// committed or forked (its table covers its tokens with referenced blocks, its registered
  /// hashes match). O(changes), not O(pool); what it cannot see from the changes alone (a
  /// refcount that disagrees with the tables) is check_structure's. Then starts the change
  /// lists over. If more changes piled up than it keeps, it runs check_structure instead.
  void check_step();

 private:
  friend struct block_manager_tamper;  // tests corrupt the state to see the checks catch it

  struct sequence_state {
    std::vector<block_id> block_table;
    int32_t num_tokens = 0;
    /// Chain hashes of the leading blocks already registered (or found registered).
    std::vector<uint64_t> block_hashes;
  };

  explicit block_manager(const block_manager_config& config);

  [[nodiscard]] uint64_t block_hash(uint64_t parent_hash, const int32_t* block_tokens) const;
  [[nodiscard]] bool cached_block_matches(block_id block, uint64_t parent_hash,
                                          const int32_t* block_tokens) const;
  void check_hit(const prefix_hit& hit) const;
  [[nodiscard]] const sequence_state& sequence(seq_id seq) const;

  void free_queue_push_back(block_id block);
  void free_queue_unlink(block_id block);
  [[nodiscard]] block_id pop_fresh_block();
  void acquire(block_id block);
  void release(block_id block);
  void register_block(sequence_state& state, const std::vector<int32_t>& tokens);
  /// Indexes `block` under `hash` (not indexed yet) with its parent and tokens.
  void cache_block(block_id block, uint64_t hash, uint64_t parent_hash, const int32_t* block_tokens);

  void mark_changed(block_id block);
  void mark_changed(seq_id seq);
  void check_window_mark(block_id block) const;
  void check_block(block_id block) const;
  void check_block_links(block_id block) const;
  void check_sequence(const sequence_state& state) const;
  void check_free_queue() const;
  void check_free_links() const;
  void check_refcounts() const;
  void check_hash_index() const;
  void check_sequences() const;

  block_manager_config config_;
  std::vector<int32_t> refcount_;          // (num_blocks)
  std::vector<uint8_t> has_hash_;          // (num_blocks) 1 if the block is in hash_index_
  std::vector<uint64_t> block_hash_;       // (num_blocks) valid where has_hash_
  std::vector<uint64_t> parent_hash_;      // (num_blocks) valid where has_hash_
  std::vector<int32_t> block_tokens_;      // (num_blocks, block_size) valid where has_hash_
  std::vector<uint8_t> window_;            // (num_blocks) window_lacking / window_kept, only where has_hash_
  // Intrusive free queue over block ids; index num_blocks is the sentinel (head = next of it).
  std::vector<block_id> free_prev_;        // (num_blocks + 1)
  std::vector<block_id> free_next_;        // (num_blocks + 1)
  int32_t num_free_blocks_ = 0;
  hash_index hash_index_;                  // chain hash -> block, for every block with has_hash_
  std::map<seq_id, sequence_state> sequences_;
  int64_t num_evictions_ = 0;
  std::vector<evicted_block> evictions_;   // since take_evictions, with record_evictions
  cache_event_log cache_log_;              // since take_cache_events
  // Changes since the last check_step: each changed block once (flagged in block_changed_),
  // and the sequences changed (repeats, and ids freed since, are fine). Past
  // num_changed_sequences_max the list is dropped and the next check_step checks everything.
  std::vector<block_id> changed_blocks_;
  std::vector<uint8_t> block_changed_;     // (num_blocks)
  std::vector<seq_id> changed_sequences_;
  bool changes_dropped_ = false;
};

}  // namespace troupe::kv
