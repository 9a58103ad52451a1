// `round_robin` (router.hpp): per role, the first candidate after the engine chosen last.
#include <algorithm>

#include "runtime/balance/router.hpp"

namespace troupe::balance {
namespace {

/// The first of `among` (in engine order) after `last`, cyclically; the first one when none
/// was chosen yet. `among` is not empty.
size_t next_after(const std::vector<size_t>& among, const std::optional<size_t>& last) {
  if (!last) return among.front();
  auto it = std::upper_bound(among.begin(), among.end(), *last);
  return it == among.end() ? among.front() : *it;
}

class round_robin_router final : public router {
 public:
  placement choose(const std::vector<engine_load>&, const candidates& c, const route_request&) override {
    placement out;
    out.decode = next_after(c.decode, last_decode_);
    last_decode_ = out.decode;
    if (!c.prefill.empty()) {
      out.prefill = next_after(c.prefill, last_prefill_);
      last_prefill_ = out.prefill;
    }
    return out;
  }

 private:
  std::optional<size_t> last_decode_;
  std::optional<size_t> last_prefill_;
};

}  // namespace

std::unique_ptr<router> make_round_robin(const router_options&) { return std::make_unique<round_robin_router>(); }

}  // namespace troupe::balance
