#pragma once

/// How an embedding request pools its prompt's final hidden states (after the final norm,
/// before the classifier) into one vector: the mean of every position, the last position's, or
/// the first position's (`cls`, the BOS token's for a decoder). A leaf header: the step plan
/// carries it (exec_chunk::pooling) as its underlying integer, checked with `is_valid`.

#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::engine {

enum class pooling_mode : uint8_t {
  none,  ///< not an embedding request: it samples
  mean,
  last,
  cls,
};

[[nodiscard]] constexpr bool is_valid(pooling_mode p) {
  return static_cast<uint8_t>(p) <= static_cast<uint8_t>(pooling_mode::cls);
}

/// "mean", "last" or "cls"; nothing for any other name ("none" included: a request that pools).
[[nodiscard]] inline std::optional<pooling_mode> parse_pooling(std::string_view name) {
  if (name == "mean") return pooling_mode::mean;
  if (name == "last") return pooling_mode::last;
  if (name == "cls") return pooling_mode::cls;
  return std::nullopt;
}

[[nodiscard]] constexpr const char* to_string(pooling_mode p) {
  switch (p) {
    case pooling_mode::mean: return "mean";
    case pooling_mode::last: return "last";
    case pooling_mode::cls: return "cls";
    case pooling_mode::none: break;
  }
  return "none";
}

}  // namespace troupe::engine
