#pragma once

/// The merge loop shared by both tokenizers: given a row of symbol ids, repeatedly merge the
/// adjacent pair with the best priority (ties: the leftmost pair) into the id the pair makes,
/// until no adjacent pair merges. SentencePiece-style vocabularies rank a pair by its merged
/// piece's score, byte-level BPE by its merge rule's rank; `find_merge(left_id, right_id)`
/// answers with a `pair_merge` or nullopt.
///
/// O(n log n): a heap of candidate pairs, each dropped when popped if either side has changed
/// since it was pushed (the same result as rescanning every pair after each merge).

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace troupe {

struct pair_merge {
  double priority = 0;  ///< higher merges first
  std::int32_t merged_id = -1;
};

namespace detail {

/// A node of the doubly linked symbol list; `id` is -1 once merged into its left neighbour.
struct merge_symbol {
  std::int32_t id = -1;
  std::int32_t prev = -1;  // index of the left neighbour, -1 at the front
  std::int32_t next = -1;  // index of the right neighbour, -1 at the back
};

/// A possible merge of `left` with its right neighbour `right`, valid while both still hold
/// the ids recorded here and are still adjacent.
struct merge_candidate {
  double priority = 0;
  std::int32_t left = -1;
  std::int32_t right = -1;
  std::int32_t left_id = -1;
  std::int32_t right_id = -1;
  std::int32_t merged_id = -1;
};

/// Heap order: best priority first; ties go to the leftmost pair (symbol indices grow left to
/// right).
struct merge_ranks_lower {
  bool operator()(const merge_candidate& a, const merge_candidate& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.left > b.left;
  }
};

}  // namespace detail

/// Merges `ids` in place as described above.
template <class FindMerge>
void merge_best_pairs(std::vector<std::int32_t>& ids, const FindMerge& find_merge) {
  using detail::merge_candidate;
  using detail::merge_symbol;
  const auto num_symbols = static_cast<std::int32_t>(ids.size());
  std::vector<merge_symbol> symbols(ids.size());
  for (std::int32_t i = 0; i < num_symbols; ++i) symbols[i] = {ids[i], i - 1, i + 1 < num_symbols ? i + 1 : -1};
  std::priority_queue<merge_candidate, std::vector<merge_candidate>, detail::merge_ranks_lower> queue;
  const auto push = [&](std::int32_t left) {
    if (left < 0) return;
    const std::int32_t right = symbols[left].next;
    if (right < 0) return;
    const std::optional<pair_merge> m = find_merge(symbols[left].id, symbols[right].id);
    if (m) queue.push({m->priority, left, right, symbols[left].id, symbols[right].id, m->merged_id});
  };
  for (std::int32_t i = 0; i + 1 < num_symbols; ++i) push(i);
  while (!queue.empty()) {
    const merge_candidate best = queue.top();
    queue.pop();
    merge_symbol& left = symbols[best.left];
    if (left.id != best.left_id || left.next != best.right || symbols[best.right].id != best.right_id) continue;
    merge_symbol& right = symbols[best.right];
    left.id = best.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;
    right = merge_symbol{};
    push(left.prev);
    push(best.left);
  }
  ids.clear();
  // Symbol 0 is never merged away (only right partners are), so the list starts there.
  for (std::int32_t i = num_symbols > 0 ? 0 : -1; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace troupe
