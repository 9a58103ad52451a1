#include "runtime/balance/admission.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/common/error.hpp"

namespace troupe::balance {

token_bucket::token_bucket(double rate_per_s, int32_t burst)
    : interval_ns_(std::max<int64_t>(1, std::llround(1e9 / rate_per_s))),
      tolerance_ns_(int64_t{burst - 1} * interval_ns_) {
  TROUPE_ASSERT(rate_per_s > 0 && burst >= 1);
}

bool token_bucket::take(int64_t now_ns) {
  TROUPE_ASSERT(now_ns >= last_ns_);
  last_ns_ = now_ns;
  const int64_t tat = std::max(tat_ns_, now_ns);
  if (tat - now_ns > tolerance_ns_) return false;
  tat_ns_ = tat + interval_ns_;
  return true;
}

void token_bucket::check_invariants() const {
  TROUPE_ASSERT(interval_ns_ >= 1 && tolerance_ns_ >= 0 && tolerance_ns_ % interval_ns_ == 0);
  // No admitted request can have pushed tat further than burst intervals past the last request.
  if (tat_ns_ != INT64_MIN) TROUPE_ASSERT(tat_ns_ - last_ns_ <= tolerance_ns_ + interval_ns_);
}


error over_rate(double rate_per_s, int32_t burst) {
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%g", rate_per_s);
  return error{errc::overloaded, std::string("the load balancer admits at most ") + rate + " requests/s (bursts of " +
                                     std::to_string(burst) + ", [load_balancer] rate_limit_per_s); retry later"};
}

error too_many_in_flight(int32_t limit) {
  return error{errc::invalid_argument, "too many requests in flight from this client: " + std::to_string(limit) +
                                           " ([limits] max_pending_per_client); wait for one to finish"};
}

}  // namespace troupe::balance
