#pragma once

/// Bounds on what a peer of the CAF port can make a node hold (issue 21, point 5;
/// docs/security.md "Limits"): the largest message a peer may announce, how long a cluster
/// connection may stay silent, and how long a TLS handshake may stay pending.
///
/// CAF 0.17.6 offers no hook for the first and the last, so they are enforced where CAF calls
/// out of its own library (network_limits.cpp and tls.cpp define the functions CAF calls, which
/// the dynamic linker prefers over CAF's and libssl's). They are therefore process-wide: one
/// set of limits per process, applied by configure_network (actors/tls.hpp).

#include <cstdint>

#include <caf/fwd.hpp>

namespace troupe::actors {

struct network_limits {
  /// The largest BASP payload a peer may announce in a frame header. CAF reserves the announced
  /// size before reading a byte of it (a 32-byte header claiming 4 GiB made a node allocate
  /// 4 GiB); a larger announcement now closes that connection. It also bounds what this process
  /// sends: a KV hand-off over CAF larger than it fails its request with a clear error.
  uint32_t max_message_bytes = 64u << 20;
  /// A cluster connection that receives nothing (not even CAF's heartbeats, sent every quarter
  /// of this) for this long is closed; 0 = never.
  int32_t idle_timeout_ms = 30000;
  /// A TLS connection accepted by this process whose handshake is not complete after this long
  /// is closed (CAF 0.17's OpenSSL module spins a core while one is pending).
  int32_t tls_handshake_timeout_ms = 5000;
};

/// Sets CAF's heartbeat and connection timeout in `cfg` and the process-wide bounds.
void apply_network_limits(caf::actor_system_config& cfg, const network_limits& limits);

/// The process-wide bounds in force (the defaults until apply_network_limits is called).
[[nodiscard]] network_limits current_network_limits();

}  // namespace troupe::actors
