#include "runtime/moe/placement.hpp"

#include <algorithm>
#include <utility>

#include "runtime/common/error.hpp"

namespace troupe::moe {

expert_placement expert_placement::round_robin(int32_t n_layers, int32_t n_experts, int32_t num_shards) {
  TROUPE_ASSERT(n_layers >= 1 && n_experts >= 1);
  TROUPE_ASSERT(num_shards >= 1);
  std::vector<std::vector<int32_t>> replicas(static_cast<size_t>(n_layers) * n_experts);
  for (size_t i = 0; i < replicas.size(); i++)  // expert i % n_experts of layer i / n_experts
    replicas[i] = {static_cast<int32_t>(i % static_cast<size_t>(n_experts)) % num_shards};
  return of_replicas(n_layers, n_experts, num_shards, std::move(replicas));
}

expert_placement expert_placement::of_replicas(int32_t n_layers, int32_t n_experts, int32_t num_shards,
                                               std::vector<std::vector<int32_t>> replicas) {
  TROUPE_ASSERT(n_layers >= 1 && n_experts >= 1);
  TROUPE_ASSERT(num_shards >= 1);
  expert_placement p;
  p.n_layers_ = n_layers;
  p.n_experts_ = n_experts;
  p.num_shards_ = num_shards;
  p.replicas_ = std::move(replicas);
  for (std::vector<int32_t>& r : p.replicas_) std::sort(r.begin(), r.end());
  p.check_invariants();
  return p;
}

const std::vector<int32_t>& expert_placement::replicas(int32_t layer, int32_t expert) const {
  TROUPE_ASSERT(layer >= 0 && layer < n_layers_);
  TROUPE_ASSERT(expert >= 0 && expert < n_experts_);
  return replicas_[static_cast<size_t>(layer) * n_experts_ + expert];
}

bool expert_placement::holds(int32_t shard, int32_t layer, int32_t expert) const {
  const std::vector<int32_t>& r = replicas(layer, expert);
  return std::binary_search(r.begin(), r.end(), shard);
}

bool expert_placement::can_add_replica(int32_t layer, int32_t expert, int32_t shard) const {
  return shard >= 0 && shard < num_shards_ && !holds(shard, layer, expert);
}

void expert_placement::add_replica(int32_t layer, int32_t expert, int32_t shard) {
  TROUPE_ASSERT(can_add_replica(layer, expert, shard));
  std::vector<int32_t>& r = replicas_[static_cast<size_t>(layer) * n_experts_ + expert];
  r.insert(std::upper_bound(r.begin(), r.end(), shard), shard);
  check_invariants();
}

void expert_placement::check_invariants() const {
  TROUPE_ASSERT(replicas_.size() == static_cast<size_t>(n_layers_) * n_experts_);
  for (const std::vector<int32_t>& r : replicas_) {
    TROUPE_ASSERT_MSG(!r.empty(), "every expert has a replica");
    TROUPE_ASSERT(r.front() >= 0 && r.back() < num_shards_);
    TROUPE_ASSERT_MSG(std::adjacent_find(r.begin(), r.end(), [](int32_t a, int32_t b) { return a >= b; }) == r.end(),
                      "an expert's replicas are on distinct shards, increasing");
  }
}

namespace {

/// A row routed to an expert, and its gate there.
struct routed_row {
  int32_t row = 0;
  float gate = 0.0f;
};

/// The rows routed to each expert (increasing), with their gates.
std::vector<std::vector<routed_row>> rows_by_expert(const routing& r, int32_t n_experts) {
  std::vector<std::vector<routed_row>> out(static_cast<size_t>(n_experts));
  for (int32_t row = 0; row < r.num_rows; row++)
    for (int32_t i = 0; i < r.top_k; i++) {
      const expert_choice& c = r.row(row)[i];
      TROUPE_ASSERT(c.expert >= 0 && c.expert < n_experts);
      out[static_cast<size_t>(c.expert)].push_back({row, c.gate});
    }
  return out;
}

/// Gives `request` the input rows its batches name, each once, increasing.
void gather_input(expert_request& request, const float* input, int32_t dim) {
  for (const expert_batch& b : request.batches) request.rows.insert(request.rows.end(), b.rows.begin(), b.rows.end());
  std::sort(request.rows.begin(), request.rows.end());
  request.rows.erase(std::unique(request.rows.begin(), request.rows.end()), request.rows.end());
  request.input.resize(request.rows.size() * static_cast<size_t>(dim));
  for (size_t i = 0; i < request.rows.size(); i++)
    std::copy_n(input + static_cast<int64_t>(request.rows[i]) * dim, dim, &request.input[i * dim]);
}

}  // namespace

dispatch_plan plan_dispatch(const expert_placement& placement, int32_t layer, const routing& routing,
                            const float* input, int32_t dim, int64_t turn) {
  TROUPE_ASSERT(dim >= 1);
  TROUPE_ASSERT(turn >= 0);
  dispatch_plan plan;
  plan.requests.resize(static_cast<size_t>(placement.num_shards()));
  for (expert_request& q : plan.requests) q.layer = layer, q.dim = dim;
  std::vector<int32_t> num_slots(static_cast<size_t>(placement.num_shards()), 0);
  const auto by_expert = rows_by_expert(routing, placement.n_experts());
  for (int32_t e = 0; e < placement.n_experts(); e++) {
    const std::vector<routed_row>& rows = by_expert[static_cast<size_t>(e)];
    const std::vector<int32_t>& shards = placement.replicas(layer, e);
    const int64_t n = static_cast<int64_t>(rows.size()), m = static_cast<int64_t>(shards.size());
    for (int64_t i = 0; i < m; i++) {
      const int64_t begin = i * n / m, end = (i + 1) * n / m;
      if (begin == end) continue;
      const int32_t shard = shards[static_cast<size_t>((i + turn) % m)];
      expert_batch batch{e, {}};
      for (int64_t j = begin; j < end; j++) {
        const routed_row& r = rows[static_cast<size_t>(j)];
        batch.rows.push_back(r.row);
        plan.entries.push_back({e, r.row, r.gate, shard, num_slots[static_cast<size_t>(shard)]++});
      }
      plan.requests[static_cast<size_t>(shard)].batches.push_back(std::move(batch));
    }
  }
  for (expert_request& q : plan.requests) gather_input(q, input, dim);
  return plan;
}

void combine(const dispatch_plan& plan, const std::vector<expert_reply>& replies, float* out, int32_t num_rows,
             int32_t dim) {
  TROUPE_ASSERT(replies.size() == plan.requests.size());
  for (size_t s = 0; s < replies.size(); s++) {
    size_t num_outputs = 0;
    for (const expert_batch& b : plan.requests[s].batches) num_outputs += b.rows.size();
    TROUPE_ASSERT_MSG(replies[s].output.size() == num_outputs * static_cast<size_t>(dim),
                      "a shard's reply holds one output row per row of its request's batches");
  }
  std::fill_n(out, static_cast<int64_t>(num_rows) * dim, 0.0f);
  for (const combine_entry& e : plan.entries) {
    TROUPE_ASSERT(e.row >= 0 && e.row < num_rows);
    const float* o = &replies[static_cast<size_t>(e.shard)].output[static_cast<size_t>(e.slot) * dim];  // (dim)
    float* y = out + static_cast<int64_t>(e.row) * dim;
    for (int32_t d = 0; d < dim; d++) y[d] += e.gate * o[d];
  }
}

}  // namespace troupe::moe
