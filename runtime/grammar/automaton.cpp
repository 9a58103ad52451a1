#include "runtime/grammar/automaton.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>

namespace troupe::grammar {
namespace {

constexpr int32_t unknown = -2;
/// What memory_bytes counts for a node: the node and its entry in the interning map.
constexpr int64_t node_bytes = 24;

uint64_t key(int32_t pos, int32_t parent) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
}

}  // namespace

automaton::automaton(std::shared_ptr<const grammar> g, const grammar_limits& limits)
    : grammar_(std::move(g)), limits_(limits) {
  TROUPE_ASSERT(grammar_ != nullptr && grammar_->num_rules() > 0);
}

expected<automaton> automaton::start(std::shared_ptr<const grammar> g, const grammar_limits& limits) {
  automaton a(std::move(g), limits);
  std::vector<std::pair<int32_t, int32_t>> work;
  for (const int32_t start : a.grammar_->alternatives[0]) work.emplace_back(start, -1);
  auto first = a.build(std::move(work));
  if (!first) return tl::unexpected(first.error());
  // A grammar that passed `check` matches some text, so its first state is never dead.
  TROUPE_ASSERT(*first == initial());
  return a;
}

int32_t automaton::intern_node(int32_t pos, int32_t parent) {
  const auto [it, fresh] = node_ids_.emplace(key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (fresh) {
    nodes_.push_back(node{pos, parent});
    memory_bytes_ += node_bytes;
  }
  return it->second;
}

int32_t automaton::intern_state(std::vector<int32_t> leaves, bool accepting) {
  std::sort(leaves.begin(), leaves.end());
  leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
  std::vector<int32_t> k = leaves;
  if (accepting) k.push_back(-1);
  const auto [it, fresh] = state_ids_.emplace(std::move(k), static_cast<int32_t>(states_.size()));
  if (fresh) {
    // The leaves twice: the state's and the interning map's key.
    memory_bytes_ += static_cast<int64_t>(sizeof(state) + 2 * leaves.size() * sizeof(int32_t));
    states_.emplace_back(std::move(leaves), accepting);
  }
  return it->second;
}

expected<void> automaton::check_memory() const {
  if (memory_bytes_ <= limits_.matcher_memory_bytes_max) return {};
  return fail(errc::invalid_argument, "the grammar's automaton grew to " + std::to_string(memory_bytes_) +
                                          " bytes, more than the " + std::to_string(limits_.matcher_memory_bytes_max) +
                                          " allowed (matcher_memory_bytes_max); simplify the grammar");
}

expected<int32_t> automaton::build(std::vector<std::pair<int32_t, int32_t>> work) {
  if (auto ok = check_memory(); !ok) return tl::unexpected(ok.error());
  // A worklist, not recursion: popping through many finished rules must not grow the C stack.
  // Work is pushed in reverse so that alternatives are visited in order.
  std::reverse(work.begin(), work.end());
  std::vector<int32_t> leaves;
  bool accepting = false;
  std::unordered_set<uint64_t> seen;  // stack tops visited (membership only)
  while (!work.empty()) {
    const auto [p, up] = work.back();
    work.pop_back();
    if (!seen.insert(key(p, up)).second) continue;
    num_visits_++;
    if (static_cast<int64_t>(seen.size()) > limits_.num_stacks_per_state_max)
      return fail(errc::invalid_argument,
                  "the grammar's automaton needs more than " + std::to_string(limits_.num_stacks_per_state_max) +
                      " stacks for one state (num_stacks_per_state_max): its repeats or recursion are ambiguous; "
                      "simplify the grammar");
    const element& e = grammar_->elements[static_cast<size_t>(p)];
    switch (e.type) {
      case element::kind::bytes:
        leaves.push_back(intern_node(p, up));
        break;
      case element::kind::end:
        if (up < 0) {
          accepting = true;
        } else {
          const node& ret = nodes_[static_cast<size_t>(up)];
          work.emplace_back(ret.pos, ret.parent);
        }
        break;
      case element::kind::rule: {
        const int32_t ret = intern_node(p + 1, up);
        const std::vector<int32_t>& starts = grammar_->alternatives[static_cast<size_t>(e.rule)];
        for (auto it = starts.rbegin(); it != starts.rend(); ++it) work.emplace_back(*it, ret);
        break;
      }
    }
  }
  if (leaves.empty() && !accepting) return dead;
  const int32_t s = intern_state(std::move(leaves), accepting);
  if (auto ok = check_memory(); !ok) return tl::unexpected(ok.error());
  return s;
}

expected<int32_t> automaton::advance(int32_t s, uint8_t byte) {
  TROUPE_ASSERT(s >= 0 && static_cast<size_t>(s) < states_.size());
  if (states_[static_cast<size_t>(s)].next == nullptr) {
    states_[static_cast<size_t>(s)].next = std::make_unique<transitions>();
    states_[static_cast<size_t>(s)].next->fill(unknown);
    memory_bytes_ += static_cast<int64_t>(sizeof(transitions));
  }
  const int32_t known = (*states_[static_cast<size_t>(s)].next)[byte];
  if (known != unknown) return known;
  std::vector<std::pair<int32_t, int32_t>> work;
  for (const int32_t leaf : states_[static_cast<size_t>(s)].leaves) {
    const node n = nodes_[static_cast<size_t>(leaf)];
    const element& e = grammar_->elements[static_cast<size_t>(n.pos)];
    if (byte >= e.lo && byte <= e.hi) work.emplace_back(n.pos + 1, n.parent);
  }
  auto next = build(std::move(work));
  if (!next) return next;
  (*states_[static_cast<size_t>(s)].next)[byte] = *next;
  return next;
}

void automaton::check_invariants() const {
  TROUPE_ASSERT(state_ids_.size() == states_.size());
  TROUPE_ASSERT(node_ids_.size() == nodes_.size());
  TROUPE_ASSERT(memory_bytes_ >= static_cast<int64_t>(nodes_.size()) * node_bytes);
  for (const state& s : states_) {
    TROUPE_ASSERT(std::is_sorted(s.leaves.begin(), s.leaves.end()));
    for (const int32_t leaf : s.leaves) {
      TROUPE_ASSERT(leaf >= 0 && static_cast<size_t>(leaf) < nodes_.size());
      TROUPE_ASSERT(grammar_->elements[static_cast<size_t>(nodes_[static_cast<size_t>(leaf)].pos)].type ==
                    element::kind::bytes);
    }
    if (s.next == nullptr) continue;
    for (const int32_t t : *s.next) TROUPE_ASSERT(t >= unknown && t < static_cast<int32_t>(states_.size()));
  }
  for (const node& n : nodes_) TROUPE_ASSERT(n.parent >= -1 && n.parent < static_cast<int32_t>(nodes_.size()));
}

}  // namespace troupe::grammar
