#include "runtime/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "runtime/moe/expert_shard.hpp"

namespace troupe::model {

namespace cpu = kernels::cpu;

transformer::transformer(const checkpoint& ck, kernel_path path)
    : ck_(ck),
      config_(ck.config()),
      path_(path),
      exp_(ck.q80() ? cpu::exp_source::libm : cpu::exp_source::kernels) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  if (path_ == kernel_path::fast && ck_.q80() == nullptr) {
    const int64_t dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    const moe_weights* m = ck_.moe();
    for (int64_t l = 0; l < c.n_layers; l++) {
      layer_weights lw{cpu::pack_matrix(w.wq + l * dim * dim, c.dim, c.dim),
                       cpu::pack_matrix(w.wk + l * kv_dim * dim, c.kv_dim(), c.dim),
                       cpu::pack_matrix(w.wv + l * kv_dim * dim, c.kv_dim(), c.dim),
                       cpu::pack_matrix(w.wo + l * dim * dim, c.dim, c.dim),
                       {}, {}, {}, {}};
      if (m == nullptr) {
        lw.w1 = cpu::pack_matrix(w.w1 + l * hidden * dim, c.hidden_dim, c.dim);
        lw.w2 = cpu::pack_matrix(w.w2 + l * dim * hidden, c.dim, c.hidden_dim);
        lw.w3 = cpu::pack_matrix(w.w3 + l * hidden * dim, c.hidden_dim, c.dim);
      } else if (m->router == moe::router_kind::top_k) {
        lw.router = cpu::pack_matrix(m->router_weight + l * m->n_experts * dim, m->n_experts, c.dim);
      }
      layers_.push_back(std::move(lw));
    }
    wcls_ = cpu::pack_matrix(w.wcls, c.vocab_size, c.dim);
  }
  if (const q80_weights* q = ck_.q80(); path_ == kernel_path::fast && q != nullptr) {
    for (int32_t l = 0; l < c.n_layers; l++)
      q80_layers_.push_back(q80_layer_weights{cpu::pack_q80(q->wq[l]), cpu::pack_q80(q->wk[l]), cpu::pack_q80(q->wv[l]),
                                              cpu::pack_q80(q->wo[l]), cpu::pack_q80(q->w1[l]), cpu::pack_q80(q->w2[l]),
                                              cpu::pack_q80(q->w3[l])});
    q80_wcls_ = cpu::pack_q80(q->wcls);
  }
  if (const moe_weights* m = ck_.moe()) {
    placement_ = moe::expert_placement::round_robin(c.n_layers, m->n_experts, 1);
    own_dispatch_ = std::make_unique<moe::in_process_dispatch>(ck_, placement_, path_);
    dispatch_ = own_dispatch_.get();
  }
  // RoPE angles exactly as llama2.c computes them per step, tabulated once.
  const int32_t half = c.head_size() / 2;
  rope_cos_.resize(static_cast<size_t>(c.seq_len) * half);
  rope_sin_.resize(static_cast<size_t>(c.seq_len) * half);
  for (int32_t pos = 0; pos < c.seq_len; pos++) {
    for (int32_t f = 0; f < half; f++) {
      const float freq = 1.0f / std::pow(10000.0f, static_cast<float>(2 * f) / static_cast<float>(c.head_size()));
      const float val = static_cast<float>(pos) * freq;
      rope_cos_[static_cast<size_t>(pos) * half + f] = std::cos(val);
      rope_sin_[static_cast<size_t>(pos) * half + f] = std::sin(val);
    }
  }
  scores_.resize(static_cast<size_t>(c.n_heads) * c.seq_len);
}

void transformer::set_thread_pool(cpu::thread_pool* pool) {
  pool_ = pool;
  const size_t threads = pool ? static_cast<size_t>(pool->num_threads()) : 1;
  scores_.resize(threads * config_.n_heads * config_.seq_len);
}

void transformer::set_expert_dispatch(const moe::expert_placement& placement, moe::expert_dispatch& dispatch) {
  const moe_weights* m = ck_.moe();
  TROUPE_ASSERT_MSG(m != nullptr, "only an MoE checkpoint has experts to dispatch");
  placement.check_invariants();
  TROUPE_ASSERT(placement.n_layers() == config_.n_layers && placement.n_experts() == m->n_experts);
  TROUPE_ASSERT(placement.num_shards() == dispatch.num_shards());
  placement_ = placement;
  dispatch_ = &dispatch;
  own_dispatch_.reset();
}

void transformer::reserve(int32_t rows) {
  const size_t n = static_cast<size_t>(rows);
  if (x_.size() >= n * config_.dim) return;
  x_.resize(n * config_.dim);
  xb_.resize(n * config_.dim);
  xb2_.resize(n * config_.dim);
  q_.resize(n * config_.dim);
  k_.resize(n * config_.kv_dim());
  v_.resize(n * config_.kv_dim());
  hb_.resize(n * config_.hidden_dim);
  hb2_.resize(n * config_.hidden_dim);
  if (const moe_weights* m = ck_.moe()) router_logits_.resize(n * m->n_experts);
}

