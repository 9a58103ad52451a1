#pragma once

/// Admission by rate: a token bucket in the form of the generic cell rate algorithm (GCRA), in
/// integer nanoseconds so that the simulator replays it exactly. On average `rate_per_s`
/// requests per second are admitted, and up to `burst` at once after a quiet period; a request
/// over the rate is refused (the balancer answers it `overloaded`, HTTP 429), never queued.
///
/// State: the theoretical arrival time `tat` of the next conforming request. A request at `t`
/// conforms when tat - t <= (burst - 1) * interval, where interval = 1e9 / rate_per_s ns;
/// admitting it moves tat to max(tat, t) + interval.

#include <cstdint>

namespace troupe::balance {

class token_bucket {
 public:
  /// `rate_per_s` > 0, `burst` >= 1.
  token_bucket(double rate_per_s, int32_t burst);

  /// Admits a request at `now_ns` (non-decreasing across calls) if it conforms.
  [[nodiscard]] bool take(int64_t now_ns);

  [[nodiscard]] int64_t interval_ns() const { return interval_ns_; }
  void check_invariants() const;

 private:
  int64_t interval_ns_;
  int64_t tolerance_ns_;  // (burst - 1) * interval
  int64_t tat_ns_ = INT64_MIN;
  int64_t last_ns_ = INT64_MIN;
};

}  // namespace troupe::balance
