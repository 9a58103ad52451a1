#pragma once

/// What one client may make a gateway (HTTP or msgpack) hold: connections, time, requests in
/// flight, output bytes and priority. docs/security.md "Limits at the edges" lists each with
/// its flag of `troupe serve`. Counted per client address: a host that opens many connections
/// meets its own cap, not the other clients'.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/common/error.hpp"

namespace troupe::gateway {

/// How long a gateway's accepting pauses when the process is out of descriptors (both gateways).
inline constexpr std::chrono::milliseconds accept_backoff{100};

struct edge_limits {
  int32_t max_connections = 512;               ///< open connections in all; one more is closed at once
  int32_t max_connections_per_address = 64;    ///< open connections from one client address
  /// Requests in flight from one client address ([limits] max_pending_per_client): one more is
  /// refused (HTTP 429, msgpack error frame).
  int32_t max_in_flight_per_address = 256;
  int32_t max_in_flight_per_connection = 64;   ///< msgpack: requests in flight on one connection
  /// Bytes queued for a client that does not read them: reading its next requests pauses at
  /// half; past the whole, its requests are cancelled and the connection is closed.
  int64_t output_bytes_max = int64_t{16} << 20;
  std::chrono::milliseconds idle_timeout{60000};    ///< a connection with nothing in flight, silent this long, closes
  std::chrono::milliseconds header_timeout{10000};  ///< an HTTP request head / a msgpack frame, from its first byte
  std::chrono::milliseconds body_timeout{30000};    ///< an HTTP request body, from the end of its head
  std::chrono::milliseconds write_timeout{30000};   ///< a write that makes no progress this long closes the connection
  /// The most urgent priority a gateway request may ask for (a smaller number runs first): one
  /// asking for less is raised to it (clamped, not refused). 0: clients cannot jump the queue.
  int32_t priority_min = 0;
};

/// Whether `l` is usable: every cap and time at least 1 (invalid_argument naming the first
/// that is not).
[[nodiscard]] inline expected<void> check_edge_limits(const edge_limits& l) {
  const std::pair<const char*, int64_t> values[] = {
      {"max_connections", l.max_connections},
      {"max_connections_per_address", l.max_connections_per_address},
      {"max_in_flight_per_address", l.max_in_flight_per_address},
      {"max_in_flight_per_connection", l.max_in_flight_per_connection},
      {"output_bytes_max", l.output_bytes_max},
      {"idle_timeout", l.idle_timeout.count()},
      {"header_timeout", l.header_timeout.count()},
      {"body_timeout", l.body_timeout.count()},
      {"write_timeout", l.write_timeout.count()},
  };
  for (const auto& [name, value] : values)
    if (value < 1) return fail(errc::invalid_argument, std::string("the gateway limit ") + name + " must be 1 or more");
  return {};
}

/// The refusal of a request past max_in_flight_per_address.
[[nodiscard]] inline std::string too_many_in_flight(const edge_limits& l) {
  return "too many requests in flight from this address: " + std::to_string(l.max_in_flight_per_address) +
         " ([limits] max_pending_per_client); wait for one to finish";
}

/// Counts things (connections, requests in flight) per client address, with a cap in all and
/// one per address. Thread-safe. A token may outlive the counts that made it (a client actor's
/// callback can hold one after its gateway is gone): it holds their state.
class address_counts {
 public:
  address_counts(int64_t max_total, int64_t max_per_address)
      : state_(std::make_shared<state>(max_total, max_per_address)) {}

  /// One more for `address`, or null (nothing counted) when a cap is reached; dropping the
  /// token counts it out.
  [[nodiscard]] std::shared_ptr<const void> enter(const std::string& address) {
    state& s = *state_;
    std::lock_guard<std::mutex> lock(s.mutex);
    int64_t& n = s.by_address[address];
    if (s.num_total >= s.max_total || n >= s.max_per_address) {
      if (n == 0) s.by_address.erase(address);
      return nullptr;
    }
    n++;
    s.num_total++;
    return std::shared_ptr<const void>(state_.get(), [counts = state_, address](const void*) { counts->leave(address); });
  }
  [[nodiscard]] int64_t num_total() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->num_total;
  }

 private:
  struct state {
    state(int64_t total, int64_t per_address) : max_total(total), max_per_address(per_address) {}
    void leave(const std::string& address) {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = by_address.find(address);
      TROUPE_ASSERT(it != by_address.end());
      num_total--;
      if (--it->second == 0) by_address.erase(it);
    }

    const int64_t max_total;
    const int64_t max_per_address;
    std::mutex mutex;
    int64_t num_total = 0;                     // guarded by mutex
    std::map<std::string, int64_t> by_address;  // guarded by mutex
  };
  std::shared_ptr<state> state_;
};

}  // namespace troupe::gateway