void transformer::matmul(float* out, const float* x, matrix which, int32_t layer, int32_t rows) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  const moe_weights* m = ck_.moe();
  const int64_t l = layer, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  if (const q80_weights* q = ck_.q80()) {
    const std::vector<cpu::q80_matrix>* per_layer[] = {&q->wq, &q->wk, &q->wv, &q->wo, &q->w1, &q->w2, &q->w3};
    cpu::packed_q80 q80_layer_weights::*packed[] = {&q80_layer_weights::wq, &q80_layer_weights::wk,
                                                    &q80_layer_weights::wv, &q80_layer_weights::wo,
                                                    &q80_layer_weights::w1, &q80_layer_weights::w2,
                                                    &q80_layer_weights::w3};
    const bool cls = which == matrix::wcls;
    const cpu::packed_q80* p = path_ != kernel_path::fast ? nullptr
                               : cls                       ? &q80_wcls_
                                                           : &(q80_layers_[layer].*packed[static_cast<int>(which)]);
    matmul_q80(out, x, cls ? q->wcls : (*per_layer[static_cast<int>(which)])[layer], p, rows);
    return;
  }
  struct plain {
    const float* w;
    int64_t d, n;
    cpu::packed_matrix layer_weights::*packed;
  };
  const plain views[] = {{w.wq + l * dim * dim, dim, dim, &layer_weights::wq},
                         {w.wk + l * kv_dim * dim, kv_dim, dim, &layer_weights::wk},
                         {w.wv + l * kv_dim * dim, kv_dim, dim, &layer_weights::wv},
                         {w.wo + l * dim * dim, dim, dim, &layer_weights::wo},
                         {w.w1 + l * hidden * dim, hidden, dim, &layer_weights::w1},
                         {w.w2 + l * dim * hidden, dim, hidden, &layer_weights::w2},
                         {w.w3 + l * hidden * dim, hidden, dim, &layer_weights::w3},
                         {w.wcls, c.vocab_size, dim, nullptr},
                         {m ? m->router_weight + l * m->n_experts * dim : nullptr, m ? m->n_experts : 0, dim,
                          &layer_weights::router}};
  const plain& v = views[static_cast<int>(which)];
  if (path_ == kernel_path::fast)
    cpu::fast::matmul(out, x, v.packed ? layers_[layer].*v.packed : wcls_, rows, pool_);
  else
    cpu::reference::matmul(out, x, v.w, rows, static_cast<int32_t>(v.n), static_cast<int32_t>(v.d));
}

void transformer::matmul_q80(float* out, const float* x, const cpu::q80_matrix& w, const cpu::packed_q80* packed,
                             int32_t rows) {
  const int32_t groups = w.n / w.group_size;
  xq_.resize(std::max(xq_.size(), static_cast<size_t>(rows) * w.n));
  xs_.resize(std::max(xs_.size(), static_cast<size_t>(rows) * groups));
  for (int32_t r = 0; r < rows; r++)
    cpu::quantize_q80(&xq_[static_cast<size_t>(r) * w.n], &xs_[static_cast<size_t>(r) * groups],
                      x + static_cast<int64_t>(r) * w.n, w.n, w.group_size);
  if (packed != nullptr)
    cpu::fast::matmul_q80(out, xq_.data(), xs_.data(), *packed, rows, pool_);
  else
    cpu::reference::matmul_q80(out, xq_.data(), xs_.data(), w, rows);
}

void transformer::forward(const std::vector<forward_row>& rows, kv_cache& cache,
                          std::vector<float>& logits, int32_t num_layers) {
  const model_config& c = config_;
  TROUPE_ASSERT(cache.kv_dim() == c.kv_dim());
  TROUPE_ASSERT(num_layers >= 0 && num_layers <= c.n_layers);
  if (num_layers == 0) num_layers = c.n_layers;
  const int32_t n = static_cast<int32_t>(rows.size());
  reserve(n);
  expert_error_.reset();
  for (int32_t r = 0; r < n; r++) {
    const forward_row& row = rows[r];
    TROUPE_ASSERT_MSG(row.token >= 0 && row.token < c.vocab_size, "token id out of range");
    TROUPE_ASSERT_MSG(row.position >= 0 && row.position < c.seq_len, "position out of range");
    TROUPE_ASSERT(row.block_table != nullptr);
    std::copy_n(ck_.w().token_embedding + static_cast<int64_t>(row.token) * c.dim, c.dim,
                x_.data() + static_cast<int64_t>(r) * c.dim);
  }
  for (int32_t l = 0; l < num_layers && !expert_error_; l++) {
    attention_layer(rows, cache, l);
    ffn_layer(n, l);
  }
  classifier(rows, logits);
  num_forwards_++;
}

