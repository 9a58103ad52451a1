#include "runtime/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "runtime/model/expert_shard.hpp"
#include "runtime/model/row_groups.hpp"
#include "runtime/model/stored_matmul.hpp"

namespace troupe::model {

namespace cpu = kernels::cpu;

namespace {

/// x (n) += bias (n).
void add_bias(float* x, const float* bias, int32_t n) {
  for (int32_t i = 0; i < n; i++) x[i] += bias[i];
}

}  // namespace

transformer::rope_angles transformer::rope_table(const model_config& c, float base, float scale) {
  const int32_t half = c.head_size() / 2;
  rope_angles out;
  out.cos.resize(static_cast<size_t>(c.seq_len) * half);
  out.sin.resize(static_cast<size_t>(c.seq_len) * half);
  for (int32_t pos = 0; pos < c.seq_len; pos++) {
    for (int32_t f = 0; f < half; f++) {
      const float freq = 1.0f / std::pow(base, static_cast<float>(2 * f) / static_cast<float>(c.head_size()));
      float val = static_cast<float>(pos) * freq;
      if (!c.rope_freq_factors.empty()) val /= c.rope_freq_factors[static_cast<size_t>(f)];
      if (scale != 1.0f) val *= scale;
      out.cos[static_cast<size_t>(pos) * half + f] = std::cos(val);
      out.sin[static_cast<size_t>(pos) * half + f] = std::sin(val);
    }
  }
  return out;
}

namespace {

}  // namespace

transformer::transformer(const checkpoint& ck, kernel_path path)
    : ck_(ck),
      config_(ck.config()),
      path_(path),
      exp_(ck.q80() ? cpu::exp_source::libm : cpu::exp_source::kernels) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  if (path_ == kernel_path::fast && ck_.q80() == nullptr && ck_.stored() == nullptr) {
    const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    const moe_weights* m = ck_.moe();
    for (int64_t l = 0; l < c.n_layers; l++) {
      layer_weights lw{cpu::pack_matrix(w.wq + l * q_dim * dim, c.q_dim(), c.dim),
                       cpu::pack_matrix(w.wk + l * kv_dim * dim, c.kv_dim(), c.dim),
                       cpu::pack_matrix(w.wv + l * kv_dim * dim, c.kv_dim(), c.dim),
                       cpu::pack_matrix(w.wo + l * dim * q_dim, c.dim, c.q_dim()),
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
  const moe_weights* moe = ck_.moe();
  if (path_ == kernel_path::fast && ck_.stored() != nullptr && moe != nullptr) {
    layers_.resize(static_cast<size_t>(c.n_layers));  // the float32 router only: the rest as stored
    for (int64_t l = 0; l < c.n_layers; l++)
      layers_[l].router = cpu::pack_matrix(moe->router_weight + l * moe->n_experts * c.dim, moe->n_experts, c.dim);
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
  // RoPE angles exactly as llama2.c computes them per step (base 10000, no scaling), tabulated
  // once; a GGUF file's base, per-pair divisors and linear scale as llama.cpp applies them.
  // Sliding layers (Gemma) turn by their own base and scale.
  TROUPE_ASSERT(c.rope_freq_factors.empty() || c.rope_freq_factors.size() == static_cast<size_t>(c.head_size() / 2));
  rope_ = rope_table(c, c.rope_freq_base, c.rope_freq_scale);
  for (int32_t l = 0; l < c.n_layers && rope_swa_.cos.empty(); l++)
    if (c.is_sliding(l)) rope_swa_ = rope_table(c, c.rope_freq_base_swa, c.rope_freq_scale_swa);
  const int64_t dim = c.dim,
                per_layer = 2 * int64_t{c.q_dim()} * dim + 2 * int64_t{c.kv_dim()} * dim + 3 * dim * c.hidden_dim;
  matrix_weights_ = c.n_layers * per_layer + int64_t{c.vocab_size} * dim;
  matrix_bytes_ = matrix_weights_ * (ck_.q80() ? 1 : 4);  // Q8_0: and a scale per group
  if (const stored_weights* g = ck_.stored()) {
    const auto bytes = [](const cpu::quant_matrix& m) { return int64_t{m.d} * cpu::row_bytes(m.type, m.n); };
    matrix_bytes_ = bytes(g->wcls);
    for (const auto* kind : {&g->wq, &g->wk, &g->wv, &g->wo, &g->w1, &g->w2, &g->w3})
      for (const cpu::quant_matrix& m : *kind) matrix_bytes_ += bytes(m);
  }
  set_thread_pool(nullptr);
}

void transformer::set_thread_pool(cpu::thread_pool* pool) {
  pool_ = pool;
  const size_t threads = pool ? static_cast<size_t>(pool->num_threads()) : 1;
  // Scratch 0 serves a whole step, whose attention rows every thread shares out; the others
  // serve one group of a split step each, run by one thread.
  scratch_.resize(threads);
  for (size_t g = 0; g < threads; g++)
    scratch_[g].scores.resize((g == 0 ? threads : 1) * config_.n_heads * config_.seq_len);
}

bool transformer::splits_rows() const {
  return pool_ != nullptr && pool_->num_threads() > 1 && ck_.moe() == nullptr && matrix_bytes_ <= max_split_matrix_bytes;
}

int64_t transformer::resident_bytes() const {
  const auto count = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  int64_t packed = count(wcls_.tiles) * 4;
  for (const layer_weights& l : layers_)
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3, &l.router}) packed += count(m->tiles) * 4;
  const auto q80_bytes = [&](const cpu::packed_q80& m) { return count(m.tiles) + 4 * (count(m.scales) + count(m.sums)); };
  packed += q80_bytes(q80_wcls_);
  for (const q80_layer_weights& l : q80_layers_)
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) packed += q80_bytes(*m);
  return ck_.resident_bytes() + packed;
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

void transformer::reserve(scratch& s, int32_t rows) const {
  const size_t n = static_cast<size_t>(rows);
  if (s.x.size() >= n * config_.dim) return;
  s.x.resize(n * config_.dim);
  s.xb.resize(n * config_.dim);
  s.xb2.resize(n * config_.dim);
  s.q.resize(n * config_.q_dim());
  s.att.resize(n * config_.q_dim());
  s.k.resize(n * config_.kv_dim());
  s.v.resize(n * config_.kv_dim());
  s.hb.resize(n * config_.hidden_dim);
  s.hb2.resize(n * config_.hidden_dim);
  if (const moe_weights* m = ck_.moe()) s.router_logits.resize(n * m->n_experts);
}

void transformer::matmul(float* out, const float* x, matrix which, int32_t layer, int32_t rows, scratch& s,
                         cpu::thread_pool* pool) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  const moe_weights* m = ck_.moe();
  const int64_t l = layer, dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  if (which == matrix::router) {  // float32 in every format
    if (path_ == kernel_path::fast)
      cpu::fast::matmul(out, x, layers_[layer].router, rows, pool);
    else
      cpu::reference::matmul(out, x, m->router_weight + l * m->n_experts * dim, rows, c.dim, m->n_experts);
    return;
  }
  if (const stored_weights* g = ck_.stored()) {
    const std::vector<cpu::quant_matrix>* per_layer[] = {&g->wq, &g->wk, &g->wv, &g->wo, &g->w1, &g->w2, &g->w3};
    matmul_stored(out, x, which == matrix::wcls ? g->wcls : (*per_layer[static_cast<int>(which)])[layer], rows, path_,
                  s.xt, pool);
    return;
  }
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
    matmul_q80(out, x, cls ? q->wcls : (*per_layer[static_cast<int>(which)])[layer], p, rows, s, pool);
    return;
  }
  struct plain {
    const float* w;
    int64_t d, n;
    cpu::packed_matrix layer_weights::*packed;
  };
  const plain views[] = {{w.wq + l * q_dim * dim, q_dim, dim, &layer_weights::wq},
                         {w.wk + l * kv_dim * dim, kv_dim, dim, &layer_weights::wk},
                         {w.wv + l * kv_dim * dim, kv_dim, dim, &layer_weights::wv},
                         {w.wo + l * dim * q_dim, dim, q_dim, &layer_weights::wo},
                         {w.w1 + l * hidden * dim, hidden, dim, &layer_weights::w1},
                         {w.w2 + l * dim * hidden, dim, hidden, &layer_weights::w2},
                         {w.w3 + l * hidden * dim, hidden, dim, &layer_weights::w3},
                         {w.wcls, c.vocab_size, dim, nullptr}};
  const plain& v = views[static_cast<int>(which)];
  if (path_ == kernel_path::fast)
    cpu::fast::matmul(out, x, v.packed ? layers_[layer].*v.packed : wcls_, rows, pool);
  else
    cpu::reference::matmul(out, x, v.w, rows, static_cast<int32_t>(v.n), static_cast<int32_t>(v.d));
}

