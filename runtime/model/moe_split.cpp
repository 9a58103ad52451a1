#include "runtime/model/moe_split.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/sampling/random_stream.hpp"

namespace troupe::model {
namespace {

void append(std::string& out, const float* data, int64_t count) {
  out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(count) * sizeof(float));
}

expected<void> check_options(const checkpoint& dense, const moe_split_options& o) {
  const model_config& c = dense.config();
  const auto bad = [](const std::string& what) { return fail(errc::invalid_argument, what); };
  if (dense.q80() != nullptr) return bad("model file '" + dense.path() + "' is Q8_0; moe-split reads float32 ones");
  if (dense.moe() != nullptr) return bad("model file '" + dense.path() + "' is already a mixture of experts");
  if (auto ok = require_llama2c(dense, "moe-split"); !ok) return ok;
  if (o.n_experts < 1 || o.n_experts > moe_experts_max || c.hidden_dim % o.n_experts != 0)
    return bad("n_experts " + std::to_string(o.n_experts) + " must be in 1.." + std::to_string(moe_experts_max) +
               " and divide hidden_dim " + std::to_string(c.hidden_dim));
  const int32_t top_k = o.top_k == 0 ? o.n_experts : o.top_k;
  if (top_k < 1 || top_k > o.n_experts)
    return bad("top_k " + std::to_string(o.top_k) + " is out of range (1..n_experts " +
               std::to_string(o.n_experts) + ")");
  if (o.router == router_init::all && top_k != o.n_experts)
    return bad("the 'all' router routes to every expert: top_k " + std::to_string(top_k) + " needs a random or "
               "skewed router");
  if (o.router == router_init::skewed && (o.num_hot_experts < 1 || o.num_hot_experts >= o.n_experts))
    return bad("hot experts " + std::to_string(o.num_hot_experts) + " must be in 1..n_experts - 1");
  if (o.router == router_init::skewed && !(std::isfinite(o.skew) && o.skew >= 0.0f))
    return bad("skew " + std::to_string(o.skew) + " must be finite and >= 0");
  return {};
}

/// Layer `layer`'s router weights (n_experts, dim), uniform in ±sqrt(3 / dim): unit-variance
/// logits for unit-variance inputs. Drawn from stream (seed, layer).
std::vector<float> router_weights(const moe_split_options& o, int32_t layer, int32_t dim) {
  sampling::random_stream draws(o.seed, layer, sampling::stream_sample);
  const float scale = std::sqrt(3.0f / static_cast<float>(dim));
  std::vector<float> w(static_cast<size_t>(o.n_experts) * dim);
  for (float& v : w) v = (2.0f * draws.next_float() - 1.0f) * scale;
  return w;
}

/// Every layer's router bias (n_experts): `skew` on the hot experts of the skewed router.
std::vector<float> router_bias(const moe_split_options& o) {
  std::vector<float> bias(static_cast<size_t>(o.n_experts), 0.0f);
  if (o.router == router_init::skewed)
    for (int32_t e : hot_experts(o)) bias[static_cast<size_t>(e)] = o.skew;
  return bias;
}

/// One layer's experts' w2 (n_experts, dim, h / E): the column blocks of the dense w2 (dim, h).
/// (w1 and w3 (h, dim) need no cutting: their row blocks are already (n_experts, h / E, dim).)
void append_experts_w2(std::string& out, const float* w2, const model_config& c, int32_t n_experts) {
  const int64_t part = c.hidden_dim / n_experts;
  for (int64_t e = 0; e < n_experts; e++)
    for (int64_t d = 0; d < c.dim; d++) append(out, w2 + d * c.hidden_dim + e * part, part);
}

}  // namespace

std::vector<int32_t> hot_experts(const moe_split_options& o) {
  TROUPE_ASSERT(o.num_hot_experts >= 1 && o.num_hot_experts < o.n_experts);
  // A stream no layer's router weights use (they take positions 0..n_layers - 1).
  sampling::random_stream draws(o.seed, sampling::stream_position_max, sampling::stream_sample);
  std::vector<int32_t> ids(static_cast<size_t>(o.n_experts));
  std::iota(ids.begin(), ids.end(), 0);
  for (int32_t i = 0; i < o.num_hot_experts; i++)  // a partial Fisher-Yates shuffle
    std::swap(ids[static_cast<size_t>(i)], ids[i + draws.uniform_below(static_cast<uint64_t>(o.n_experts - i))]);
  ids.resize(static_cast<size_t>(o.num_hot_experts));
  std::sort(ids.begin(), ids.end());
  return ids;
}

expected<std::string> to_moe(const checkpoint& dense, const moe_split_options& o) {
  if (auto ok = check_options(dense, o); !ok) return tl::unexpected(ok.error());
  const model_config& c = dense.config();
  const weights& w = dense.w();
  const int32_t top_k = o.top_k == 0 ? o.n_experts : o.top_k;
  const moe::router_kind router = o.router == router_init::all ? moe::router_kind::all : moe::router_kind::top_k;
  int32_t header[13] = {static_cast<int32_t>(moe_magic), moe_version, c.dim, c.hidden_dim / o.n_experts, c.n_layers,
                        c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len, c.shared_classifier ? 1 : 0, o.n_experts,
                        top_k, static_cast<int32_t>(router)};
  std::string out(reinterpret_cast<const char*>(header), sizeof header);
  out.resize(static_cast<size_t>(moe_header_bytes), '\0');
  const int64_t dim = c.dim, layers = c.n_layers, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  append(out, w.token_embedding, c.vocab_size * dim);
  append(out, w.rms_att, layers * dim);
  append(out, w.wq, layers * dim * dim);
  append(out, w.wk, layers * kv_dim * dim);
  append(out, w.wv, layers * kv_dim * dim);
  append(out, w.wo, layers * dim * dim);
  append(out, w.rms_ffn, layers * dim);
  for (int32_t l = 0; l < c.n_layers; l++) {
    // The all router is never read: zeros keep the layout the same for every router.
    const std::vector<float> weight = o.router == router_init::all ? std::vector<float>(o.n_experts * dim, 0.0f)
                                                                   : router_weights(o, l, c.dim);
    append(out, weight.data(), static_cast<int64_t>(weight.size()));
  }
  const std::vector<float> bias = router_bias(o);
  for (int32_t l = 0; l < c.n_layers; l++) append(out, bias.data(), o.n_experts);
  append(out, w.w1, layers * hidden * dim);  // expert e's rows are units [e·h/E, (e+1)·h/E)
  for (int64_t l = 0; l < layers; l++) append_experts_w2(out, w.w2 + l * dim * hidden, c, o.n_experts);
  append(out, w.w3, layers * hidden * dim);
  append(out, w.rms_final, dim);
  if (!c.shared_classifier) append(out, w.wcls, c.vocab_size * dim);
  return out;
}

}  // namespace troupe::model
