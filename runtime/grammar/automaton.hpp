#pragma once

/// Runs a byte grammar as a pushdown automaton with persistent stacks, built lazily.
///
/// A stack is a linked list of interned nodes (grammar position, parent node): stacks that share
/// a tail share its nodes, so a state holds many stacks for the cost of their tops. A *leaf* is a
/// stack whose top is a byte element — the bytes the grammar can take next. A state is the sorted
/// set of its leaves plus whether the text so far is a complete match (some stack emptied);
/// states are interned, so equal states have equal ids, and each state's transition on a byte is
/// computed once and remembered. Because the grammar passed `check` (no left recursion),
/// expanding a position always terminates.
///
/// Not thread-safe: each step executor keeps its own automata (token_mask.hpp). Memory grows
/// with the distinct states visited (num_states, memory_bytes).

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/grammar/grammar.hpp"

namespace troupe::grammar {

class automaton {
 public:
  static constexpr int32_t dead = -1;  ///< no stack survives: the text left the grammar

  explicit automaton(std::shared_ptr<const grammar> g);

  /// The state before any byte.
  [[nodiscard]] static int32_t initial() { return 0; }
  /// The state after `byte`, or `dead`.
  [[nodiscard]] int32_t advance(int32_t state, uint8_t byte);
  /// Whether the text that led to `state` is a complete match.
  [[nodiscard]] bool accepting(int32_t state) const { return states_.at(static_cast<size_t>(state)).accepting; }
  /// Whether some byte may follow (the grammar is not finished in every way).
  [[nodiscard]] bool can_continue(int32_t state) const { return !states_.at(static_cast<size_t>(state)).leaves.empty(); }

  [[nodiscard]] size_t num_states() const { return states_.size(); }
  [[nodiscard]] size_t memory_bytes() const;
  void check_invariants() const;

 private:
  struct node {
    int32_t pos;     ///< a byte element (a leaf) or where to continue after a rule (a return)
    int32_t parent;  ///< -1: the bottom of the stack
  };
  struct state {
    std::vector<int32_t> leaves;  ///< sorted node ids
    bool accepting = false;
    std::unique_ptr<std::array<int32_t, 256>> next;  ///< transitions; unknown = -2, made on first use
  };

  [[nodiscard]] int32_t intern_node(int32_t pos, int32_t parent);
  [[nodiscard]] int32_t intern_state(std::vector<int32_t> leaves, bool accepting);
  /// Adds the leaves reachable from (pos, parent) without consuming a byte.
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& leaves, bool& accepting);

  std::shared_ptr<const grammar> grammar_;
  std::vector<node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;  // (pos, parent) -> node (lookups only)
  std::vector<state> states_;
  std::map<std::vector<int32_t>, int32_t> state_ids_;  // leaves (+ -1 if accepting) -> state
};

}  // namespace troupe::grammar