void transformer::matmul_q80(float* out, const float* x, const cpu::q80_matrix& w, const cpu::packed_q80* packed,
                             int32_t rows, scratch& s, cpu::thread_pool* pool) {
  const int32_t groups = w.n / w.group_size;
  s.xq.resize(std::max(s.xq.size(), static_cast<size_t>(rows) * w.n));
  s.xs.resize(std::max(s.xs.size(), static_cast<size_t>(rows) * groups));
  for (int32_t r = 0; r < rows; r++)
    cpu::quantize_q80(&s.xq[static_cast<size_t>(r) * w.n], &s.xs[static_cast<size_t>(r) * groups],
                      x + static_cast<int64_t>(r) * w.n, w.n, w.group_size);
  if (packed != nullptr)
    cpu::fast::matmul_q80(out, s.xq.data(), s.xs.data(), *packed, rows, pool);
  else
    cpu::reference::matmul_q80(out, s.xq.data(), s.xs.data(), w, rows);
}

void transformer::forward(const std::vector<forward_row>& rows, kv_cache& cache,
                          std::vector<float>& logits, int32_t num_layers, std::vector<float>* hidden,
                          kernels::cpu::layer_stream* moves) {
  const model_config& c = config_;
  TROUPE_ASSERT(cache.kv_dim() == c.kv_dim());
  TROUPE_ASSERT(num_layers >= 0 && num_layers <= c.n_layers);
  if (num_layers == 0) num_layers = c.n_layers;
  for (const forward_row& row : rows) {
    TROUPE_ASSERT_MSG(row.token >= 0 && row.token < c.vocab_size, "token id out of range");
    TROUPE_ASSERT_MSG(row.position >= 0 && row.position < c.seq_len, "position out of range");
    TROUPE_ASSERT(row.block_table != nullptr);
  }
  expert_error_.reset();
  moves_ = moves;
  std::vector<std::vector<int32_t>> groups;
  if (splits_rows() && rows.size() > 1) {
    // A row's work: its matrices' multiply-adds, and attention's two (q.k, weights.v) per
    // feature and earlier position, in every layer.
    const double per_position = 2.0 * c.dim * c.n_layers;
    const auto matrices = static_cast<double>(matrix_weights_);
    groups = independent_row_groups(rows, cache.block_size(), pool_->num_threads(), [&](int32_t r) {
      return matrices + per_position * (rows[r].position + 1);
    });
  }
  if (groups.size() < 2) {
    run(rows, cache, logits, num_layers, hidden, scratch_[0], pool_);
  } else {
    const size_t num_groups = groups.size();
    group_rows_.resize(num_groups);
    group_logits_.resize(num_groups);
    group_hidden_.resize(num_groups);
    for (size_t g = 0; g < num_groups; g++) {
      group_rows_[g].clear();
      for (int32_t r : groups[g]) group_rows_[g].push_back(rows[r]);
    }
    pool_->parallel_for(static_cast<int64_t>(num_groups), [&](int32_t, int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; g++)
        run(group_rows_[g], cache, group_logits_[g], num_layers, hidden != nullptr ? &group_hidden_[g] : nullptr,
            scratch_[g], nullptr);
    });
    gather_groups(rows, groups, &forward_row::want_logits, c.vocab_size, group_logits_, logits);
    if (hidden != nullptr) gather_groups(rows, groups, &forward_row::want_hidden, c.dim, group_hidden_, *hidden);
  }
  moves_ = nullptr;
  num_forwards_++;
}

