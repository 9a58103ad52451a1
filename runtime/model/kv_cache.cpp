#include "runtime/model/kv_cache.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/quants.hpp"

namespace troupe::model {

namespace {

using kernels::cpu::weight_type;

weight_type stored_type(kv_dtype t) { return t == kv_dtype::f16 ? weight_type::f16 : weight_type::q8_0; }

/// out (n) = a row of `n` values stored as `t` (f32: little-endian floats), exactly.
void decode_row(kv_dtype t, const uint8_t* row, float* out, int32_t n) {
  if (t == kv_dtype::f32)
    std::memcpy(out, row, sizeof(float) * static_cast<size_t>(n));
  else
    kernels::cpu::dequantize_row(out, row, stored_type(t), n);
}

}  // namespace

kv_dtype default_kv_dtype(const checkpoint& ck) {
  return ck.gguf_float32() ? kv_dtype::f32 : kv_dtype::f16;
}

kv_dtype default_kv_dtype(const model_header& header) { return header.float32 ? kv_dtype::f32 : kv_dtype::f16; }

expected<void> check_kv_dtype(const model_config& c, kv_dtype t) {
  if (t == kv_dtype::q8_0 && c.kv_dim() % 32 != 0)
    return fail(errc::invalid_argument, "kv_cache_dtype q8_0 needs a KV row (n_kv_heads x head_size = " +
                                            std::to_string(c.kv_dim()) + ") that is a multiple of 32; use f16 or f32");
  return {};
}

int32_t context_that_fits(int32_t model_context, int64_t weight_bytes, int64_t bytes_per_token, int64_t available,
                          int32_t block_size) {
  TROUPE_ASSERT(model_context > 0 && bytes_per_token > 0 && block_size > 0);
  if (available < 0) return model_context;
  const int64_t budget = available / 10 * 9 - weight_bytes;
  const int64_t fits = budget > 0 ? budget / bytes_per_token / block_size * block_size : 0;
  return static_cast<int32_t>(std::min<int64_t>(model_context, std::max<int64_t>(fits, block_size)));
}

kv_cache::kv_cache(const model_config& c, int32_t num_blocks, int32_t block_size, kv_dtype dtype)
    : n_layers_(c.n_layers),
      num_blocks_(num_blocks),
      block_size_(block_size),
      kv_dim_(c.kv_dim()),
      dtype_(dtype),
      row_bytes_(kv_row_bytes(dtype, c.kv_dim())) {
  TROUPE_ASSERT(num_blocks > 0);
  TROUPE_ASSERT(block_size > 0);
  TROUPE_ASSERT(check_kv_dtype(c, dtype).has_value());
  const size_t size = static_cast<size_t>(n_layers_) * static_cast<size_t>(layer_bytes());
  keys_ = page_buffer<uint8_t>(size);
  values_ = page_buffer<uint8_t>(size);
}

void kv_cache::write(int32_t layer, int64_t slot, const float* key, const float* value) {
  TROUPE_ASSERT(slot >= 0 && slot < int64_t{num_blocks_} * block_size_);
  if (dtype_ == kv_dtype::f32) {
    float* k = keys(layer) + f32_key_offset(slot);
    for (int32_t d = 0; d < kv_dim_; d++) k[static_cast<int64_t>(d) * block_size_] = key[d];
    std::copy_n(value, kv_dim_, values(layer) + slot * kv_dim_);
    return;
  }
  kernels::cpu::quantize_activations(keys_.data() + row_offset(layer, slot), key, kv_dim_, stored_type(dtype_));
  kernels::cpu::quantize_activations(values_.data() + row_offset(layer, slot), value, kv_dim_, stored_type(dtype_));
}

void kv_cache::read_block(int32_t layer, int32_t block, float* keys_out, float* values_out) const {
  TROUPE_ASSERT(block >= 0 && block < num_blocks_);
  const int64_t block_floats = int64_t{block_size_} * kv_dim_;
  if (dtype_ == kv_dtype::f32) {
    std::copy_n(keys(layer) + block * block_floats, block_floats, keys_out);
    std::copy_n(values(layer) + block * block_floats, block_floats, values_out);
    return;
  }
  // The keys' rows decoded into values_out first, then transposed into place; then the values.
  const uint8_t* key_rows = keys_.data() + row_offset(layer, int64_t{block} * block_size_);
  const uint8_t* value_rows = values_.data() + row_offset(layer, int64_t{block} * block_size_);
  for (int32_t s = 0; s < block_size_; s++)
    kernels::cpu::dequantize_row(values_out + int64_t{s} * kv_dim_, key_rows + s * row_bytes_, stored_type(dtype_), kv_dim_);
  for (int32_t d = 0; d < kv_dim_; d++)
    for (int32_t s = 0; s < block_size_; s++)
      keys_out[int64_t{d} * block_size_ + s] = values_out[int64_t{s} * kv_dim_ + d];
  for (int32_t s = 0; s < block_size_; s++)
    kernels::cpu::dequantize_row(values_out + int64_t{s} * kv_dim_, value_rows + s * row_bytes_, stored_type(dtype_),
                                 kv_dim_);
}

layer_range kv_cache::resolve(layer_range which) const {
  if (which.end < 0) which.end = n_layers_;
  TROUPE_ASSERT(which.first >= 0 && which.first <= which.end && which.end <= n_layers_);
  return which;
}

void kv_cache::copy_block(int32_t src, int32_t dst, layer_range which) {
  TROUPE_ASSERT(src >= 0 && src < num_blocks_);
  TROUPE_ASSERT(dst >= 0 && dst < num_blocks_);
  which = resolve(which);
  const int64_t block_bytes = int64_t{block_size_} * row_bytes_;  // the same in either layout
  for (int32_t l = which.first; l < which.end; l++) {
    const int64_t from = layer_offset(l) + src * block_bytes, to = layer_offset(l) + dst * block_bytes;
    std::copy_n(keys_.data() + from, block_bytes, keys_.data() + to);
    std::copy_n(values_.data() + from, block_bytes, values_.data() + to);
  }
}

namespace {

// Calls f(layer, slot, row) for every layer of `which` and position < num_tokens: the
// position's slot in the pool and its row's index in the flat (layer, token) layout.
template <class F>
void for_each_slot(const int32_t* block_table, int32_t num_tokens, layer_range which, int32_t block_size,
                   int32_t num_blocks, F&& f) {
  for (int32_t l = which.first; l < which.end; l++)
    for (int32_t p = 0; p < num_tokens; p++) {
      const int32_t block = block_table[p / block_size];
      TROUPE_ASSERT(block >= 0 && block < num_blocks);
      f(l, int64_t{block} * block_size + p % block_size, static_cast<int64_t>(l) * num_tokens + p);
    }
}

}  // namespace

void kv_cache::gather(const int32_t* block_table, int32_t num_tokens, uint8_t* keys_out, uint8_t* values_out,
                      layer_range which) const {
  std::vector<float> key(static_cast<size_t>(kv_dim_));
  for_each_slot(block_table, num_tokens, resolve(which), block_size_, num_blocks_,
                [&](int32_t l, int64_t slot, int64_t row) {
                  uint8_t* k = keys_out + row * row_bytes_;
                  uint8_t* v = values_out + row * row_bytes_;
                  if (dtype_ != kv_dtype::f32) {
                    std::copy_n(keys_.data() + row_offset(l, slot), row_bytes_, k);
                    std::copy_n(values_.data() + row_offset(l, slot), row_bytes_, v);
                    return;
                  }
                  const float* transposed = keys(l) + f32_key_offset(slot);
                  for (int32_t d = 0; d < kv_dim_; d++) key[static_cast<size_t>(d)] = transposed[int64_t{d} * block_size_];
                  std::memcpy(k, key.data(), static_cast<size_t>(row_bytes_));
                  std::memcpy(v, values(l) + slot * kv_dim_, static_cast<size_t>(row_bytes_));
                });
}

void kv_cache::scatter(const int32_t* block_table, int32_t num_tokens, const uint8_t* keys_in, const uint8_t* values_in,
                       kv_dtype from, layer_range which) {
  const int64_t from_bytes = kv_row_bytes(from, kv_dim_);
  std::vector<float> key(static_cast<size_t>(kv_dim_)), value(static_cast<size_t>(kv_dim_));
  for_each_slot(block_table, num_tokens, resolve(which), block_size_, num_blocks_,
                [&](int32_t l, int64_t slot, int64_t row) {
                  const uint8_t* k = keys_in + row * from_bytes;
                  const uint8_t* v = values_in + row * from_bytes;
                  if (from == dtype_ && dtype_ != kv_dtype::f32) {
                    std::copy_n(k, row_bytes_, keys_.data() + row_offset(l, slot));
                    std::copy_n(v, row_bytes_, values_.data() + row_offset(l, slot));
                    return;
                  }
                  decode_row(from, k, key.data(), kv_dim_);
                  decode_row(from, v, value.data(), kv_dim_);
                  write(l, slot, key.data(), value.data());
                });
}

}  // namespace troupe::model
