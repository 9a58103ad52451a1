#include "runtime/moe/rebalance.hpp"

#include <algorithm>
#include <string>
#include <tuple>

namespace troupe::moe {

expert_load::expert_load(int32_t n_layers, int32_t n_experts)
    : n_layers_(n_layers), n_experts_(n_experts), rows_(static_cast<size_t>(n_layers) * n_experts, 0) {
  TROUPE_ASSERT(n_layers >= 1 && n_experts >= 1);
}

int64_t expert_load::rows(int32_t layer, int32_t expert) const {
  TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
  TROUPE_ASSERT(expert >= 0 && expert < n_experts_);
  return rows_[static_cast<size_t>(layer) * n_experts_ + expert];
}

int64_t expert_load::layer_rows(int32_t layer) const {
  int64_t total = 0;
  for (int32_t e = 0; e < n_experts_; e++) total += rows(layer, e);
  return total;
}

void expert_load::add(int32_t layer, int32_t expert, int64_t rows) {
  TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
  TROUPE_ASSERT(expert >= 0 && expert < n_experts_);
  TROUPE_ASSERT(rows >= 0);
  rows_[static_cast<size_t>(layer) * n_experts_ + expert] += rows;
}

void expert_load::add(const std::vector<expert_request>& requests) {
  for (const expert_request& q : requests)
    for (const expert_batch& b : q.batches) add(q.layer, b.expert, static_cast<int64_t>(b.rows.size()));
}

shard_load::shard_load(int32_t n_layers, int32_t num_shards)
    : n_layers_(n_layers), num_shards_(num_shards), rows_(static_cast<size_t>(n_layers) * num_shards, 0) {
  TROUPE_ASSERT(n_layers >= 1 && num_shards >= 1);
}

int64_t shard_load::rows(int32_t layer, int32_t shard) const {
  TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
  TROUPE_ASSERT(shard >= 0 && shard < num_shards_);
  return rows_[static_cast<size_t>(layer) * num_shards_ + shard];
}

void shard_load::add(int32_t layer, int32_t shard, int64_t rows) {
  TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
  TROUPE_ASSERT(shard >= 0 && shard < num_shards_);
  TROUPE_ASSERT(rows >= 0);
  rows_[static_cast<size_t>(layer) * num_shards_ + shard] += rows;
}

void shard_load::add(const std::vector<expert_request>& requests) {
  TROUPE_ASSERT(requests.size() == static_cast<size_t>(num_shards_));
  for (size_t s = 0; s < requests.size(); s++)
    for (const expert_batch& b : requests[s].batches)
      add(requests[s].layer, static_cast<int32_t>(s), static_cast<int64_t>(b.rows.size()));
}

int64_t replica_rows(int64_t n, int64_t m, int64_t i) {
  TROUPE_ASSERT(n >= 0 && m >= 1);
  TROUPE_ASSERT(i >= 0 && i < m);
  return (i + 1) * n / m - i * n / m;
}

std::vector<int64_t> layer_shard_rows(const expert_placement& placement, int32_t layer,
                                      const std::vector<int64_t>& expert_rows, int64_t turn) {
  TROUPE_ASSERT(expert_rows.size() == static_cast<size_t>(placement.n_experts()));
  TROUPE_ASSERT(turn >= 0);
  std::vector<int64_t> out(static_cast<size_t>(placement.num_shards()), 0);
  for (int32_t e = 0; e < placement.n_experts(); e++) {
    const std::vector<int32_t>& shards = placement.replicas(layer, e);
    const auto m = static_cast<int64_t>(shards.size());
    for (int64_t i = 0; i < m; i++)
      out[static_cast<size_t>(shards[static_cast<size_t>((i + turn) % m)])] +=
          replica_rows(expert_rows[static_cast<size_t>(e)], m, i);
  }
  return out;
}

shard_load expected_shard_load(const expert_placement& placement, const expert_load& load) {
  TROUPE_ASSERT(placement.n_layers() == load.n_layers() && placement.n_experts() == load.n_experts());
  shard_load out(placement.n_layers(), placement.num_shards());
  std::vector<int64_t> rows(static_cast<size_t>(placement.n_experts()));
  for (int32_t l = 0; l < placement.n_layers(); l++) {
    for (int32_t e = 0; e < placement.n_experts(); e++) rows[static_cast<size_t>(e)] = load.rows(l, e);
    const std::vector<int64_t> shards = layer_shard_rows(placement, l, rows, 0);
    for (int32_t s = 0; s < placement.num_shards(); s++) out.add(l, s, shards[static_cast<size_t>(s)]);
  }
  return out;
}

double moe_lb(const shard_load& load) {
  int64_t sum_max = 0, sum_total = 0;
  for (int32_t l = 0; l < load.n_layers(); l++) {
    int64_t max = 0;
    for (int32_t s = 0; s < load.num_shards(); s++) {
      max = std::max(max, load.rows(l, s));
      sum_total += load.rows(l, s);
    }
    sum_max += max;
  }
  if (sum_total == 0) return 1.0;
  // Σ mean = Σ total / num_shards.
  return static_cast<double>(sum_max) * load.num_shards() / static_cast<double>(sum_total);
}

namespace {

/// How many replicas each expert of `layer` gets (rebalance's first half).
std::vector<int32_t> replica_counts(const expert_load& load, int32_t layer, int32_t num_shards, int32_t capacity) {
  const int32_t n_experts = load.n_experts();
  std::vector<int32_t> count(static_cast<size_t>(n_experts), 1);
  int64_t free_slots = static_cast<int64_t>(num_shards) * capacity - n_experts;
  const int64_t total = load.layer_rows(layer);
  const auto rows = [&](int32_t e) { return load.rows(layer, e); };
  const auto replicas = [&](int32_t e) { return static_cast<int64_t>(count[static_cast<size_t>(e)]); };
  for (; free_slots > 0; free_slots--) {
    int32_t hottest = -1;  // the most rows per replica; a tie keeps the lower id
    for (int32_t e = 0; e < n_experts; e++)
      if (replicas(e) < num_shards && (hottest < 0 || rows(e) * replicas(hottest) > rows(hottest) * replicas(e)))
        hottest = e;
    // Rows per replica above the layer's mean per shard: rows / replicas > total / num_shards.
    if (hottest < 0 || rows(hottest) * num_shards <= total * replicas(hottest)) break;
    count[static_cast<size_t>(hottest)]++;
  }
  return count;
}

/// One replica to pack: its expected rows, its expert, its index among the expert's replicas.
struct replica_item {
  int64_t rows = 0;
  int32_t expert = 0;
  int32_t index = 0;
};

/// A layer's replicas packed onto shards: the shards holding each expert, and the most rows any
/// shard computes.
struct packed_layer {
  std::vector<std::vector<int32_t>> shards_of;  // by expert
  int64_t max_rows = 0;
};

/// Packs `layer`'s replicas (`count` per expert), most rows first, onto the least-loaded shard
/// with room that lacks the expert (a replica finding none is dropped).
packed_layer pack_layer(const expert_load& load, int32_t layer, const std::vector<int32_t>& count, int32_t num_shards,
                        int32_t capacity) {
  const int32_t n_experts = load.n_experts();
  std::vector<replica_item> items;
  for (int32_t e = 0; e < n_experts; e++)
    for (int32_t i = 0; i < count[static_cast<size_t>(e)]; i++)
      items.push_back({replica_rows(load.rows(layer, e), count[static_cast<size_t>(e)], i), e, i});
  std::sort(items.begin(), items.end(), [](const replica_item& a, const replica_item& b) {
    return std::tuple(-a.rows, a.expert, a.index) < std::tuple(-b.rows, b.expert, b.index);
  });
  packed_layer out;
  out.shards_of.resize(static_cast<size_t>(n_experts));
  std::vector<int64_t> rows_on(static_cast<size_t>(num_shards), 0);
  std::vector<int32_t> used(static_cast<size_t>(num_shards), 0);
  for (const replica_item& item : items) {
    std::vector<int32_t>& shards = out.shards_of[static_cast<size_t>(item.expert)];
    int32_t best = -1;
    for (int32_t s = 0; s < num_shards; s++) {
      const bool has_room = used[static_cast<size_t>(s)] < capacity &&
                            std::find(shards.begin(), shards.end(), s) == shards.end();
      if (has_room && (best < 0 || rows_on[static_cast<size_t>(s)] < rows_on[static_cast<size_t>(best)])) best = s;
    }
    if (best < 0) continue;  // every shard with room holds this expert already
    shards.push_back(best);
    rows_on[static_cast<size_t>(best)] += item.rows;
    used[static_cast<size_t>(best)]++;
  }
  out.max_rows = *std::max_element(rows_on.begin(), rows_on.end());
  return out;
}

/// `layer`'s packing: replica_counts' replicas, then, while slots are free, the one more replica
/// (of any expert) whose packing lowers the busiest shard's rows the most (a tie: the lower
/// expert id); it stops when no replica lowers them.
packed_layer best_packing(const expert_load& load, int32_t layer, int32_t num_shards, int32_t capacity) {
  std::vector<int32_t> count = replica_counts(load, layer, num_shards, capacity);
  packed_layer best = pack_layer(load, layer, count, num_shards, capacity);
  int64_t free_slots = static_cast<int64_t>(num_shards) * capacity;
  for (int32_t c : count) free_slots -= c;
  for (; free_slots > 0; free_slots--) {
    int32_t chosen = -1;
    packed_layer better;
    for (int32_t e = 0; e < load.n_experts(); e++) {
      if (count[static_cast<size_t>(e)] >= num_shards) continue;
      count[static_cast<size_t>(e)]++;
      packed_layer p = pack_layer(load, layer, count, num_shards, capacity);
      count[static_cast<size_t>(e)]--;
      if (p.max_rows < (chosen < 0 ? best.max_rows : better.max_rows)) {
        chosen = e;
        better = std::move(p);
      }
    }
    if (chosen < 0) break;
    count[static_cast<size_t>(chosen)]++;
    best = std::move(better);
  }
  return best;
}

}  // namespace

expected<expert_placement> rebalance(const expert_load& load, int32_t num_shards, int32_t capacity) {
  if (num_shards < 1 || capacity < 1)
    return fail(errc::invalid_argument, "rebalance: " + std::to_string(num_shards) + " shards of capacity " +
                                            std::to_string(capacity) + ": both must be at least 1");
  if (static_cast<int64_t>(num_shards) * capacity < load.n_experts())
    return fail(errc::invalid_argument, "rebalance: " + std::to_string(num_shards) + " shards of capacity " +
                                            std::to_string(capacity) + " cannot hold " +
                                            std::to_string(load.n_experts()) + " experts per layer");
  std::vector<std::vector<int32_t>> replicas(static_cast<size_t>(load.n_layers()) * load.n_experts());
  for (int32_t l = 0; l < load.n_layers(); l++) {
    packed_layer p = best_packing(load, l, num_shards, capacity);
    for (int32_t e = 0; e < load.n_experts(); e++)
      replicas[static_cast<size_t>(l) * load.n_experts() + e] = std::move(p.shards_of[static_cast<size_t>(e)]);
  }
  return expert_placement::of_replicas(load.n_layers(), load.n_experts(), num_shards, std::move(replicas));
}

}  // namespace troupe::moe