void transformer::gather_groups(const std::vector<forward_row>& rows, const std::vector<std::vector<int32_t>>& groups,
                                bool forward_row::*wants, int32_t width, const std::vector<std::vector<float>>& from,
                                std::vector<float>& out) {
  std::vector<int32_t> slot(rows.size(), -1);
  int32_t m = 0;
  for (size_t r = 0; r < rows.size(); r++)
    if (rows[r].*wants) slot[r] = m++;
  out.resize(static_cast<size_t>(m) * width);
  for (size_t g = 0; g < groups.size(); g++) {
    const float* next = from[g].data();
    for (int32_t r : groups[g]) {
      if (slot[r] < 0) continue;
      std::copy_n(next, width, out.data() + static_cast<size_t>(slot[r]) * width);
      next += width;
    }
  }
}

void transformer::run(const std::vector<forward_row>& rows, kv_cache& cache, std::vector<float>& logits,
                      int32_t num_layers, std::vector<float>* hidden, scratch& s, cpu::thread_pool* pool) {
  const model_config& c = config_;
  const int32_t n = static_cast<int32_t>(rows.size());
  reserve(s, n);
  const stored_weights* g = ck_.stored();
  for (int32_t r = 0; r < n; r++) {
    float* x = s.x.data() + static_cast<int64_t>(r) * c.dim;
    if (g != nullptr && g->token_embedding.layout == cpu::matrix_layout::rows) {
      cpu::dequantize_row(x, g->token_embedding.row(rows[r].token), g->token_embedding.type, c.dim);
    } else if (g != nullptr) {  // a classifier shared with the embedding, laid out for its matmul
      s.embedding_row.resize(static_cast<size_t>(cpu::row_bytes(g->token_embedding.type, c.dim)));
      cpu::copy_row(g->token_embedding, rows[r].token, s.embedding_row.data());
      cpu::dequantize_row(x, s.embedding_row.data(), g->token_embedding.type, c.dim);
    } else
      std::copy_n(ck_.w().token_embedding + static_cast<int64_t>(rows[r].token) * c.dim, c.dim, x);
    if (c.scale_embedding) {
      const float scale = std::sqrt(static_cast<float>(c.dim));
      for (int32_t i = 0; i < c.dim; i++) x[i] *= scale;
    }
  }
  for (int32_t l = 0; l < num_layers && !expert_error_; l++) {
    if (moves_ != nullptr) moves_->wait(l);
    attention_layer(rows, cache, l, s, pool);
    ffn_layer(n, l, s, pool);
  }
  classifier(rows, logits, hidden, s, pool);
}

