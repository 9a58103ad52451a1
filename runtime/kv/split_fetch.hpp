#pragma once

/// A tier store's prefix fetch (tier_store::get_prefix) whose tier below answers later, by
/// message: the host tier actor over the disk tier actor (actors/cache_tier_actor.hpp). The
/// synchronous walk — each block from the store, or from below when the store lacks it,
/// stopping at the first neither has — is split in two around the question to the tier below.
///
/// `begin_split_fetch` runs at the fetch's time. It takes the leading blocks the store holds
/// (uses, as get_prefix's), and if it lacks the next one, copies of the later blocks of the range
/// it holds (uses too) and the hashes of those it lacks, in chain order: the question. The tier
/// below answers with the leading run of those hashes it holds (none: no answer, or an error).
/// `finish_split_fetch` puts the chain together from the copies and that answer, stopping at the
/// first block neither has or one that is not the query's (its parent hash or tokens differ, or,
/// for a block from below — which may come from another process — kv::validate fails).
///
/// Given the same blocks below, the blocks returned are get_prefix's over a synchronous lower
/// tier (tests/tier_store_test.cpp compares them over random contents). What differs is the
/// uses: the held blocks after the first one the store lacks are used at the fetch's time even
/// when the chain stops short of them, because where it stops is known only from the answer.

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/kv/kv_block.hpp"
#include "runtime/kv/tier_store.hpp"

namespace troupe::kv {

struct split_fetch {
  std::vector<int32_t> tokens;        ///< the query
  int32_t first_lacking = 0;          ///< the first block of the range the store lacks (or the range's end)
  std::vector<kv_block> leading;      ///< the store's blocks from the query's first_block to first_lacking
  uint64_t parent_hash = 0;           ///< the query's hash of the block before first_lacking (root_hash_seed for 0)
  /// (range end - first_lacking): the store's copy of each later block of the range, none where it lacks it
  std::vector<std::optional<kv_block>> later;
  std::vector<uint64_t> lacking;      ///< the hashes of the blocks it lacks from first_lacking on: ask below
};

/// What a split fetch returns: blocks in chain order and, per block, 1 if it came from below
/// (empty when none did).
struct fetched_blocks {
  std::vector<kv_block> blocks;
  std::vector<uint8_t> from_lower;
};

/// The store's part of a fetch of `tokens` from block `first_block`, at most `num_blocks_max`
/// blocks (both >= 0: asserted), at `now_ns`. `lacking` is empty when the store holds the whole
/// range or its first missing block is held but is not the query's.
[[nodiscard]] split_fetch begin_split_fetch(tier_store& store, std::vector<int32_t> tokens, int32_t first_block,
                                            int32_t num_blocks_max, int64_t now_ns);

/// The fetch's blocks: `f.leading`, then from first_lacking on each block from the store's copy
/// or from `below` (the tier below's answer to `f.lacking`, matched in order by hash), stopping
/// at the first neither has or that is not the query's block of `block_size` tokens.
[[nodiscard]] fetched_blocks finish_split_fetch(split_fetch f, std::vector<kv_block> below, int32_t block_size);

}  // namespace troupe::kv
