#pragma once

/// A request's traffic class for the cache tiers' lifetimes (issue 14; the seed keeps agent
/// traffic's blocks 3 days and chat's 7: a little chat cache is reread very many times).

#include <cstdint>
#include <string_view>

#include "runtime/common/error.hpp"

namespace troupe::kv {

enum class cache_class : uint8_t { chat, agent };

[[nodiscard]] const char* to_string(cache_class c);

/// Whether `c` names one of the classes: a value from another process is checked with this.
[[nodiscard]] constexpr bool is_valid(cache_class c) {
  return static_cast<uint8_t>(c) <= static_cast<uint8_t>(cache_class::agent);
}

/// "chat" or "agent"; anything else is errc::invalid_argument naming the value.
[[nodiscard]] expected<cache_class> parse_cache_class(std::string_view name);

}  // namespace troupe::kv