void transformer::attention_layer(const std::vector<forward_row>& rows, kv_cache& cache, int32_t l, scratch& s,
                                  cpu::thread_pool* pool) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  const int32_t n = static_cast<int32_t>(rows.size());
  const int32_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), head = c.head_size(), half = head / 2;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&s.xb[r * dim], &s.x[r * dim], w.rms_att + ld * dim, dim, c.rms_norm_eps);
  matmul(s.q.data(), s.xb.data(), matrix::wq, l, n, s, pool);
  matmul(s.k.data(), s.xb.data(), matrix::wk, l, n, s, pool);
  matmul(s.v.data(), s.xb.data(), matrix::wv, l, n, s, pool);
  const auto rope = c.rope == rope_style::neox ? cpu::reference::rope_neox : cpu::reference::rope;
  const bool sliding = c.is_sliding(l);
  const rope_angles& angles = sliding ? rope_swa_ : rope_;
  for (int32_t r = 0; r < n; r++) {
    const forward_row& row = rows[r];
    float* q = &s.q[static_cast<int64_t>(r) * q_dim];
    float* k = &s.k[static_cast<int64_t>(r) * kv_dim];
    if (c.qkv_bias) {
      add_bias(q, w.bq + ld * q_dim, q_dim);
      add_bias(k, w.bk + ld * kv_dim, kv_dim);
      add_bias(&s.v[static_cast<int64_t>(r) * kv_dim], w.bv + ld * kv_dim, kv_dim);
    }
    if (c.qk_norm) {
      for (int32_t i = 0; i < q_dim; i += head)
        cpu::reference::rmsnorm(q + i, q + i, w.q_norm + ld * head, head, c.rms_norm_eps);
      for (int32_t i = 0; i < kv_dim; i += head)
        cpu::reference::rmsnorm(k + i, k + i, w.k_norm + ld * head, head, c.rms_norm_eps);
    }
    const float* cos = &angles.cos[static_cast<size_t>(row.position) * half];
    const float* sin = &angles.sin[static_cast<size_t>(row.position) * half];
    rope(q, q_dim, head, cos, sin);
    rope(k, kv_dim, head, cos, sin);
    const int64_t slot = static_cast<int64_t>(row.block_table[row.position / cache.block_size()]) *
                             cache.block_size() + row.position % cache.block_size();
    cache.write(l, slot, k, &s.v[static_cast<int64_t>(r) * kv_dim]);
  }
  const cpu::attention_shape shape{c.n_heads,      c.n_kv_heads,   c.head_size(),
                                   c.attn_divisor, c.attn_softcap, sliding ? c.sliding_window : 0};
  const bool staged = cache.dtype() != kv_dtype::f32;
  if (staged) stage_kv(rows, cache, l, shape, s, pool);
  // Tiles of up to attention_tile_rows consecutive rows of one sequence (a prefill chunk's),
  // which read each KV block once for all of them (fast::attention_rows, the same bits as row by
  // row). A sliding-window layer's rows go one by one: a later row's staged table leaves out
  // the blocks before its window, which an earlier row reads.
  s.attention_tiles.clear();
  for (int32_t r = 0; r < n; r++) {
    auto& tiles = s.attention_tiles;
    if (!tiles.empty() && shape.window == 0 && path_ == kernel_path::fast) {
      auto& [first, count] = tiles.back();
      const forward_row& last = rows[first + count - 1];
      if (count < attention_tile_rows && rows[r].block_table == last.block_table && rows[r].position == last.position + 1) {
        count++;
        continue;
      }
    }
    tiles.emplace_back(r, 1);
  }
  auto attend = [&](int32_t worker, int64_t begin, int64_t end) {
    const int64_t scores_floats = int64_t{c.n_heads} * c.seq_len;
    float* scores = s.scores.data() + worker * scores_floats;
    for (int64_t i = begin; i < end; i++) {
      const auto [first, count] = s.attention_tiles[static_cast<size_t>(i)];
      const int32_t last = first + count - 1;  // its block table covers the tile's
      const cpu::paged_kv kv =
          staged ? cpu::paged_kv{s.stage_keys.data(), s.stage_values.data(), &s.stage_tables[s.stage_table_at[last]],
                                 cache.block_size(), kv_dim}
                 : cpu::paged_kv{cache.keys(l), cache.values(l), rows[last].block_table, cache.block_size(), kv_dim};
      const int64_t at = int64_t{first} * q_dim;
      if (path_ == kernel_path::fast)
        cpu::fast::attention_rows(&s.att[at], &s.q[at], q_dim, scores, scores_floats, kv, rows[first].position + 1,
                                  count, shape, exp_);
      else
        cpu::reference::attention(&s.att[at], &s.q[at], scores, kv, rows[first].position + 1, shape, exp_);
    }
  };
  const auto num_tiles = static_cast<int64_t>(s.attention_tiles.size());
  if (pool != nullptr && num_tiles > 1)
    pool->parallel_for(num_tiles, attend);
  else
    attend(0, 0, num_tiles);
  matmul(s.xb2.data(), s.att.data(), matrix::wo, l, n, s, pool);
  if (c.post_norms)
    for (int32_t r = 0; r < n; r++)
      cpu::reference::rmsnorm(&s.xb2[r * dim], &s.xb2[r * dim], w.rms_att_post + ld * dim, dim, c.rms_norm_eps);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) s.x[i] += s.xb2[i];
}

