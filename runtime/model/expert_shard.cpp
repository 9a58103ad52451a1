#include "runtime/model/expert_shard.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "runtime/model/stored_matmul.hpp"

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
    experts_.push_back(make_held(id, {}));
  }
}

const float* expert_shard::matrix(const held_expert& e, int which) const {
  const model::model_config& c = ck_.config();
  TROUPE_ASSERT(which >= 0 && which < 3);
  TROUPE_ASSERT_MSG(ck_.stored() == nullptr, "a stored model's experts are read by stored_matrix");
  if (!e.owned.empty()) return e.owned.data() + static_cast<int64_t>(which) * c.hidden_dim * c.dim;
  const model::moe_weights& m = *ck_.moe();
  const float* base = which == 0 ? m.w1 : which == 1 ? m.w2 : m.w3;
  return base + m.expert_offset(c, e.id.layer, e.id.expert);
}

const cpu::quant_matrix& expert_shard::stored_matrix(const held_expert& e, int which) const {
  const model::stored_weights& g = *ck_.stored();
  const std::vector<cpu::quant_matrix>& kind = which == 0 ? g.w1 : which == 1 ? g.w2 : g.w3;
  return kind[static_cast<size_t>(ck_.moe()->expert_index(e.id.layer, e.id.expert))];
}

expert_shard::held_expert expert_shard::make_held(expert_id id, std::vector<float> owned) const {
  const model::model_config& c = ck_.config();
  held_expert e{id, std::move(owned), {}, {}, {}};
  if (path_ == model::kernel_path::fast && ck_.stored() == nullptr) {
    e.w1 = cpu::pack_matrix(matrix(e, 0), c.hidden_dim, c.dim);
    e.w2 = cpu::pack_matrix(matrix(e, 1), c.dim, c.hidden_dim);
    e.w3 = cpu::pack_matrix(matrix(e, 2), c.hidden_dim, c.dim);
  }
  return e;
}

expected<void> expert_shard::check_float32() const {
  if (ck_.stored() == nullptr) return {};
  return fail(errc::invalid_argument, "the experts of a model computed in its stored types (a quantized GGUF file) do "
                                      "not move between shards (not built: every shard reads them from its own file)");
}

expected<expert_weights> expert_shard::weights(expert_id id) const {
  if (auto ok = check_float32(); !ok) return tl::unexpected(ok.error());
  const held_expert* e = find(id);
  if (e == nullptr)
    return fail(errc::not_found, "this shard does not hold expert " + std::to_string(id.expert) + " of layer " +
                                     std::to_string(id.layer));
  const size_t size = static_cast<size_t>(ck_.config().hidden_dim) * ck_.config().dim;
  expert_weights w{id.layer, id.expert, {}, {}, {}};
  for (auto [which, out] : {std::pair{0, &w.w1}, std::pair{1, &w.w2}, std::pair{2, &w.w3}})
    out->assign(matrix(*e, which), matrix(*e, which) + size);
  return w;
}

expected<void> expert_shard::check_weights(const expert_weights& w) const {
  const model::model_config& c = ck_.config();
  const auto bad = [&](const std::string& what) {
    return fail(errc::invalid_argument, "expert weights (layer " + std::to_string(w.layer) + ", expert " +
                                            std::to_string(w.expert) + "): " + what);
  };
  if (w.layer < 0 || w.layer >= c.n_layers || w.expert < 0 || w.expert >= ck_.moe()->n_experts)
    return bad("no such expert in the model");
  if (holds({w.layer, w.expert})) return bad("held already");
  const size_t size = static_cast<size_t>(c.hidden_dim) * c.dim;
  if (w.w1.size() != size || w.w2.size() != size || w.w3.size() != size)
    return bad("w1, w2, w3 hold " + std::to_string(w.w1.size()) + ", " + std::to_string(w.w2.size()) + ", " +
               std::to_string(w.w3.size()) + " values, not " + std::to_string(size) + " each");
  for (const std::vector<float>* m : {&w.w1, &w.w2, &w.w3})
    if (!std::all_of(m->begin(), m->end(), [](float v) { return std::isfinite(v); })) return bad("a weight is not finite");
  return {};
}

expected<void> expert_shard::add(expert_weights w) {
  if (auto ok = check_float32(); !ok) return ok;
  if (auto ok = check_weights(w); !ok) return ok;
  std::vector<float> owned = std::move(w.w1);
  owned.insert(owned.end(), w.w2.begin(), w.w2.end());
  owned.insert(owned.end(), w.w3.begin(), w.w3.end());
  const expert_id id{w.layer, w.expert};
  held_expert e = make_held(id, std::move(owned));
  const auto at = std::lower_bound(experts_.begin(), experts_.end(), id,
                                   [](const held_expert& h, const expert_id& key) { return h.id < key; });
  experts_.insert(at, std::move(e));
  return {};
}

expected<void> expert_shard::drop(expert_id id) {
  const held_expert* e = find(id);
  if (e == nullptr)
    return fail(errc::not_found, "this shard does not hold expert " + std::to_string(id.expert) + " of layer " +
                                     std::to_string(id.layer));
  experts_.erase(experts_.begin() + (e - experts_.data()));
  return {};
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
  if (ck_.stored() != nullptr) {  // as llama.cpp: the activations in each matrix's dot type
    model::matmul_stored(hb_.data(), x_.data(), stored_matrix(e, 0), n, path_, xt_);
    model::matmul_stored(hb2_.data(), x_.data(), stored_matrix(e, 2), n, path_, xt_);
  } else if (path_ == model::kernel_path::fast) {
    cpu::fast::matmul(hb_.data(), x_.data(), e.w1, n);
    cpu::fast::matmul(hb2_.data(), x_.data(), e.w3, n);
  } else {
    cpu::reference::matmul(hb_.data(), x_.data(), matrix(e, 0), n, c.dim, c.hidden_dim);
    cpu::reference::matmul(hb2_.data(), x_.data(), matrix(e, 2), n, c.dim, c.hidden_dim);
  }
  if (path_ == model::kernel_path::fast)  // float32: the kernels' exp
    cpu::fast::swiglu(hb_.data(), hb2_.data(), n * c.hidden_dim);
  else
    cpu::reference::swiglu(hb_.data(), hb2_.data(), n * c.hidden_dim);
  if (ck_.stored() != nullptr)
    model::matmul_stored(out, hb_.data(), stored_matrix(e, 1), n, path_, xt_);
  else if (path_ == model::kernel_path::fast)
    cpu::fast::matmul(out, hb_.data(), e.w2, n);
  else
    cpu::reference::matmul(out, hb_.data(), matrix(e, 1), n, c.hidden_dim, c.dim);
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
