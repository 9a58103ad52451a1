// `prefix_affinity` (router.hpp): a candidate's cached prefix of the prompt weighed against its
// load, per role.
#include <algorithm>

#include "runtime/balance/router.hpp"

namespace troupe::balance {
namespace {

class prefix_affinity_router final : public router {
 public:
  explicit prefix_affinity_router(double weight) : weight_(weight) {}

  placement choose(const std::vector<engine_load>& engines, const candidates& c, const route_request& r) override {
    TROUPE_ASSERT(r.cached_tokens.size() == engines.size());
    if (!c.prefill.empty()) {  // the prefill engine computes the prompt: there a prefix counts
      placement out = least_loaded(engines, c);
      out.prefill = lowest(c.prefill, [&](size_t i) {
        return static_cast<double>(engines[i].num_prefill_tokens) - weight_ * static_cast<double>(r.cached_tokens[i]);
      });
      return out;
    }
    const double prompt = std::max(1, r.num_prompt_tokens);
    placement out;
    out.decode = *lowest(c.decode, [&](size_t i) {
      return decode_score(engines[i]) - weight_ * static_cast<double>(r.cached_tokens[i]) / prompt;
    });
    return out;
  }

  bool uses_prefixes() const override { return true; }

 private:
  double weight_;
};

}  // namespace

std::unique_ptr<router> make_prefix_affinity(const router_options& o) {
  return std::make_unique<prefix_affinity_router>(o.prefix_weight);
}

}  // namespace troupe::balance
