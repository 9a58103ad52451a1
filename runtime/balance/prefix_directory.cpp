#include "runtime/balance/prefix_directory.hpp"

#include "runtime/common/error.hpp"

namespace troupe::balance {

prefix_directory::prefix_directory(std::vector<int64_t> capacity_blocks) {
  for (int64_t capacity : capacity_blocks) {
    TROUPE_ASSERT(capacity >= 0);
    engines_.emplace_back().capacity_blocks = capacity;
  }
}

int64_t prefix_directory::cached_blocks(size_t engine, const std::vector<uint64_t>& chain) const {
  const engine_set& e = engines_.at(engine);
  int64_t found = 0;
  for (uint64_t hash : chain) {
    if (e.where.find(hash) == e.where.end()) break;
    found++;
  }
  return found;
}

void prefix_directory::record(size_t engine, const std::vector<uint64_t>& chain) {
  engine_set& e = engines_.at(engine);
  for (auto hash = chain.rbegin(); hash != chain.rend(); ++hash) {
    if (auto it = e.where.find(*hash); it != e.where.end()) {
      e.by_recency.splice(e.by_recency.begin(), e.by_recency, it->second);
    } else {
      e.by_recency.push_front(*hash);
      e.where.emplace(*hash, e.by_recency.begin());
    }
  }
  while (static_cast<int64_t>(e.by_recency.size()) > e.capacity_blocks) {
    e.where.erase(e.by_recency.back());
    e.by_recency.pop_back();
  }
}

void prefix_directory::forget(size_t engine) {
  engine_set& e = engines_.at(engine);
  e.by_recency.clear();
  e.where.clear();
}

int64_t prefix_directory::num_blocks(size_t engine) const {
  return static_cast<int64_t>(engines_.at(engine).by_recency.size());
}

std::vector<uint64_t> prefix_directory::blocks_by_recency(size_t engine) const {
  const engine_set& e = engines_.at(engine);
  return {e.by_recency.begin(), e.by_recency.end()};
}

void prefix_directory::check_invariants() const {
  for (const engine_set& e : engines_) {
    TROUPE_ASSERT(e.capacity_blocks >= 0);
    TROUPE_ASSERT(static_cast<int64_t>(e.by_recency.size()) <= e.capacity_blocks);
    TROUPE_ASSERT(e.where.size() == e.by_recency.size());
    for (auto it = e.by_recency.begin(); it != e.by_recency.end(); ++it) {
      auto entry = e.where.find(*it);
      TROUPE_ASSERT(entry != e.where.end());
      TROUPE_ASSERT(entry->second == it);
    }
  }
}

}  // namespace troupe::balance
