#include "runtime/common/ggml_encode.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "runtime/common/byte_writer.hpp"
#include "runtime/common/error.hpp"
#include "runtime/common/gguf.hpp"

namespace troupe::model {
namespace {

using kernels::cpu::weight_type;

/// The value an f16 field holds once `f` is stored in it.
float as_stored_half(float f) {
  const uint16_t h = float_to_half(f);
  _Float16 stored;
  std::memcpy(&stored, &h, 2);
  return static_cast<float>(stored);
}

/// Round to nearest, ties to even (ggml's nearest_int).
int nearest(float x) { return static_cast<int>(std::nearbyint(x)); }

/// The element of largest magnitude among x[0..n) (the first of equals), signed.
float signed_max(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; i++)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  return max;
}

void encode_q8_0(std::string& out, const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
  put<uint16_t>(out, float_to_half(d));
  for (int i = 0; i < 32; i++) put<int8_t>(out, static_cast<int8_t>(std::round(x[i] * inverse)));
}

void encode_q4_0(std::string& out, const float* x) {
  const float d = signed_max(x, 32) / -8.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
  put<uint16_t>(out, float_to_half(d));
  const auto level = [&](float v) { return static_cast<uint8_t>(std::min(15, static_cast<int>(v * inverse + 8.5f))); };
  for (int i = 0; i < 16; i++) put<uint8_t>(out, static_cast<uint8_t>(level(x[i]) | level(x[i + 16]) << 4));
}

/// Q4_K and Q5_K: 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each, packed in 12 bytes
/// as ggml's get_scale_min_k4 reads them; levels 0..(2^bits - 1) with x = d·sc·q - dmin·m.
void encode_k_min_max(std::string& out, const float* x, int bits) {
  const int top = (1 << bits) - 1;
  std::array<float, 8> scale{}, min{};
  for (int j = 0; j < 8; j++) {
    const float* v = x + 32 * j;
    const float lo = std::min(0.0f, *std::min_element(v, v + 32)), hi = *std::max_element(v, v + 32);
    scale[j] = (hi - lo) / static_cast<float>(top);
    min[j] = -lo;
  }
  const float d = as_stored_half(*std::max_element(scale.begin(), scale.end()) / 63.0f);
  const float dmin = as_stored_half(*std::max_element(min.begin(), min.end()) / 63.0f);
  std::array<uint8_t, 8> ls{}, lm{};
  for (int j = 0; j < 8; j++) {
    ls[j] = static_cast<uint8_t>(d > 0 ? std::min(63, nearest(scale[j] / d)) : 0);
    lm[j] = static_cast<uint8_t>(dmin > 0 ? std::min(63, nearest(min[j] / dmin)) : 0);
  }
  std::array<uint8_t, 12> packed{};
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      packed[j] = ls[j];
      packed[j + 4] = lm[j];
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls[j] & 15) | (lm[j] & 15) << 4);
      packed[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
  std::array<uint8_t, 256> q{};
  for (int i = 0; i < 256; i++) {
    const float step = d * ls[i / 32];
    q[i] = static_cast<uint8_t>(step > 0 ? std::clamp(nearest((x[i] + dmin * lm[i / 32]) / step), 0, top) : 0);
  }
  put<uint16_t>(out, float_to_half(d));
  put<uint16_t>(out, float_to_half(dmin));
  out.append(reinterpret_cast<const char*>(packed.data()), packed.size());
  if (bits == 5) {  // the fifth bits: chunk c of 64 puts its halves' in bits 2c and 2c + 1
    std::array<uint8_t, 32> qh{};
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++)
        qh[l] |= static_cast<uint8_t>((q[64 * c + l] >> 4) << (2 * c) | (q[64 * c + 32 + l] >> 4) << (2 * c + 1));
    out.append(reinterpret_cast<const char*>(qh.data()), qh.size());
  }
  for (int c = 0; c < 4; c++)  // chunk c of 64: low nibbles its first 32, high nibbles the rest
    for (int l = 0; l < 32; l++) put<uint8_t>(out, static_cast<uint8_t>((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4));
}

/// Q6_K: 16 sub-blocks of 16 with an int8 scale each, levels -32..31 stored plus 32 as 4 low bits
/// (ql) and 2 high bits (qh), in ggml's interleaving of each half of 128.
void encode_q6_k(std::string& out, const float* x) {
  std::array<float, 16> scale{};
  for (int j = 0; j < 16; j++) scale[j] = signed_max(x + 16 * j, 16) / -32.0f;
  float amax = 0.0f;
  for (float s : scale) amax = std::max(amax, std::fabs(s));
  const float d = as_stored_half(amax / 127.0f);
  std::array<int8_t, 16> sc{};
  for (int j = 0; j < 16; j++) sc[j] = static_cast<int8_t>(d > 0 ? std::clamp(nearest(scale[j] / d), -127, 127) : 0);
  std::array<uint8_t, 256> q{};
  for (int i = 0; i < 256; i++) {
    const float step = d * sc[i / 16];
    q[i] = static_cast<uint8_t>((step != 0 ? std::clamp(nearest(x[i] / step), -32, 31) : 0) + 32);
  }
  std::array<uint8_t, 128> ql{};
  std::array<uint8_t, 64> qh{};
  for (int h = 0; h < 2; h++)
    for (int l = 0; l < 32; l++) {
      const uint8_t* v = q.data() + 128 * h + l;
      ql[64 * h + l] = static_cast<uint8_t>((v[0] & 15) | (v[64] & 15) << 4);
      ql[64 * h + l + 32] = static_cast<uint8_t>((v[32] & 15) | (v[96] & 15) << 4);
      qh[32 * h + l] = static_cast<uint8_t>(v[0] >> 4 | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
    }
  out.append(reinterpret_cast<const char*>(ql.data()), ql.size());
  out.append(reinterpret_cast<const char*>(qh.data()), qh.size());
  out.append(reinterpret_cast<const char*>(sc.data()), sc.size());
  put<uint16_t>(out, float_to_half(d));
}

}  // namespace

void encode_row(std::string& out, const float* x, int64_t n, weight_type t) {
  const int32_t block = kernels::cpu::block_elements(t);
  TROUPE_ASSERT_MSG(n % block == 0, "rows are whole blocks");
  if (t == weight_type::bf16) {  // rounded as the kernels round activations to BF16
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(kernels::cpu::row_bytes(t, n)));
    kernels::cpu::quantize_activations(reinterpret_cast<uint8_t*>(out.data() + at), x, static_cast<int32_t>(n), t);
    return;
  }
  for (int64_t i = 0; i < n; i += block) {
    const float* v = x + i;
    switch (t) {
      case weight_type::f32: put<float>(out, *v); break;
      case weight_type::f16: put<uint16_t>(out, float_to_half(*v)); break;
      case weight_type::bf16: break;  // above
      case weight_type::q8_0: encode_q8_0(out, v); break;
      case weight_type::q4_0: encode_q4_0(out, v); break;
      case weight_type::q4_k: encode_k_min_max(out, v, 4); break;
      case weight_type::q5_k: encode_k_min_max(out, v, 5); break;
      case weight_type::q6_k: encode_q6_k(out, v); break;
      case weight_type::q8_k: TROUPE_ASSERT_MSG(false, "Q8_K is an activation type, never a file's"); break;
    }
  }
}

}  // namespace troupe::model
