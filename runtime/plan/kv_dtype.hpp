#pragma once

/// The type the KV cache stores keys and values in (`kv_cache_dtype`, docs/gguf.md "KV cache
/// type"), and the KV that leaves a pool carries. On the floor of runtime/ (plan/): it includes
/// nothing above it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::kv {

/// f32: as computed. f16: rounded to IEEE half (to nearest even). q8_0: per 32 values of a
/// token's row, one f16 scale and 32 int8 (llama.cpp's Q8_0, quantized as its x86 CPU backend
/// does); the row's length must be a multiple of 32.
enum class kv_dtype : uint8_t { f32, f16, q8_0 };

/// "f32", "f16", "q8_0"; "invalid" for any other value (one from another process).
[[nodiscard]] constexpr std::string_view name_of(kv_dtype t) {
  return t == kv_dtype::f32 ? "f32" : t == kv_dtype::f16 ? "f16" : t == kv_dtype::q8_0 ? "q8_0" : "invalid";
}

/// name_of as a string: how CAF prints the type inside messages.
[[nodiscard]] inline std::string to_string(kv_dtype t) { return std::string(name_of(t)); }

/// The type named `name` ("f32", "f16", "q8_0"); nullopt if none.
[[nodiscard]] constexpr std::optional<kv_dtype> kv_dtype_named(std::string_view name) {
  for (kv_dtype t : {kv_dtype::f32, kv_dtype::f16, kv_dtype::q8_0})
    if (name == name_of(t)) return t;
  return std::nullopt;
}

/// Whether `t` is one of the types (a value from another process may be any).
[[nodiscard]] constexpr bool is_kv_dtype(kv_dtype t) {
  return t == kv_dtype::f32 || t == kv_dtype::f16 || t == kv_dtype::q8_0;
}

/// Bytes of one row of `n` values (n a multiple of 32 for q8_0): 4n, 2n, 34n / 32.
[[nodiscard]] constexpr int64_t kv_row_bytes(kv_dtype t, int64_t n) {
  return t == kv_dtype::f32 ? 4 * n : t == kv_dtype::f16 ? 2 * n : n / 32 * 34;
}

/// Bytes per value on average: 4, 2, 1.0625 (the simulator's kv_bytes_per_value).
[[nodiscard]] constexpr double kv_bytes_per_value(kv_dtype t) {
  return static_cast<double>(kv_row_bytes(t, 32)) / 32.0;
}

}  // namespace troupe::kv
