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
/// Bounded (grammar_limits): building one state visits at most num_stacks_per_state_max stack
/// tops, and the automaton's memory (nodes, states, transitions) stays within
/// matcher_memory_bytes_max. Ambiguous grammars (`a{0,9}{0,9}`, `x ::= "a" | x x`) hold more
/// stacks with every byte; past a limit building the state is an error naming it, which fails
/// the one request whose grammar it is. The initial state is built by `start`, which `compile`
/// runs, so a grammar whose first state is over a limit is refused before its request is
/// admitted.
///
/// Not thread-safe: each step executor keeps its own automata (copies of the compiled one's).

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

  /// The automaton of `g` with its initial state built, or the error naming the limit that
  /// state crosses.
  [[nodiscard]] static expected<automaton> start(std::shared_ptr<const grammar> g, const grammar_limits& limits = {});

  /// The state before any byte.
  [[nodiscard]] static int32_t initial() { return 0; }
  /// The state after `byte`, or `dead`; an error naming the limit where building that state
  /// crosses one (the automaton stays consistent; past the memory limit every state not built
  /// yet fails).
  [[nodiscard]] expected<int32_t> advance(int32_t state, uint8_t byte);
  /// Whether the text that led to `state` is a complete match.
  [[nodiscard]] bool accepting(int32_t state) const { return states_.at(static_cast<size_t>(state)).accepting; }
  /// Whether some byte may follow (the grammar is not finished in every way).
  [[nodiscard]] bool can_continue(int32_t state) const { return !states_.at(static_cast<size_t>(state)).leaves.empty(); }

  [[nodiscard]] size_t num_states() const { return states_.size(); }
  [[nodiscard]] size_t num_nodes() const { return nodes_.size(); }
  /// Stack tops visited so far, by every state built (the work done).
  [[nodiscard]] int64_t num_visits() const { return num_visits_; }
  /// An estimate of the memory held (what matcher_memory_bytes_max bounds).
  [[nodiscard]] int64_t memory_bytes() const { return memory_bytes_; }
  [[nodiscard]] const grammar_limits& limits() const { return limits_; }
  void check_invariants() const;

 private:
  struct node {
    int32_t pos;     ///< a byte element (a leaf) or where to continue after a rule (a return)
    int32_t parent;  ///< -1: the bottom of the stack
  };
  using transitions = std::array<int32_t, 256>;
  struct state {
    state(std::vector<int32_t> l, bool a) : leaves(std::move(l)), accepting(a) {}
    state(const state& s)  // a copied automaton copies its transitions too
        : leaves(s.leaves), accepting(s.accepting), next(s.next ? std::make_unique<transitions>(*s.next) : nullptr) {}
    state(state&&) noexcept = default;
    state& operator=(const state&) = delete;
    state& operator=(state&&) noexcept = default;

    std::vector<int32_t> leaves;  ///< sorted node ids
    bool accepting = false;
    std::unique_ptr<transitions> next;  ///< unknown = -2, made on first use
  };

  automaton(std::shared_ptr<const grammar> g, const grammar_limits& limits);

  [[nodiscard]] int32_t intern_node(int32_t pos, int32_t parent);
  [[nodiscard]] int32_t intern_state(std::vector<int32_t> leaves, bool accepting);
  /// The state of the leaves reachable from the stack tops `work` (grammar position, parent
  /// node) without consuming a byte, or `dead` where there are none and no stack empties.
  [[nodiscard]] expected<int32_t> build(std::vector<std::pair<int32_t, int32_t>> work);
  [[nodiscard]] expected<void> check_memory() const;

  std::shared_ptr<const grammar> grammar_;
  grammar_limits limits_;
  int64_t memory_bytes_ = 0;
  int64_t num_visits_ = 0;
  std::vector<node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;  // (pos, parent) -> node (lookups only)
  std::vector<state> states_;
  std::map<std::vector<int32_t>, int32_t> state_ids_;  // leaves (+ -1 if accepting) -> state
};

}  // namespace troupe::grammar
