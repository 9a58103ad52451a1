#include "runtime/kv/cache_class.hpp"

#include <string>

namespace troupe::kv {

const char* to_string(cache_class c) {
  switch (c) {
    case cache_class::chat: return "chat";
    case cache_class::agent: return "agent";
  }
  TROUPE_ASSERT_MSG(false, "not a cache_class");
  return "";
}

expected<cache_class> parse_cache_class(std::string_view name) {
  for (const cache_class c : {cache_class::chat, cache_class::agent})
    if (name == to_string(c)) return c;
  return fail(errc::invalid_argument, "cache_class must be chat or agent, got '" + echo(name) + "'");
}

}  // namespace troupe::kv
