#include "runtime/model/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

namespace troupe::model {
namespace {

void append(std::string& out, const void* data, size_t bytes) { out.append(static_cast<const char*>(data), bytes); }

/// Appends `count` values of `w` as int8 values, then their per-group float scales.
void append_q80(std::string& out, const float* w, int64_t count, int32_t group_size) {
  std::string values(static_cast<size_t>(count), '\0');
  std::vector<float> scales(static_cast<size_t>(count / group_size));
  for (int64_t g = 0; g < count / group_size; g++) {
    const float* wg = w + g * group_size;  // (group_size)
    float w_max = 0.0f;
    for (int32_t i = 0; i < group_size; i++) w_max = std::max(w_max, std::fabs(wg[i]));
    const float scale = w_max / 127.0f;
    scales[static_cast<size_t>(g)] = scale;
    for (int32_t i = 0; i < group_size; i++) {
      // nearbyint rounds half to even in the default rounding mode, as torch.round does.
      const float q = scale > 0.0f ? std::nearbyint(wg[i] / scale) : 0.0f;
      values[static_cast<size_t>(g * group_size + i)] = static_cast<char>(static_cast<int8_t>(q));
    }
  }
  out += values;
  append(out, scales.data(), scales.size() * sizeof(float));
}

}  // namespace

expected<std::string> to_q80(const checkpoint& ck, int32_t group_size) {
  const model_config& c = ck.config();
  if (ck.q80() != nullptr)
    return fail(errc::invalid_argument, "model file '" + ck.path() + "' is already Q8_0 (version 2)");
  if (ck.moe() != nullptr)
    return fail(errc::invalid_argument, "model file '" + ck.path() + "' is a mixture of experts; quantize reads dense ones");
  if (auto ok = require_llama2c(ck, "quantize"); !ok) return tl::unexpected(ok.error());
  if (group_size <= 0 || c.dim % group_size != 0 || c.hidden_dim % group_size != 0)
    return fail(errc::invalid_argument, "group size " + std::to_string(group_size) + " does not divide dim " +
                                            std::to_string(c.dim) + " and hidden_dim " + std::to_string(c.hidden_dim));
  std::string out;
  const int32_t header[] = {static_cast<int32_t>(q80_magic), 2, c.dim, c.hidden_dim, c.n_layers, c.n_heads,
                            c.n_kv_heads, c.vocab_size, c.seq_len};
  append(out, header, sizeof header);
  out.push_back(c.shared_classifier ? '\1' : '\0');
  append(out, &group_size, sizeof group_size);
  out.resize(static_cast<size_t>(q80_header_bytes), '\0');
  const weights& w = ck.w();
  const int64_t dim = c.dim, layers = c.n_layers, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  append(out, w.rms_att, static_cast<size_t>(layers * dim) * sizeof(float));
  append(out, w.rms_ffn, static_cast<size_t>(layers * dim) * sizeof(float));
  append(out, w.rms_final, static_cast<size_t>(dim) * sizeof(float));
  append_q80(out, w.token_embedding, c.vocab_size * dim, group_size);
  const std::pair<const float*, int64_t> per_layer[] = {{w.wq, dim * dim},    {w.wk, kv_dim * dim},
                                                        {w.wv, kv_dim * dim}, {w.wo, dim * dim},
                                                        {w.w1, hidden * dim}, {w.w2, dim * hidden},
                                                        {w.w3, hidden * dim}};
  for (const auto& [tensor, layer_size] : per_layer)
    for (int64_t l = 0; l < layers; l++) append_q80(out, tensor + l * layer_size, layer_size, group_size);
  if (!c.shared_classifier) append_q80(out, w.wcls, c.vocab_size * dim, group_size);
  return out;
}

}  // namespace troupe::model
