// `power_of_two` (router.hpp): the lighter of two candidates drawn at random, per role.
#include <algorithm>

#include "runtime/balance/router.hpp"
#include "runtime/sampling/philox.hpp"

namespace troupe::balance {
namespace {

enum class role : uint32_t { decode = 0, prefill = 1 };

class power_of_two_router final : public router {
 public:
  explicit power_of_two_router(uint64_t seed) : seed_(seed) {}

  placement choose(const std::vector<engine_load>& engines, const candidates& c, const route_request& r) override {
    const uint64_t number = r.number;
    placement out;
    out.decode = pick(engines, c.decode, number, role::decode, decode_score);
    if (!c.prefill.empty())
      out.prefill = pick(engines, c.prefill, number, role::prefill,
                         [](const engine_load& e) { return static_cast<double>(e.num_prefill_tokens); });
    return out;
  }

 private:
  /// Two distinct candidates, uniform over ordered pairs (modulo bias below 2^-32 for any
  /// realistic engine count), the lighter one by `key`; ties to the lower index.
  template <class Key>
  size_t pick(const std::vector<engine_load>& engines, const std::vector<size_t>& among, uint64_t number, role r,
              Key&& key) const {
    if (among.size() == 1) return among.front();
    const auto words = sampling::philox4x32_10(
        {static_cast<uint32_t>(number), static_cast<uint32_t>(number >> 32), static_cast<uint32_t>(r), 0},
        {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
    const size_t n = among.size();
    const size_t i = words[0] % n;
    size_t j = words[1] % (n - 1);
    if (j >= i) j++;
    const size_t a = among[std::min(i, j)], b = among[std::max(i, j)];
    return key(engines[b]) < key(engines[a]) ? b : a;
  }

  uint64_t seed_;
};

}  // namespace

std::unique_ptr<router> make_power_of_two(const router_options& o) {
  return std::make_unique<power_of_two_router>(o.seed);
}

}  // namespace troupe::balance
