// Reference kernels: short loops with one job each, in llama2.c's order. The fast path in
// fast.cpp must reproduce these bits exactly.
#include <cmath>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant_blocks.hpp"

namespace troupe::kernels::cpu::reference {

void matmul(float* out, const float* x, const float* w, int32_t rows, int32_t n, int32_t d) {
  for (int32_t r = 0; r < rows; r++) {
    const float* xr = x + static_cast<int64_t>(r) * n;  // (n)
    for (int32_t i = 0; i < d; i++) {
      const float* wi = w + static_cast<int64_t>(i) * n;  // (n)
      float val = 0.0f;
      for (int32_t j = 0; j < n; j++) val += wi[j] * xr[j];
      out[static_cast<int64_t>(r) * d + i] = val;
    }
  }
}

void matmul_q80(float* out, const int8_t* xq, const float* xs, const q80_matrix& w, int32_t rows) {
  const int32_t gs = w.group_size, num_groups = w.n / gs;
  for (int32_t r = 0; r < rows; r++) {
    for (int32_t i = 0; i < w.d; i++) {
      float val = 0.0f;
      for (int32_t g = 0; g < num_groups; g++) {
        const int8_t* x = xq + static_cast<int64_t>(r) * w.n + g * gs;       // (gs)
        const int8_t* wi = w.q + static_cast<int64_t>(i) * w.n + g * gs;     // (gs)
        int32_t dot = 0;
        for (int32_t k = 0; k < gs; k++) dot += static_cast<int32_t>(x[k]) * static_cast<int32_t>(wi[k]);
        val += static_cast<float>(dot) * w.s[static_cast<int64_t>(i) * num_groups + g] *
               xs[static_cast<int64_t>(r) * num_groups + g];
      }
      out[static_cast<int64_t>(r) * w.d + i] = val;
    }
  }
}

void rmsnorm(float* out, const float* x, const float* weight, int32_t n, float eps) {
  float ss = 0.0f;
  for (int32_t j = 0; j < n; j++) ss += x[j] * x[j];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int32_t j = 0; j < n; j++) out[j] = weight[j] * (ss * x[j]);
}

void softmax(float* x, int32_t n, exp_source exp) {
  float max_val = x[0];
  for (int32_t i = 1; i < n; i++)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (int32_t i = 0; i < n; i++) {
    x[i] = exp == exp_source::libm ? std::exp(x[i] - max_val) : cpu::exp(x[i] - max_val);
    sum += x[i];
  }
  for (int32_t i = 0; i < n; i++) x[i] /= sum;
}

void shifted_exp(float* out, const float* x, int32_t n, float shift) {
  for (int32_t i = 0; i < n; i++) out[i] = cpu::exp(x[i] - shift);
}

void libm_scaled_exp(float* out, const float* x, int32_t n, float shift, float divisor) {
  for (int32_t i = 0; i < n; i++) out[i] = std::exp((x[i] - shift) / divisor);
}

void rope(float* vec, int32_t n, int32_t head_size, const float* cos, const float* sin) {
  for (int32_t i = 0; i < n; i += 2) {
    const int32_t f = (i % head_size) / 2;
    const float v0 = vec[i];
    const float v1 = vec[i + 1];
    vec[i] = v0 * cos[f] - v1 * sin[f];
    vec[i + 1] = v0 * sin[f] + v1 * cos[f];
  }
}

void rope_neox(float* vec, int32_t n, int32_t head_size, const float* cos, const float* sin) {
  const int32_t half = head_size / 2;
  for (float* head = vec; head < vec + n; head += head_size)
    for (int32_t f = 0; f < half; f++) {
      const float v0 = head[f];
      const float v1 = head[f + half];
      head[f] = v0 * cos[f] - v1 * sin[f];
      head[f + half] = v0 * sin[f] + v1 * cos[f];
    }
}

void swiglu(float* hb, const float* hb2, int32_t n, exp_source exp) {
  for (int32_t i = 0; i < n; i++) {
    float val = hb[i];
    val *= (1.0f / (1.0f + (exp == exp_source::libm ? std::exp(-val) : cpu::exp(-val))));
    hb[i] = val * hb2[i];
  }
}

namespace {

/// ggml's GELU of one float (its ggml_gelu_f32): the tanh approximation.
float gelu_tanh(float x) {
  constexpr float coef_a = 0.044715f, sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  return 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

/// GELU of every f16 value, rounded to f16: ggml's ggml_table_gelu_f16.
const std::vector<uint16_t>& gelu_f16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); i++)
      t[i] = blocks::f32_to_f16(gelu_tanh(blocks::f16_to_f32(static_cast<uint16_t>(i))));
    return t;
  }();
  return table;
}

}  // namespace

void geglu(float* hb, const float* hb2, int32_t n) {
  const std::vector<uint16_t>& table = gelu_f16_table();
  for (int32_t i = 0; i < n; i++) {
    const float x = hb[i];
    const float gelu = x <= -10.0f ? 0.0f : x >= 10.0f ? x : blocks::f16_to_f32(table[blocks::f32_to_f16(x)]);
    hb[i] = gelu * hb2[i];
  }
}

void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape, exp_source exp) {
  const int32_t kv_mul = shape.n_heads / shape.n_kv_heads;
  const float scale = shape.divisor > 0 ? shape.divisor : std::sqrt(static_cast<float>(shape.head_size));
  const int32_t first = shape.first_position(num_positions), count = num_positions - first;
  for (int32_t h = 0; h < shape.n_heads; h++) {
    const float* qh = q + h * shape.head_size;  // (head_size)
    const int32_t kv_offset = (h / kv_mul) * shape.head_size;
    float* sh = scores + static_cast<int64_t>(h) * count;  // (count): position first + i at i
    for (int32_t t = first; t < num_positions; t++) {
      const int64_t slot = static_cast<int64_t>(kv.block_table[t / kv.block_size]) *
                               kv.block_size + t % kv.block_size;
      const int64_t block = slot / kv.block_size, in_block = slot % kv.block_size;
      const float* k = kv.key_cache + (block * kv.kv_dim + kv_offset) * kv.block_size + in_block;
      float score = 0.0f;  // k[i * block_size] is feature kv_offset + i of position t
      for (int32_t i = 0; i < shape.head_size; i++) score += qh[i] * k[static_cast<int64_t>(i) * kv.block_size];
      sh[t - first] = soft_cap(score / scale, shape.softcap);
    }
    softmax(sh, count, exp);
    float* oh = out + h * shape.head_size;  // (head_size)
    for (int32_t i = 0; i < shape.head_size; i++) oh[i] = 0.0f;
    for (int32_t t = first; t < num_positions; t++) {
      const int64_t slot = static_cast<int64_t>(kv.block_table[t / kv.block_size]) *
                               kv.block_size + t % kv.block_size;
      const float* v = kv.value_cache + slot * kv.kv_dim + kv_offset;  // (head_size)
      for (int32_t i = 0; i < shape.head_size; i++) oh[i] += sh[t - first] * v[i];
    }
  }
}

}  // namespace troupe::kernels::cpu::reference
