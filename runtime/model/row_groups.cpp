#include "runtime/model/row_groups.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "runtime/common/error.hpp"

namespace troupe::model {
namespace {

int32_t find_root(std::vector<int32_t>& parent, int32_t r) {
  while (parent[r] != r) r = parent[r] = parent[parent[r]];
  return r;
}

}  // namespace

std::vector<std::vector<int32_t>> independent_row_groups(const std::vector<forward_row>& rows, int32_t block_size,
                                                         int32_t max_groups,
                                                         const std::function<double(int32_t)>& cost) {
  TROUPE_ASSERT(block_size > 0 && max_groups > 0);
  const int32_t n = static_cast<int32_t>(rows.size());
  // The block each row writes, sorted by block (then row) for lookups.
  std::vector<std::pair<int32_t, int32_t>> written;
  written.reserve(rows.size());
  for (int32_t r = 0; r < n; r++) written.emplace_back(rows[r].block_table[rows[r].position / block_size], r);
  std::sort(written.begin(), written.end());
  std::vector<int32_t> parent(rows.size());
  std::iota(parent.begin(), parent.end(), 0);
  for (int32_t r = 0; r < n; r++) {
    for (int32_t b = 0; b <= rows[r].position / block_size; b++) {
      const int32_t block = rows[r].block_table[b];
      for (auto it = std::lower_bound(written.begin(), written.end(), std::make_pair(block, 0));
           it != written.end() && it->first == block; ++it) {
        const int32_t a = find_root(parent, r), c = find_root(parent, it->second);
        parent[std::max(a, c)] = std::min(a, c);  // the root is the set's lowest row
      }
    }
  }
  // The independent sets, in order of their lowest row.
  std::vector<std::vector<int32_t>> sets;
  std::vector<int32_t> set_of(rows.size(), -1);
  std::vector<double> set_cost;
  for (int32_t r = 0; r < n; r++) {
    const int32_t root = find_root(parent, r);
    if (set_of[root] < 0) {
      set_of[root] = static_cast<int32_t>(sets.size());
      sets.emplace_back();
      set_cost.push_back(0);
    }
    sets[set_of[root]].push_back(r);
    const double c = cost(r);
    TROUPE_ASSERT(c > 0);
    set_cost[set_of[root]] += c;
  }
  std::vector<int32_t> order(sets.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return set_cost[a] > set_cost[b]; });
  const size_t num_groups = std::min(sets.size(), static_cast<size_t>(max_groups));
  std::vector<std::vector<int32_t>> groups(num_groups);
  std::vector<double> load(num_groups, 0);
  for (int32_t s : order) {
    const size_t g = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[g] += set_cost[s];
    groups[g].insert(groups[g].end(), sets[s].begin(), sets[s].end());
  }
  for (auto& g : groups) std::sort(g.begin(), g.end());
  return groups;
}

}  // namespace troupe::model