void transformer::stage_kv(const std::vector<forward_row>& rows, const kv_cache& cache, int32_t l,
                           const cpu::attention_shape& shape, scratch& s, cpu::thread_pool* pool) {
  const int32_t bs = cache.block_size();
  if (static_cast<int32_t>(s.stage_of.size()) != cache.num_blocks()) s.stage_of.assign(cache.num_blocks(), -1);
  s.staged.clear();
  s.stage_tables.clear();
  s.stage_table_at.clear();
  for (const forward_row& row : rows) {
    const int32_t num_positions = row.position + 1, first_block = shape.first_position(num_positions) / bs;
    s.stage_table_at.push_back(static_cast<int64_t>(s.stage_tables.size()));
    for (int32_t b = 0; b <= row.position / bs; b++) {
      if (b < first_block) {  // before the window: never read
        s.stage_tables.push_back(0);
        continue;
      }
      int32_t& index = s.stage_of[static_cast<size_t>(row.block_table[b])];
      if (index < 0) {
        index = static_cast<int32_t>(s.staged.size());
        s.staged.push_back(row.block_table[b]);
      }
      s.stage_tables.push_back(index);
    }
  }
  const int64_t block_floats = int64_t{bs} * cache.kv_dim(), num_staged = static_cast<int64_t>(s.staged.size());
  if (static_cast<int64_t>(s.stage_keys.size()) < num_staged * block_floats) {
    s.stage_keys.resize(static_cast<size_t>(num_staged * block_floats));
    s.stage_values.resize(static_cast<size_t>(num_staged * block_floats));
  }
  auto convert = [&](int32_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++)
      cache.read_block(l, s.staged[static_cast<size_t>(i)], &s.stage_keys[static_cast<size_t>(i * block_floats)],
                       &s.stage_values[static_cast<size_t>(i * block_floats)]);
  };
  if (pool != nullptr && num_staged > 1)
    pool->parallel_for(num_staged, convert);
  else
    convert(0, 0, num_staged);
  for (int32_t b : s.staged) s.stage_of[static_cast<size_t>(b)] = -1;
}

