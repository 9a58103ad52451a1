#include "runtime/plan/kv_data.hpp"

namespace troupe::kv {

bool holds_kv(int64_t num_layers, int64_t num_tokens, int64_t kv_dim, kv_dtype dtype, size_t num_keys,
              size_t num_values) {
  if (num_layers < 0 || num_tokens < 0 || kv_dim < 0 || kv_dim > (int64_t{1} << 40) || !is_kv_dtype(dtype)) return false;
  if (dtype == kv_dtype::q8_0 && kv_dim % 32 != 0) return false;
  uint64_t per_layer = 0;
  uint64_t n = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(num_tokens), static_cast<uint64_t>(kv_row_bytes(dtype, kv_dim)),
                             &per_layer) ||
      __builtin_mul_overflow(per_layer, static_cast<uint64_t>(num_layers), &n))
    return false;
  return num_keys == n && num_values == n;
}

}  // namespace troupe::kv
