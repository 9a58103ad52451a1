#include "runtime/model/transformer.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::model {

namespace cpu = kernels::cpu;

transformer::transformer(const checkpoint& ck, kernel_path path)
    : ck_(ck), config_(ck.config()), path_(path) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  if (path_ == kernel_path::fast) {
    const int64_t dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    for (int64_t l = 0; l < c.n_layers; l++) {
      layers_.push_back(layer_weights{
          cpu::pack_matrix(w.wq + l * dim * dim, c.dim, c.dim),
          cpu::pack_matrix(w.wk + l * kv_dim * dim, c.kv_dim(), c.dim),
          cpu::pack_matrix(w.wv + l * kv_dim * dim, c.kv_dim(), c.dim),
          cpu::pack_matrix(w.wo + l * dim * dim, c.dim, c.dim),
          cpu::pack_matrix(w.w1 + l * hidden * dim, c.hidden_dim, c.dim),
          cpu::pack_matrix(w.w2 + l * dim * hidden, c.dim, c.hidden_dim),
          cpu::pack_matrix(w.w3 + l * hidden * dim, c.hidden_dim, c.dim)});
    }
    wcls_ = cpu::pack_matrix(w.wcls, c.vocab_size, c.dim);
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
}

const cpu::packed_matrix* transformer::packed(int32_t layer,
                                             cpu::packed_matrix layer_weights::*which) const {
  return path_ == kernel_path::fast ? &(layers_[layer].*which) : nullptr;
}

void transformer::matmul(float* out, const float* x, const float* w, const cpu::packed_matrix* wp,
                         int32_t rows, int32_t n, int32_t d) const {
  if (wp != nullptr)
    cpu::fast::matmul(out, x, *wp, rows, pool_);
  else
    cpu::reference::matmul(out, x, w, rows, n, d);
}

void transformer::forward(const std::vector<forward_row>& rows, kv_cache& cache,
                          std::vector<float>& logits) {
  const model_config& c = config_;
  TROUPE_ASSERT(cache.kv_dim() == c.kv_dim());
  const int32_t n = static_cast<int32_t>(rows.size());
  reserve(n);
  for (int32_t r = 0; r < n; r++) {
    const forward_row& row = rows[r];
    TROUPE_ASSERT_MSG(row.token >= 0 && row.token < c.vocab_size, "token id out of range");
    TROUPE_ASSERT_MSG(row.position >= 0 && row.position < c.seq_len, "position out of range");
    TROUPE_ASSERT(row.block_table != nullptr);
    std::copy_n(ck_.w().token_embedding + static_cast<int64_t>(row.token) * c.dim, c.dim,
                x_.data() + static_cast<int64_t>(r) * c.dim);
  }
  for (int32_t l = 0; l < c.n_layers; l++) {
    attention_layer(rows, cache, l);
    ffn_layer(n, l);
  }
  classifier(rows, logits);
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
  matmul(q_.data(), xb_.data(), w.wq + ld * dim * dim, packed(l, &layer_weights::wq), n, dim, dim);
  matmul(k_.data(), xb_.data(), w.wk + ld * kv_dim * dim, packed(l, &layer_weights::wk), n, dim, kv_dim);
  matmul(v_.data(), xb_.data(), w.wv + ld * kv_dim * dim, packed(l, &layer_weights::wv), n, dim, kv_dim);
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
        cpu::fast::attention(&xb_[r * dim], &q_[r * dim], scores, kv, rows[r].position + 1, shape);
      else
        cpu::reference::attention(&xb_[r * dim], &q_[r * dim], scores, kv, rows[r].position + 1, shape);
    }
  };
  if (pool_ != nullptr && n > 1)
    pool_->parallel_for(n, attend);
  else
    attend(0, 0, n);
  matmul(xb2_.data(), xb_.data(), w.wo + ld * dim * dim, packed(l, &layer_weights::wo), n, dim, dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) x_[i] += xb2_[i];
}

void transformer::ffn_layer(int32_t n, int32_t l) {
  const model_config& c = config_;
  const weights& w = ck_.w();
  const int32_t dim = c.dim, hidden = c.hidden_dim;
  const int64_t ld = l;
  for (int32_t r = 0; r < n; r++)
    cpu::reference::rmsnorm(&xb_[r * dim], &x_[r * dim], w.rms_ffn + ld * dim, dim);
  matmul(hb_.data(), xb_.data(), w.w1 + ld * hidden * dim, packed(l, &layer_weights::w1), n, dim, hidden);
  matmul(hb2_.data(), xb_.data(), w.w3 + ld * hidden * dim, packed(l, &layer_weights::w3), n, dim, hidden);
  cpu::reference::swiglu(hb_.data(), hb2_.data(), n * hidden);
  matmul(xb_.data(), hb_.data(), w.w2 + ld * dim * hidden, packed(l, &layer_weights::w2), n, hidden, dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * dim; i++) x_[i] += xb_[i];
}

void transformer::classifier(const std::vector<forward_row>& rows, std::vector<float>& logits) {
  const model_config& c = config_;
  int32_t m = 0;  // rows that want logits, packed to the front of xb_
  for (size_t r = 0; r < rows.size(); r++)
    if (rows[r].want_logits)
      cpu::reference::rmsnorm(&xb_[static_cast<size_t>(m++) * c.dim], &x_[r * c.dim], ck_.w().rms_final, c.dim);
  logits.resize(static_cast<size_t>(m) * c.vocab_size);
  if (m > 0) matmul(logits.data(), xb_.data(), ck_.w().wcls, path_ == kernel_path::fast ? &wcls_ : nullptr, m, c.dim, c.vocab_size);
}

}  // namespace troupe::model
