// The registry of routing policies (router.hpp). A new policy: one file defining its factory,
// and one line in `policies` below.
#include <cstdio>
#include <utility>

#include "runtime/balance/router.hpp"

namespace troupe::balance {

std::unique_ptr<router> make_round_robin(const router_options& o);    // router_round_robin.cpp
std::unique_ptr<router> make_power_of_two(const router_options& o);  // router_power_of_two.cpp
std::unique_ptr<router> make_prefix_affinity(const router_options& o);  // router_prefix_affinity.cpp

namespace {

class least_loaded_router final : public router {
 public:
  placement choose(const std::vector<engine_load>& engines, const candidates& c, const route_request&) override {
    return least_loaded(engines, c);
  }
};

std::unique_ptr<router> make_least_loaded(const router_options&) { return std::make_unique<least_loaded_router>(); }

struct policy {
  const char* name;
  std::unique_ptr<router> (*make)(const router_options&);
};

constexpr policy policies[] = {
    {"least_loaded", &make_least_loaded},
    {"round_robin", &make_round_robin},
    {"power_of_two", &make_power_of_two},
    {"prefix_affinity", &make_prefix_affinity},
};

}  // namespace

expected<std::unique_ptr<router>> make_router(const router_options& o, size_t num_engines, bool any_cache_tier) {
  // Negated: a NaN fails it too.
  if (!(o.prefix_weight >= 0 && o.prefix_weight <= prefix_weight_max))
  {
    char got[32];
    std::snprintf(got, sizeof(got), "%g", o.prefix_weight);
    return fail(errc::invalid_argument, std::string("prefix_weight must be a number in [0, 1000000], got ") + got);
  }
  if (o.policy == "auto") return num_engines > 1 || any_cache_tier ? make_prefix_affinity(o) : make_least_loaded(o);
  for (const policy& p : policies)
    if (o.policy == p.name) return p.make(o);
  std::string known;
  for (const std::string& name : router_names()) known += (known.empty() ? "" : ", ") + name;
  return fail(errc::invalid_argument, "unknown router '" + o.policy + "'; known: " + known);
}

std::vector<std::string> router_names() {
  std::vector<std::string> names{"auto"};
  for (const policy& p : policies) names.emplace_back(p.name);
  return names;
}

}  // namespace troupe::balance
