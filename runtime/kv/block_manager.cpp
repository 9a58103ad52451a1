#include "runtime/kv/block_manager.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "runtime/kv/hit_rule.hpp"

namespace troupe::kv {
namespace {
// block_manager::window_ flags of a cached block (window_tokens > 0 only).
constexpr uint8_t window_lacking = 1;  // inserted from a tier without its sliding rows
constexpr uint8_t window_kept = 2;     // demoted with its sliding rows
}  // namespace

expected<block_manager> block_manager::create(const block_manager_config& config) {
  if (config.num_blocks <= 0)
    return fail(errc::invalid_argument,
                "num_blocks must be > 0, got " + std::to_string(config.num_blocks));
  if (config.block_size <= 0)
    return fail(errc::invalid_argument,
                "block_size must be > 0, got " + std::to_string(config.block_size));
  if (config.window_tokens < 0)
    return fail(errc::invalid_argument, "window_tokens must be >= 0, got " + std::to_string(config.window_tokens));
  const int64_t num_slots = int64_t{config.num_blocks} * config.block_size;
  if (num_slots > std::numeric_limits<int32_t>::max())
    return fail(errc::invalid_argument,
                "num_blocks * block_size must fit in int32, got " + std::to_string(num_slots));
  return block_manager(config);
}

block_manager::block_manager(const block_manager_config& config)
    : config_(config),
      refcount_(static_cast<size_t>(config.num_blocks), 0),
      has_hash_(static_cast<size_t>(config.num_blocks), 0),
      block_hash_(static_cast<size_t>(config.num_blocks), 0),
      parent_hash_(static_cast<size_t>(config.num_blocks), 0),
      block_tokens_(static_cast<size_t>(config.num_blocks) * config.block_size, 0),
      window_(static_cast<size_t>(config.num_blocks), 0),
      free_prev_(static_cast<size_t>(config.num_blocks) + 1),
      free_next_(static_cast<size_t>(config.num_blocks) + 1),
      hash_index_(config.num_blocks),
      cache_log_(2 * static_cast<size_t>(config.num_blocks)),
      block_changed_(static_cast<size_t>(config.num_blocks), 0) {
  const block_id sentinel = config.num_blocks;
  free_prev_[sentinel] = sentinel;
  free_next_[sentinel] = sentinel;
  for (block_id b = 0; b < config.num_blocks; ++b) free_queue_push_back(b);
  TROUPE_ASSERT(num_free_blocks_ == config.num_blocks);
  changed_blocks_.clear();  // the initial state is check_structure's
  std::fill(block_changed_.begin(), block_changed_.end(), uint8_t{0});
}

namespace {
/// Sequence changes kept for check_step (a few steps of a large batch); more and it checks all.
constexpr size_t num_changed_sequences_max = 1 << 16;
}  // namespace

void block_manager::mark_changed(block_id block) {
  if (block == config_.num_blocks || block_changed_[block]) return;  // the sentinel, or known
  block_changed_[block] = 1;
  changed_blocks_.push_back(block);
}

void block_manager::mark_changed(seq_id seq) {
  if (changes_dropped_) return;
  if (changed_sequences_.size() == num_changed_sequences_max) {
    changes_dropped_ = true;
    changed_sequences_.clear();
    return;
  }
  changed_sequences_.push_back(seq);
}

// ---- queries -----------------------------------------------------------------------------

int32_t block_manager::num_blocks_for(int32_t num_tokens) const {
  TROUPE_ASSERT(num_tokens >= 0);
  return static_cast<int32_t>((int64_t{num_tokens} + config_.block_size - 1) /
                              config_.block_size);
}

uint64_t block_manager::block_hash(uint64_t parent_hash, const int32_t* block_tokens) const {
  return chain_hash(parent_hash, block_tokens, config_.block_size);
}

bool block_manager::cached_block_matches(block_id block, uint64_t parent_hash,
                                         const int32_t* block_tokens) const {
  if (!has_hash_[block] || parent_hash_[block] != parent_hash) return false;
  const int32_t* stored = &block_tokens_[static_cast<size_t>(block) * config_.block_size];
  return std::memcmp(stored, block_tokens, sizeof(int32_t) * config_.block_size) == 0;
}

prefix_hit block_manager::find_prefix(const std::vector<int32_t>& tokens) const {
  prefix_hit hit;
  if (tokens.empty()) return hit;
  // Leave at least one token to compute: its logits are what the caller needs next.
  const size_t num_blocks_max = (tokens.size() - 1) / static_cast<size_t>(config_.block_size);
  uint64_t parent = root_hash_seed;
  for (size_t i = 0; i < num_blocks_max; ++i) {
    const int32_t* block_tokens = tokens.data() + i * config_.block_size;
    const uint64_t hash = block_hash(parent, block_tokens);
    const block_id found = hash_index_.find(hash);
    if (found == hash_index::none) break;
    if (!cached_block_matches(found, parent, block_tokens)) break;  // a collision
    hit.blocks.push_back(found);
    parent = hash;
  }
  hit.num_tokens = static_cast<int32_t>(hit.blocks.size()) * config_.block_size;
  return hit;
}

void block_manager::check_hit(const prefix_hit& hit) const {
  TROUPE_ASSERT_MSG(hit.num_tokens ==
                        static_cast<int32_t>(hit.blocks.size()) * config_.block_size,
                    "prefix_hit.num_tokens must cover its blocks exactly");
  uint64_t parent = root_hash_seed;
  for (const block_id b : hit.blocks) {
    TROUPE_ASSERT(b >= 0 && b < config_.num_blocks);
    TROUPE_ASSERT_MSG(has_hash_[b], "stale prefix_hit: a hit block was evicted");
    TROUPE_ASSERT_MSG(parent_hash_[b] == parent, "stale prefix_hit: chain broken");
    parent = block_hash_[b];
  }
  std::vector<block_id> sorted = hit.blocks;
  std::sort(sorted.begin(), sorted.end());
  TROUPE_ASSERT_MSG(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                    "prefix_hit repeats a block");
}

const block_manager::sequence_state& block_manager::sequence(seq_id seq) const {
  const auto it = sequences_.find(seq);
  TROUPE_ASSERT_MSG(it != sequences_.end(), "unknown sequence id");
  return it->second;
}

const std::vector<block_id>& block_manager::block_table(seq_id seq) const {
  return sequence(seq).block_table;
}

int32_t block_manager::num_tokens(seq_id seq) const { return sequence(seq).num_tokens; }

int32_t block_manager::refcount(block_id block) const {
  TROUPE_ASSERT(block >= 0 && block < config_.num_blocks);
  return refcount_[block];
}

bool block_manager::is_cached(block_id block) const {
  TROUPE_ASSERT(block >= 0 && block < config_.num_blocks);
  return has_hash_[block] != 0;
}

bool block_manager::holds_window(block_id block) const {
  TROUPE_ASSERT(block >= 0 && block < config_.num_blocks);
  return (window_[block] & window_lacking) == 0;
}

int32_t block_manager::num_cached_blocks() const {
  return static_cast<int32_t>(hash_index_.size());
}

int32_t block_manager::num_sequences() const { return static_cast<int32_t>(sequences_.size()); }

std::vector<block_id> block_manager::free_queue() const {
  std::vector<block_id> order;
  order.reserve(static_cast<size_t>(num_free_blocks_));
  const block_id sentinel = config_.num_blocks;
  for (block_id b = free_next_[sentinel]; b != sentinel; b = free_next_[b]) order.push_back(b);
  return order;
}

// ---- the free queue and refcounts ----------------------------------------------------------

void block_manager::free_queue_push_back(block_id block) {
  const block_id sentinel = config_.num_blocks;
  const block_id last = free_prev_[sentinel];
  mark_changed(block);
  mark_changed(last);
  free_prev_[block] = last;
  free_next_[block] = sentinel;
  free_next_[last] = block;
  free_prev_[sentinel] = block;
  ++num_free_blocks_;
}

void block_manager::free_queue_unlink(block_id block) {
  TROUPE_ASSERT(num_free_blocks_ > 0);
  TROUPE_ASSERT(refcount_[block] == 0);
  mark_changed(block);
  mark_changed(free_prev_[block]);
  mark_changed(free_next_[block]);
  free_next_[free_prev_[block]] = free_next_[block];
  free_prev_[free_next_[block]] = free_prev_[block];
  free_prev_[block] = free_next_[block] = config_.num_blocks;
  --num_free_blocks_;
}

block_id block_manager::pop_fresh_block() {
  TROUPE_ASSERT_MSG(num_free_blocks_ > 0, "KV pool exhausted");
  const block_id block = free_next_[config_.num_blocks];
  free_queue_unlink(block);
  if (has_hash_[block]) {  // the least recently freed cached block: evict it
    if (config_.record_evictions) {
      const int32_t* tokens = &block_tokens_[static_cast<size_t>(block) * config_.block_size];
      evictions_.push_back(evicted_block{block, block_hash_[block], parent_hash_[block],
                                         std::vector<int32_t>(tokens, tokens + config_.block_size),
                                         config_.window_tokens == 0 || (window_[block] & window_kept) != 0});
    }
    hash_index_.erase(block_hash_[block]);
    has_hash_[block] = 0;
    window_[block] = 0;
    cache_log_.log(block_hash_[block], false);
    ++num_evictions_;
  }
  refcount_[block] = 1;
  return block;
}

void block_manager::acquire(block_id block) {
  if (refcount_[block] == 0) free_queue_unlink(block);  // a hit on a cached free block
  mark_changed(block);
  ++refcount_[block];
}

void block_manager::release(block_id block) {
  TROUPE_ASSERT_MSG(refcount_[block] > 0, "block released more often than acquired");
  mark_changed(block);
  if (--refcount_[block] == 0) free_queue_push_back(block);
}

// ---- allocation, commit, fork, free ----------------------------------------------------------

bool block_manager::can_allocate(seq_id seq, int32_t num_tokens_total,
                                 const prefix_hit& hit) const {
  TROUPE_ASSERT(num_tokens_total >= 0);
  const auto it = sequences_.find(seq);
  if (it != sequences_.end()) {
    TROUPE_ASSERT_MSG(hit.blocks.empty(), "a prefix hit applies to a sequence's first allocate");
    TROUPE_ASSERT_MSG(num_tokens_total >= it->second.num_tokens, "allocate never shrinks");
    const size_t num_needed = static_cast<size_t>(num_blocks_for(num_tokens_total)) -
                              it->second.block_table.size();
    return num_needed <= static_cast<size_t>(num_free_blocks_);
  }
  check_hit(hit);
  TROUPE_ASSERT(num_tokens_total >= hit.num_tokens);
  // Hit blocks in the free queue get reused, not handed out fresh: they do not count.
  const auto num_hit_free = std::count_if(hit.blocks.begin(), hit.blocks.end(),
                                          [&](block_id b) { return refcount_[b] == 0; });
  const int64_t num_needed = int64_t{num_blocks_for(num_tokens_total)} -
                             static_cast<int64_t>(hit.blocks.size());
  return num_needed <= int64_t{num_free_blocks_} - num_hit_free;
}

void block_manager::allocate(seq_id seq, int32_t num_tokens_total, const prefix_hit& hit) {
  TROUPE_ASSERT_MSG(can_allocate(seq, num_tokens_total, hit), "allocate without can_allocate");
  auto [it, created] = sequences_.try_emplace(seq);
  sequence_state& state = it->second;
  mark_changed(seq);
  if (created) {
    // Install the hit first: popping fresh blocks must not evict a block we are about to reuse.
    for (const block_id b : hit.blocks) {
      acquire(b);
      state.block_table.push_back(b);
      state.block_hashes.push_back(block_hash_[b]);
    }
  }
  const size_t num_blocks_total = static_cast<size_t>(num_blocks_for(num_tokens_total));
  while (state.block_table.size() < num_blocks_total)
    state.block_table.push_back(pop_fresh_block());
  state.num_tokens = num_tokens_total;
}

void block_manager::register_block(sequence_state& state, const std::vector<int32_t>& tokens) {
  const size_t i = state.block_hashes.size();
  const uint64_t parent = i == 0 ? root_hash_seed : state.block_hashes.back();
  const int32_t* block_tokens = tokens.data() + i * config_.block_size;
  const uint64_t hash = block_hash(parent, block_tokens);
  const block_id block = state.block_table[i];
  state.block_hashes.push_back(hash);
  if (has_hash_[block]) {  // shared (fork or hit) and registered by another sequence
    TROUPE_ASSERT_MSG(block_hash_[block] == hash, "a shared block was committed with "
                                                  "different tokens by two sequences");
    return;
  }
  // One block per hash: a duplicate of an indexed block stays unhashed.
  if (hash_index_.find(hash) != hash_index::none) return;
  cache_block(block, hash, parent, block_tokens);
}

void block_manager::cache_block(block_id block, uint64_t hash, uint64_t parent_hash, const int32_t* block_tokens) {
  TROUPE_ASSERT(!has_hash_[block]);
  const bool indexed = hash_index_.insert(hash, block);
  TROUPE_ASSERT_MSG(indexed, "a chain hash is indexed once");
  mark_changed(block);
  has_hash_[block] = 1;
  block_hash_[block] = hash;
  parent_hash_[block] = parent_hash;
  std::copy(block_tokens, block_tokens + config_.block_size,
            &block_tokens_[static_cast<size_t>(block) * config_.block_size]);
  cache_log_.log(hash, true);
}

void block_manager::commit(seq_id seq, const std::vector<int32_t>& tokens,
                           int32_t num_computed_tokens) {
  const auto it = sequences_.find(seq);
  TROUPE_ASSERT_MSG(it != sequences_.end(), "commit: unknown sequence id");
  sequence_state& state = it->second;
  mark_changed(seq);
  TROUPE_ASSERT(num_computed_tokens >= 0);
  TROUPE_ASSERT_MSG(num_computed_tokens <= state.num_tokens, "computed beyond allocated slots");
  TROUPE_ASSERT_MSG(static_cast<size_t>(num_computed_tokens) <= tokens.size(),
                    "commit: fewer tokens than computed");
  const size_t num_full_blocks = static_cast<size_t>(num_computed_tokens / config_.block_size);
  while (state.block_hashes.size() < num_full_blocks) register_block(state, tokens);
}

bool block_manager::can_fork(seq_id parent) const {
  const bool has_partial_block = sequence(parent).num_tokens % config_.block_size != 0;
  return !has_partial_block || num_free_blocks_ > 0;
}

std::vector<block_copy> block_manager::fork(seq_id parent, seq_id child) {
  TROUPE_ASSERT_MSG(can_fork(parent), "fork without can_fork");
  TROUPE_ASSERT_MSG(!contains(child), "fork: child id already exists");
  const sequence_state& from = sequence(parent);
  sequence_state& to = sequences_[child];  // std::map: `from` stays valid
  mark_changed(child);
  const int32_t num_full_blocks = from.num_tokens / config_.block_size;
  TROUPE_ASSERT(from.block_hashes.size() <= static_cast<size_t>(num_full_blocks));
  for (int32_t i = 0; i < num_full_blocks; ++i) {
    acquire(from.block_table[i]);
    to.block_table.push_back(from.block_table[i]);
  }
  to.block_hashes = from.block_hashes;
  to.num_tokens = from.num_tokens;
  std::vector<block_copy> copies;
  if (from.num_tokens % config_.block_size != 0) {  // both will write into it: copy eagerly
    const block_id dst = pop_fresh_block();
    copies.push_back(block_copy{from.block_table[num_full_blocks], dst});
    to.block_table.push_back(dst);
  }
  return copies;
}

void block_manager::free(seq_id seq) {
  const auto it = sequences_.find(seq);
  TROUPE_ASSERT_MSG(it != sequences_.end(), "free: unknown sequence id");
  const std::vector<block_id>& table = it->second.block_table;
  if (config_.window_tokens > 0) {  // the window state at its committed blocks' end goes down with them
    const std::vector<uint64_t>& hashes = it->second.block_hashes;
    const auto end = static_cast<int32_t>(hashes.size());
    const int32_t first = first_window_block({config_.block_size, config_.window_tokens, 0}, end * config_.block_size);
    for (int32_t i = first; i < end; i++) {
      const block_id b = hash_index_.find(hashes[static_cast<size_t>(i)]);  // its own, or the indexed twin
      if (b == hash_index::none || (window_[b] & window_lacking) != 0) continue;
      window_[b] |= window_kept;
      mark_changed(b);
    }
  }
  // Tail first: a sequence's last blocks are the least likely to be shared, so evict them first.
  for (auto b = table.rbegin(); b != table.rend(); ++b) release(*b);
  sequences_.erase(it);
}

void block_manager::truncate(seq_id seq, int32_t num_tokens_total) {
  const auto it = sequences_.find(seq);
  TROUPE_ASSERT_MSG(it != sequences_.end(), "truncate: unknown sequence id");
  sequence_state& state = it->second;
  TROUPE_ASSERT(num_tokens_total >= 0 && num_tokens_total <= state.num_tokens);
  const auto keep = static_cast<size_t>(num_blocks_for(num_tokens_total));
  TROUPE_ASSERT_MSG(state.block_hashes.size() <= keep, "truncate would drop a committed block");
  while (state.block_table.size() > keep) {
    const block_id b = state.block_table.back();
    TROUPE_ASSERT_MSG(refcount_[b] == 1 && !has_hash_[b], "truncate drops only the sequence's own unhashed blocks");
    state.block_table.pop_back();
    release(b);
  }
  state.num_tokens = num_tokens_total;
  mark_changed(seq);
}

block_id block_manager::insert_cached(uint64_t parent_hash, const std::vector<int32_t>& tokens, bool with_window) {
  TROUPE_ASSERT(tokens.size() == static_cast<size_t>(config_.block_size));
  const uint64_t hash = block_hash(parent_hash, tokens.data());
  TROUPE_ASSERT_MSG(!has_block(hash), "insert_cached: the block is cached already");
  const block_id block = pop_fresh_block();
  cache_block(block, hash, parent_hash, tokens.data());
  if (config_.window_tokens > 0) window_[block] = with_window ? window_kept : window_lacking;
  release(block);  // refcount 1 -> 0: the back of the free queue
  return block;
}

int32_t block_manager::refresh(const prefix_hit& hit) {
  check_hit(hit);
  int32_t num_free = 0;
  for (auto b = hit.blocks.rbegin(); b != hit.blocks.rend(); ++b) {
    if (refcount_[*b] != 0) continue;
    free_queue_unlink(*b);
    free_queue_push_back(*b);
    num_free++;
  }
  return num_free;
}

std::vector<evicted_block> block_manager::take_evictions() {
  std::vector<evicted_block> out = std::move(evictions_);
  evictions_.clear();
  return out;
}

cache_events block_manager::take_cache_events() { return cache_log_.take(); }

std::vector<uint64_t> block_manager::cached_hashes() const {
  std::vector<uint64_t> out;
  out.reserve(hash_index_.size());
  for (block_id b = 0; b < config_.num_blocks; ++b)
    if (has_hash_[b]) out.push_back(block_hash_[b]);
  std::sort(out.begin(), out.end());
  return out;
}

expected<void> block_manager::try_free(seq_id seq) {
  if (!contains(seq)) return fail(errc::not_found, "unknown sequence id " + std::to_string(seq));
  free(seq);
  return {};
}

// ---- invariants -------------------------------------------------------------------------------

void block_manager::check_invariants() const {
  check_structure();
  check_free_queue();
  check_hash_index();
  cache_log_.check_invariants([this](uint64_t hash) { return has_block(hash); });
  for (block_id b = 0; b < config_.num_blocks; ++b) {
    check_window_mark(b);
    if (!has_hash_[b]) continue;
    const int32_t* stored = &block_tokens_[static_cast<size_t>(b) * config_.block_size];
    TROUPE_ASSERT_MSG(block_hash(parent_hash_[b], stored) == block_hash_[b],
                      "cached block's hash does not match its tokens");
  }
}

void block_manager::check_structure() const {
  TROUPE_ASSERT(config_.num_blocks > 0 && config_.block_size > 0);
  TROUPE_ASSERT(refcount_.size() == static_cast<size_t>(config_.num_blocks));
  check_refcounts();
  check_free_links();
  check_sequences();
  // The index's own structure and its two-way agreement with the blocks are check_invariants'
  // (each insert and erase asserts its part); here only that the counts agree.
  const auto num_hashed = static_cast<size_t>(std::count(has_hash_.begin(), has_hash_.end(), uint8_t{1}));
  TROUPE_ASSERT_MSG(num_hashed == hash_index_.size(), "hashed blocks and index entries differ in number");
}

/// Refcount == number of block-table references across all sequences.
void block_manager::check_refcounts() const {
  std::vector<int32_t> references(refcount_.size(), 0);
  for (const auto& [seq, state] : sequences_)
    for (const block_id b : state.block_table) {
      TROUPE_ASSERT(b >= 0 && b < config_.num_blocks);
      ++references[b];
    }
  if (references == refcount_) return;  // the common case in one vectorized compare
  for (size_t b = 0; b < refcount_.size(); ++b)
    TROUPE_ASSERT_MSG(refcount_[b] == references[b], "refcount != table references");
}

/// Without walking the queue: every refcount-0 block is linked both ways with its neighbours,
/// every referenced block is linked nowhere, and the count is right. (A free block in a cycle
/// detached from the sentinel passes this; check_free_queue's walk does not let it.) A
/// branch-free pass over the arrays finds whether anything is wrong (this runs after every
/// step of a simulation); only then does a second pass name the first violation. The fast
/// pass follows only `next` links: with L = the free blocks and the sentinel, prev[next[x]] ==
/// x for every x in L, and every referenced block's prev being the sentinel, next maps L
/// one-to-one into L, so it is a bijection of L and next[prev[y]] == y for every y in L too.
void block_manager::check_free_links() const {
  const block_id sentinel = config_.num_blocks;
  const block_id* next = free_next_.data();
  const block_id* prev = free_prev_.data();
  const int32_t* refcount = refcount_.data();
  const block_id head = next[sentinel], tail = prev[sentinel];
  const auto limit = static_cast<uint32_t>(sentinel);
  int32_t num_free = 0;
  uint32_t bad = 0;
  for (block_id b = 0; b < sentinel; ++b) {
    const auto n = static_cast<uint32_t>(next[b]), p = static_cast<uint32_t>(prev[b]);
    const uint32_t out_of_range = static_cast<uint32_t>(n > limit) | static_cast<uint32_t>(p > limit);
    const uint32_t free = refcount[b] == 0;
    // A link is followed only within range (one out of range is flagged above).
    const uint32_t linked = static_cast<uint32_t>(prev[n > limit ? limit : n] == b);
    const uint32_t unlinked = static_cast<uint32_t>(n == limit) & static_cast<uint32_t>(p == limit) &
                              static_cast<uint32_t>(head != b) & static_cast<uint32_t>(tail != b);
    bad |= out_of_range | (free & (linked ^ 1u)) | ((free ^ 1u) & (unlinked ^ 1u));
    num_free += static_cast<int32_t>(free);
  }
  TROUPE_ASSERT(prev[head] == sentinel && next[tail] == sentinel);
  if (bad == 0 && num_free == num_free_blocks_) return;
  for (block_id b = 0; b < sentinel; ++b) check_block_links(b);
  TROUPE_ASSERT_MSG(num_free == num_free_blocks_, "free block count is off");
}

/// A free block is linked both ways with its neighbours; a referenced one nowhere.
void block_manager::check_block_links(block_id b) const {
  const block_id sentinel = config_.num_blocks;
  const block_id* next = free_next_.data();
  const block_id* prev = free_prev_.data();
  TROUPE_ASSERT(next[b] >= 0 && next[b] <= sentinel && prev[b] >= 0 && prev[b] <= sentinel);
  TROUPE_ASSERT(refcount_[b] >= 0);
  if (refcount_[b] == 0)
    TROUPE_ASSERT_MSG(prev[next[b]] == b && next[prev[b]] == b, "free queue link broken");
  else
    TROUPE_ASSERT_MSG(next[b] == sentinel && prev[b] == sentinel && next[sentinel] != b && prev[sentinel] != b,
                      "a referenced block is linked into the free queue");
}

/// A window mark only on a cached block of a pool with a window, and one of the two.
void block_manager::check_window_mark(block_id b) const {
  TROUPE_ASSERT_MSG(window_[b] == 0 || (has_hash_[b] && config_.window_tokens > 0 &&
                                        (window_[b] == window_lacking || window_[b] == window_kept)),
                    "a window mark on a block that is not cached, or both marks");
}

/// One block as check_structure and check_invariants see it.
void block_manager::check_block(block_id b) const {
  TROUPE_ASSERT(b >= 0 && b < config_.num_blocks);
  check_block_links(b);
  check_window_mark(b);
  if (!has_hash_[b]) return;
  TROUPE_ASSERT_MSG(hash_index_.find(block_hash_[b]) == b, "a hashed block is not in the index");
  const int32_t* stored = &block_tokens_[static_cast<size_t>(b) * config_.block_size];
  TROUPE_ASSERT_MSG(block_hash(parent_hash_[b], stored) == block_hash_[b],
                    "cached block's hash does not match its tokens");
}

void block_manager::check_step() {
  if (changes_dropped_) {
    check_structure();
  } else {
    for (const block_id b : changed_blocks_) check_block(b);
    for (const seq_id seq : changed_sequences_) {
      const auto it = sequences_.find(seq);
      if (it != sequences_.end()) check_sequence(it->second);
    }
  }
  const block_id sentinel = config_.num_blocks;
  TROUPE_ASSERT(num_free_blocks_ >= 0 && num_free_blocks_ <= config_.num_blocks);
  TROUPE_ASSERT(free_prev_[free_next_[sentinel]] == sentinel && free_next_[free_prev_[sentinel]] == sentinel);
  for (const block_id b : changed_blocks_) block_changed_[b] = 0;
  changed_blocks_.clear();
  changed_sequences_.clear();
  changes_dropped_ = false;
}

/// The queue is a well-formed list holding exactly the refcount-0 blocks, each once.
void block_manager::check_free_queue() const {
  const block_id sentinel = config_.num_blocks;
  std::vector<uint8_t> queued(refcount_.size(), 0);
  int32_t num_queued = 0;
  block_id prev = sentinel;
  for (block_id b = free_next_[sentinel]; b != sentinel; b = free_next_[b]) {
    TROUPE_ASSERT(b >= 0 && b < config_.num_blocks);
    TROUPE_ASSERT_MSG(!queued[b], "free queue has a cycle or a repeated block");
    TROUPE_ASSERT_MSG(free_prev_[b] == prev, "free queue prev link broken");
    TROUPE_ASSERT_MSG(refcount_[b] == 0, "a referenced block is in the free queue");
    queued[b] = 1;
    ++num_queued;
    prev = b;
  }
  TROUPE_ASSERT(free_prev_[sentinel] == prev);
  TROUPE_ASSERT(num_queued == num_free_blocks_);
  for (size_t b = 0; b < refcount_.size(); ++b)
    TROUPE_ASSERT_MSG((refcount_[b] == 0) == (queued[b] != 0), "free block not in the queue");
}

/// The index is well formed and every entry has its block; with check_structure's equal counts,
/// every hashed block is in the index too.
void block_manager::check_hash_index() const {
  hash_index_.check_invariants();
  hash_index_.for_each([&](uint64_t hash, block_id b) {
    TROUPE_ASSERT(b >= 0 && b < config_.num_blocks);
    TROUPE_ASSERT_MSG(has_hash_[b] && block_hash_[b] == hash, "index entry without its block");
  });
}

/// Tables cover num_tokens slots exactly; registered hashes cover only full blocks.
void block_manager::check_sequences() const {
  for (const auto& [seq, state] : sequences_) check_sequence(state);
}

void block_manager::check_sequence(const sequence_state& state) const {
  TROUPE_ASSERT(state.num_tokens >= 0);
  TROUPE_ASSERT_MSG(state.block_table.size() == static_cast<size_t>(num_blocks_for(state.num_tokens)),
                    "block table does not cover num_tokens exactly");
  TROUPE_ASSERT(state.block_hashes.size() <= static_cast<size_t>(state.num_tokens / config_.block_size));
  for (const block_id b : state.block_table) {
    TROUPE_ASSERT(b >= 0 && b < config_.num_blocks);
    TROUPE_ASSERT_MSG(refcount_[b] > 0, "a block in a table is free");
  }
  for (size_t i = 0; i < state.block_hashes.size(); ++i) {
    const block_id b = state.block_table[i];
    TROUPE_ASSERT_MSG(!has_hash_[b] || block_hash_[b] == state.block_hashes[i],
                      "a registered block carries another chain's hash");
  }
}

}  // namespace troupe::kv
