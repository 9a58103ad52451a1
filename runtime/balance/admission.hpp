#pragma once

/// The load balancer's admission of completion requests, before anything is spawned for them:
/// `admission` (per-client caps, then the rate) over `token_bucket` (the rate).
///
/// Admission by rate: a token bucket in the form of the generic cell rate algorithm (GCRA), in
/// integer nanoseconds so that the simulator replays it exactly. On average `rate_per_s`
/// requests per second are admitted, and up to `burst` at once after a quiet period; a request
/// over the rate is refused (the balancer answers it `overloaded`, HTTP 429), never queued.
///
/// State: the theoretical arrival time `tat` of the next conforming request. A request at `t`
/// conforms when tat - t <= (burst - 1) * interval, where interval = 1e9 / rate_per_s ns;
/// admitting it moves tat to max(tat, t) + interval.

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "runtime/common/error.hpp"

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


/// The refusal of a request over the rate (`overloaded`, HTTP 429), naming the configured rate.
[[nodiscard]] error over_rate(double rate_per_s, int32_t burst);
/// The refusal of a client with `limit` requests in flight (invalid_argument).
[[nodiscard]] error too_many_in_flight(int32_t limit);

/// Which completion requests the balancer takes. Another process may have at most
/// `max_pending_per_client` requests in flight (counted by `Client`, the process that asked):
/// one client cannot fill every engine's queue. The balancer's own process (`own`: its HTTP and
/// msgpack gateways, which bound their own connections) is exempt. A request over the cap is
/// refused before anything exists for it. One within it is admitted — and counted in flight
/// until `ended` — even when it is over the rate (`rate_per_s` > 0): it is then answered
/// `overloaded` by the request actor the balancer spawns for it. Pure; `Client` needs `<`.
template <class Client>
class admission {
 public:
  /// `rate_per_s` 0: no rate limit; else > 0 with `burst` >= 1 (token_bucket).
  admission(Client own, int32_t max_pending_per_client, double rate_per_s, int32_t burst)
      : own_(std::move(own)), max_pending_(max_pending_per_client), rate_per_s_(rate_per_s), burst_(burst) {
    if (rate_per_s > 0) bucket_.emplace(rate_per_s, burst);
  }

  /// A request from `client` at `now_ns` (non-decreasing). Error: refused (too_many_in_flight);
  /// else admitted and counted in flight, with the error its request actor answers (over_rate)
  /// when it is over the rate.
  [[nodiscard]] expected<std::optional<error>> admit(const Client& client, int64_t now_ns) {
    if (!(client == own_)) {
      auto it = in_flight_.find(client);
      if (it != in_flight_.end() && it->second >= max_pending_) return tl::unexpected(too_many_in_flight(max_pending_));
    }
    std::optional<error> refused;
    if (bucket_ && !bucket_->take(now_ns)) refused = over_rate(rate_per_s_, burst_);
    if (!(client == own_)) in_flight_[client]++;
    return refused;
  }

  /// A request admitted from `client` ended.
  void ended(const Client& client) {
    auto it = in_flight_.find(client);
    if (it != in_flight_.end() && --it->second == 0) in_flight_.erase(it);
  }

  [[nodiscard]] int32_t max_pending_per_client() const { return max_pending_; }
  /// Requests in flight from `client` (0 for the own process, which is not counted).
  [[nodiscard]] int32_t in_flight(const Client& client) const {
    auto it = in_flight_.find(client);
    return it == in_flight_.end() ? 0 : it->second;
  }

 private:
  Client own_;
  int32_t max_pending_;
  double rate_per_s_;
  int32_t burst_;
  std::optional<token_bucket> bucket_;
  std::map<Client, int32_t> in_flight_;  // requests in flight per other process; none at 0
};

}  // namespace troupe::balance