void transformer::ffn_layer(int32_t n, int32_t l, scratch& s, cpu::thread_pool* pool) {
  if (ck_.moe() != nullptr) return moe_ffn_layer(n, l, s, pool);
  const model_config& c = config_;
  const weights& w = ck_.w();
  const int32_t dim = c.dim, hidden = c.hidden_dim;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&s.xb[r * dim], &s.x[r * dim], w.rms_ffn + ld * dim, dim, c.rms_norm_eps);
  matmul(s.hb.data(), s.xb.data(), matrix::w1, l, n, s, pool);
  matmul(s.hb2.data(), s.xb.data(), matrix::w3, l, n, s, pool);
  if (c.activation == ffn_activation::gelu)
    cpu::reference::geglu(s.hb.data(), s.hb2.data(), n * hidden);
  else if (path_ == kernel_path::fast)
    cpu::fast::swiglu(s.hb.data(), s.hb2.data(), n * hidden, exp_);
  else
    cpu::reference::swiglu(s.hb.data(), s.hb2.data(), n * hidden, exp_);
  matmul(s.xb.data(), s.hb.data(), matrix::w2, l, n, s, pool);
  if (c.post_norms)
    for (int32_t r = 0; r < n; r++)
      cpu::reference::rmsnorm(&s.xb[r * dim], &s.xb[r * dim], w.rms_ffn_post + ld * dim, dim, c.rms_norm_eps);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) s.x[i] += s.xb[i];
}

void transformer::moe_ffn_layer(int32_t n, int32_t l, scratch& s, cpu::thread_pool* pool) {
  const model_config& c = config_;
  const moe_weights& m = *ck_.moe();
  const int32_t dim = c.dim, experts = m.n_experts;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&s.xb[r * dim], &s.x[r * dim], ck_.w().rms_ffn + ld * dim, dim, c.rms_norm_eps);
  if (m.router == moe::router_kind::top_k) {
    matmul(s.router_logits.data(), s.xb.data(), matrix::router, l, n, s, pool);
    if (m.router_bias != nullptr) {
      const float* bias = m.router_bias + ld * experts;  // (n_experts)
      for (int32_t r = 0; r < n; r++)
        for (int32_t e = 0; e < experts; e++) s.router_logits[static_cast<size_t>(r) * experts + e] += bias[e];
    }
  }
  const moe::routing routes = moe::route(s.router_logits.data(), n, experts, m.top_k, m.router, exp_);
  const moe::dispatch_plan plan = moe::plan_dispatch(placement_, l, routes, s.xb.data(), dim, num_forwards_);
  expected<std::vector<moe::expert_reply>> replies = dispatch_->compute(plan.requests);
  if (!replies) {
    expert_error_ = replies.error();
    return;
  }
  moe::combine(plan, *replies, s.xb.data(), n, dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) s.x[i] += s.xb[i];
}

void transformer::classifier(const std::vector<forward_row>& rows, std::vector<float>& logits,
                             std::vector<float>* hidden, scratch& s, cpu::thread_pool* pool) {
  const model_config& c = config_;
  if (hidden != nullptr) {
    hidden->clear();
    for (size_t r = 0; r < rows.size(); r++) {
      if (!rows[r].want_hidden) continue;
      hidden->resize(hidden->size() + c.dim);
      cpu::reference::rmsnorm(hidden->data() + hidden->size() - c.dim, &s.x[r * c.dim], ck_.w().rms_final, c.dim,
                              c.rms_norm_eps);
    }
  }
  int32_t m = 0;  // rows that want logits, packed to the front of s.xb
  for (size_t r = 0; r < rows.size(); r++)
    if (rows[r].want_logits)
      cpu::reference::rmsnorm(&s.xb[static_cast<size_t>(m++) * c.dim], &s.x[r * c.dim], ck_.w().rms_final, c.dim,
                              c.rms_norm_eps);
  logits.resize(static_cast<size_t>(m) * c.vocab_size);
  if (m > 0) matmul(logits.data(), s.xb.data(), matrix::wcls, 0, m, s, pool);
  if (c.final_softcap > 0)
    for (float& x : logits) x = cpu::soft_cap(x, c.final_softcap);
}

}  // namespace troupe::model
