// `sjf` (policy.hpp): shortest predicted work first, aged by arrival so nothing starves.
#include <string>

#include "runtime/sched/policy.hpp"

namespace troupe::sched {
namespace {

class sjf_policy final : public policy {
 public:
  explicit sjf_policy(int64_t aging_tokens) : aging_tokens_(aging_tokens) {}

  // Work < 2^31 and aging < 2^20: no overflow before 2^42 arrivals.
  int64_t rank(const rank_input& s) const override { return int64_t{s.max_num_tokens} + s.arrival * aging_tokens_; }

 private:
  int64_t aging_tokens_;
};

}  // namespace

expected<std::unique_ptr<policy>> make_sjf(const policy_options& o) {
  if (o.sjf_aging_tokens < 1 || o.sjf_aging_tokens > (1 << 20))
    return fail(errc::invalid_argument,
                "sjf_aging_tokens must be in [1, 1048576], got " + std::to_string(o.sjf_aging_tokens));
  return std::make_unique<sjf_policy>(o.sjf_aging_tokens);
}

}  // namespace troupe::sched