void transformer::attention_layer(const std::vector<forward_row>& rows, kv_cache& cache,
                                  int32_t l) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  const int32_t n = static_cast<int32_t>(rows.size());
  const int32_t dim = c.dim, kv_dim = c.kv_dim(), half = c.head_size() / 2;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&xb_[r * dim], &x_[r * dim], w.rms_att + ld * dim, dim);
  matmul(q_.data(), xb_.data(), matrix::wq, l, n);
  matmul(k_.data(), xb_.data(), matrix::wk, l, n);
  matmul(v_.data(), xb_.data(), matrix::wv, l, n);
  for (int32_t r = 0; r < n; r++) {
    const forward_row& row = rows[r];
    const float* cos = &rope_cos_[static_cast<size_t>(row.position) * half];
    const float* sin = &rope_sin_[static_cast<size_t>(row.position) * half];
    cpu::reference::rope(&q_[r * dim], dim, c.head_size(), cos, sin);
    cpu::reference::rope(&k_[r * kv_dim], kv_dim, c.head_size(), cos, sin);
    const int64_t slot = static_cast<int64_t>(row.block_table[row.position / cache.block_size()]) *
                             cache.block_size() + row.position % cache.block_size();
    // Keys are transposed within a block: feature d of slot s at (block, d, s).
    const int64_t block = slot / cache.block_size(), in_block = slot % cache.block_size();
    float* key = cache.keys(l) + block * kv_dim * cache.block_size() + in_block;
    for (int32_t d = 0; d < kv_dim; d++) key[static_cast<int64_t>(d) * cache.block_size()] = k_[r * kv_dim + d];
    std::copy_n(&v_[r * kv_dim], kv_dim, cache.values(l) + slot * kv_dim);
  }
  const cpu::attention_shape shape{c.n_heads, c.n_kv_heads, c.head_size()};
  auto attend = [&](int32_t worker, int64_t begin, int64_t end) {
    float* scores = scores_.data() + static_cast<size_t>(worker) * c.n_heads * c.seq_len;
    for (int64_t r = begin; r < end; r++) {
      const cpu::paged_kv kv{cache.keys(l), cache.values(l), rows[r].block_table, cache.block_size(), kv_dim};
      if (path_ == kernel_path::fast)
        cpu::fast::attention(&xb_[r * dim], &q_[r * dim], scores, kv, rows[r].position + 1, shape, exp_);
      else
        cpu::reference::attention(&xb_[r * dim], &q_[r * dim], scores, kv, rows[r].position + 1, shape, exp_);
    }
  };
  if (pool_ != nullptr && n > 1)
    pool_->parallel_for(n, attend);
  else
    attend(0, 0, n);
  matmul(xb2_.data(), xb_.data(), matrix::wo, l, n);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) x_[i] += xb2_[i];
}

void transformer::ffn_layer(int32_t n, int32_t l) {
  if (ck_.moe() != nullptr) return moe_ffn_layer(n, l);
  const model_config& c = config_;
  const weights& w = ck_.w();
  const int32_t dim = c.dim, hidden = c.hidden_dim;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&xb_[r * dim], &x_[r * dim], w.rms_ffn + ld * dim, dim);
  matmul(hb_.data(), xb_.data(), matrix::w1, l, n);
  matmul(hb2_.data(), xb_.data(), matrix::w3, l, n);
  if (path_ == kernel_path::fast)
    cpu::fast::swiglu(hb_.data(), hb2_.data(), n * hidden, exp_);
  else
    cpu::reference::swiglu(hb_.data(), hb2_.data(), n * hidden, exp_);
  matmul(xb_.data(), hb_.data(), matrix::w2, l, n);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) x_[i] += xb_[i];
}

void transformer::moe_ffn_layer(int32_t n, int32_t l) {
  const model_config& c = config_;
  const moe_weights& m = *ck_.moe();
  const int32_t dim = c.dim, experts = m.n_experts;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&xb_[r * dim], &x_[r * dim], ck_.w().rms_ffn + ld * dim, dim);
  if (m.router == moe::router_kind::top_k) {
    matmul(router_logits_.data(), xb_.data(), matrix::router, l, n);
    const float* bias = m.router_bias + ld * experts;  // (n_experts)
    for (int32_t r = 0; r < n; r++)
      for (int32_t e = 0; e < experts; e++) router_logits_[static_cast<size_t>(r) * experts + e] += bias[e];
  }
  const moe::routing routes = moe::route(router_logits_.data(), n, experts, m.top_k, m.router, exp_);
  const moe::dispatch_plan plan = moe::plan_dispatch(placement_, l, routes, xb_.data(), dim, num_forwards_);
  expected<std::vector<moe::expert_reply>> replies = dispatch_->compute(plan.requests);
  if (!replies) {
    expert_error_ = replies.error();
    return;
  }
  moe::combine(plan, *replies, xb_.data(), n, dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) x_[i] += xb_[i];
}

void transformer::classifier(const std::vector<forward_row>& rows, std::vector<float>& logits) {
  const model_config& c = config_;
  int32_t m = 0;  // rows that want logits, packed to the front of xb_
  for (size_t r = 0; r < rows.size(); r++)
    if (rows[r].want_logits)
      cpu::reference::rmsnorm(&xb_[static_cast<size_t>(m++) * c.dim], &x_[r * c.dim], ck_.w().rms_final, c.dim);
  logits.resize(static_cast<size_t>(m) * c.vocab_size);
  if (m > 0) matmul(logits.data(), xb_.data(), matrix::wcls, 0, m);
}

}  // namespace troupe::model
