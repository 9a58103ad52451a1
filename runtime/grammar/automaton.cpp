#include "runtime/grammar/automaton.hpp"

#include <algorithm>
#include <unordered_set>

namespace troupe::grammar {
namespace {

constexpr int32_t unknown = -2;

uint64_t key(int32_t pos, int32_t parent) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
}

}  // namespace

automaton::automaton(std::shared_ptr<const grammar> g) : grammar_(std::move(g)) {
  TROUPE_ASSERT(grammar_ != nullptr && grammar_->num_rules() > 0);
  std::vector<int32_t> leaves;
  bool accepting = false;
  for (const int32_t start : grammar_->alternatives[0]) expand(start, -1, leaves, accepting);
  const int32_t first = intern_state(std::move(leaves), accepting);
  TROUPE_ASSERT(first == initial());
}

int32_t automaton::intern_node(int32_t pos, int32_t parent) {
  const auto [it, fresh] = node_ids_.emplace(key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back(node{pos, parent});
  return it->second;
}

int32_t automaton::intern_state(std::vector<int32_t> leaves, bool accepting) {
  std::sort(leaves.begin(), leaves.end());
  leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
  std::vector<int32_t> k = leaves;
  if (accepting) k.push_back(-1);
  const auto [it, fresh] = state_ids_.emplace(std::move(k), static_cast<int32_t>(states_.size()));
  if (fresh) states_.push_back(state{std::move(leaves), accepting, nullptr});
  return it->second;
}

void automaton::expand(int32_t pos, int32_t parent, std::vector<int32_t>& leaves, bool& accepting) {
  // A worklist, not recursion: popping through many finished rules must not grow the C stack.
  std::vector<std::pair<int32_t, int32_t>> work{{pos, parent}};
  std::unordered_set<uint64_t> seen;  // membership only
  while (!work.empty()) {
    const auto [p, up] = work.back();
    work.pop_back();
    if (!seen.insert(key(p, up)).second) continue;
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
}

int32_t automaton::advance(int32_t s, uint8_t byte) {
  TROUPE_ASSERT(s >= 0 && static_cast<size_t>(s) < states_.size());
  if (states_[static_cast<size_t>(s)].next == nullptr) {
    states_[static_cast<size_t>(s)].next = std::make_unique<std::array<int32_t, 256>>();
    states_[static_cast<size_t>(s)].next->fill(unknown);
  }
  int32_t known = (*states_[static_cast<size_t>(s)].next)[byte];
  if (known != unknown) return known;
  std::vector<int32_t> leaves;
  bool accepting = false;
  const std::vector<int32_t> from = states_[static_cast<size_t>(s)].leaves;  // copy: states_ may grow
  for (const int32_t leaf : from) {
    const node n = nodes_[static_cast<size_t>(leaf)];
    const element& e = grammar_->elements[static_cast<size_t>(n.pos)];
    if (byte >= e.lo && byte <= e.hi) expand(n.pos + 1, n.parent, leaves, accepting);
  }
  known = leaves.empty() && !accepting ? dead : intern_state(std::move(leaves), accepting);
  (*states_[static_cast<size_t>(s)].next)[byte] = known;
  return known;
}

size_t automaton::memory_bytes() const {
  size_t bytes = nodes_.size() * (sizeof(node) + 2 * sizeof(uint64_t));
  for (const state& s : states_)
    bytes += sizeof(state) + s.leaves.size() * sizeof(int32_t) * 2 + (s.next ? sizeof(*s.next) : 0);
  return bytes;
}

void automaton::check_invariants() const {
  TROUPE_ASSERT(state_ids_.size() == states_.size());
  TROUPE_ASSERT(node_ids_.size() == nodes_.size());
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
