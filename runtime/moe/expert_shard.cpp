#include "runtime/moe/expert_shard.hpp"

#include <algorithm>
#include <functional>
#include <string>

namespace troupe::moe {

namespace cpu = kernels::cpu;

expert_shard::expert_shard(const model::checkpoint& ck, std::vector<expert_id> experts, model::kernel_path path)
    : ck_(ck), path_(path) {
  const model::moe_weights* m = ck_.moe();
  TROUPE_ASSERT_MSG(m != nullptr, "an expert shard holds an MoE checkpoint's experts");
  const model::model_config& c = ck_.config();
  std::sort(experts.begin(), experts.end());
  TROUPE_ASSERT_MSG(std::adjacent_find(experts.begin(), experts.end()) == experts.end(), "distinct experts");
  for (const expert_id& id : experts) {
    TROUPE_ASSERT(id.layer >= 0 && id.layer < c.n_layers);
    TROUPE_ASSERT(id.expert >= 0 && id.expert < m->n_experts);
    held_expert e{id, {}, {}, {}};
    if (path_ == model::kernel_path::fast) {
      const int64_t at = m->expert_offset(c, id.layer, id.expert);
      e.w1 = cpu::pack_matrix(m->w1 + at, c.hidden_dim, c.dim);
      e.w2 = cpu::pack_matrix(m->w2 + at, c.dim, c.hidden_dim);
      e.w3 = cpu::pack_matrix(m->w3 + at, c.hidden_dim, c.dim);
    }
    experts_.push_back(std::move(e));
  }
}

const expert_shard::held_expert* expert_shard::find(expert_id id) const {
  const auto it = std::lower_bound(experts_.begin(), experts_.end(), id,
                                   [](const held_expert& e, const expert_id& key) { return e.id < key; });
  return it != experts_.end() && it->id == id ? &*it : nullptr;
}

bool expert_shard::holds(expert_id id) const { return find(id) != nullptr; }

expected<void> expert_shard::check(const expert_request& q) const {
  const model::model_config& c = ck_.config();
  const auto bad = [](const std::string& what) { return fail(errc::invalid_argument, "expert request: " + what); };
  if (q.layer < 0 || q.layer >= c.n_layers)
    return bad("layer " + std::to_string(q.layer) + " is out of range (0.." + std::to_string(c.n_layers - 1) + ")");
  if (q.dim != c.dim) return bad("dim " + std::to_string(q.dim) + ", the model's is " + std::to_string(c.dim));
  if (std::adjacent_find(q.rows.begin(), q.rows.end(), std::greater_equal<>()) != q.rows.end())
    return bad("rows are not increasing");
  if (q.input.size() != q.rows.size() * static_cast<size_t>(c.dim))
    return bad("input holds " + std::to_string(q.input.size()) + " values for " + std::to_string(q.rows.size()) +
               " rows of dim " + std::to_string(c.dim));
  int32_t previous = -1;
  for (const expert_batch& b : q.batches) {
    if (b.expert <= previous) return bad("experts are not increasing");
    previous = b.expert;
    if (!holds({q.layer, b.expert}))
      return bad("this shard does not hold expert " + std::to_string(b.expert) + " of layer " +
                 std::to_string(q.layer));
    if (std::adjacent_find(b.rows.begin(), b.rows.end(), std::greater_equal<>()) != b.rows.end())
      return bad("expert " + std::to_string(b.expert) + "'s rows are not increasing");
    if (!std::includes(q.rows.begin(), q.rows.end(), b.rows.begin(), b.rows.end()))
      return bad("expert " + std::to_string(b.expert) + " names a row the request does not carry");
  }
  return {};
}

void expert_shard::run_expert(const held_expert& e, int32_t n, float* out) {
  const model::model_config& c = ck_.config();
  const model::moe_weights& m = *ck_.moe();
  const int64_t at = m.expert_offset(c, e.id.layer, e.id.expert);
  if (path_ == model::kernel_path::fast) {
    cpu::fast::matmul(hb_.data(), x_.data(), e.w1, n);
    cpu::fast::matmul(hb2_.data(), x_.data(), e.w3, n);
  } else {
    cpu::reference::matmul(hb_.data(), x_.data(), m.w1 + at, n, c.dim, c.hidden_dim);
    cpu::reference::matmul(hb2_.data(), x_.data(), m.w3 + at, n, c.dim, c.hidden_dim);
  }
  cpu::reference::swiglu(hb_.data(), hb2_.data(), n * c.hidden_dim);  // float32: the kernels' exp
  if (path_ == model::kernel_path::fast)
    cpu::fast::matmul(out, hb_.data(), e.w2, n);
  else
    cpu::reference::matmul(out, hb_.data(), m.w2 + at, n, c.hidden_dim, c.dim);
}

expected<expert_reply> expert_shard::compute(const expert_request& q) {
  if (auto ok = check(q); !ok) return tl::unexpected(ok.error());
  const int32_t dim = ck_.config().dim, hidden = ck_.config().hidden_dim;
  expert_reply reply;
  size_t num_outputs = 0;
  for (const expert_batch& b : q.batches) num_outputs += b.rows.size();
  reply.output.resize(num_outputs * dim);
  float* out = reply.output.data();
  for (const expert_batch& b : q.batches) {
    const auto n = static_cast<int32_t>(b.rows.size());
    x_.resize(std::max(x_.size(), b.rows.size() * dim));
    hb_.resize(std::max(hb_.size(), b.rows.size() * hidden));
    hb2_.resize(std::max(hb2_.size(), b.rows.size() * hidden));
    for (int32_t i = 0; i < n; i++) {
      const auto at = std::lower_bound(q.rows.begin(), q.rows.end(), b.rows[static_cast<size_t>(i)]) - q.rows.begin();
      std::copy_n(&q.input[static_cast<size_t>(at) * dim], dim, &x_[static_cast<size_t>(i) * dim]);
    }
    run_expert(*find({q.layer, b.expert}), n, out);
    out += static_cast<int64_t>(n) * dim;
  }
  return reply;
}

std::vector<std::vector<expert_id>> experts_by_shard(const expert_placement& placement) {
  placement.check_invariants();
  std::vector<std::vector<expert_id>> held(static_cast<size_t>(placement.num_shards()));
  for (int32_t l = 0; l < placement.n_layers(); l++)
    for (int32_t e = 0; e < placement.n_experts(); e++)
      for (int32_t s : placement.replicas(l, e)) held[static_cast<size_t>(s)].push_back({l, e});
  return held;
}

in_process_dispatch::in_process_dispatch(const model::checkpoint& ck, const expert_placement& placement,
                                         model::kernel_path path) {
  for (std::vector<expert_id>& experts : experts_by_shard(placement)) shards_.emplace_back(ck, std::move(experts), path);
}

expected<std::vector<expert_reply>> in_process_dispatch::compute(const std::vector<expert_request>& requests) {
  TROUPE_ASSERT(requests.size() == shards_.size());
  std::vector<expert_reply> replies(requests.size());
  for (size_t s = 0; s < requests.size(); s++) {
    if (requests[s].empty()) continue;
    auto reply = shards_[s].compute(requests[s]);
    TROUPE_ASSERT_MSG(reply.has_value(), "an in-process shard rejected a request its caller planned");
    replies[s] = std::move(*reply);
  }
  return replies;
}

}  // namespace troupe::moe
