#pragma once

/// Bounds on what a peer of the CAF port can make a node hold (issue 21, point 5;
/// docs/security.md "Limits"): the largest message a peer may announce, how long a cluster
/// connection may stay silent, how long a TLS handshake may stay pending, and how many
/// connections a node accepts.
///
/// CAF 0.17.6 offers no hook for most of them, so they are enforced where CAF calls out of its
/// own library (network_limits.cpp and tls.cpp define the functions CAF calls, which the dynamic
/// linker prefers over libcaf_io's, libssl's and libc's). They are therefore process-wide: one
/// set of limits per process, applied by configure_network (actors/system/tls.hpp).

#include <cstddef>
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
  /// Connections accepted at this process's published ports, in all and from one address: one
  /// more is closed at once.
  int32_t max_connections = 1024;
  int32_t max_connections_per_address = 64;
};

/// Sets CAF's heartbeat and connection timeout in `cfg` and the process-wide bounds.
void apply_network_limits(caf::actor_system_config& cfg, const network_limits& limits);

/// The process-wide bounds in force (the defaults until apply_network_limits is called).
[[nodiscard]] network_limits current_network_limits();

/// What a KV message carries besides its KV payload, generously: the request (its prompt
/// tokens, at 4 bytes each, are bounded by the context), handles and BASP framing.
inline constexpr uint64_t kv_message_overhead_bytes = 1u << 20;

/// Whether a message with a KV payload of `payload_bytes` may go from node `from` to node `to`:
/// always within a node; between nodes only within max_message_bytes (a larger one would close
/// the whole connection between the two nodes).
[[nodiscard]] bool fits_between(const caf::node_id& to, const caf::node_id& from, uint64_t payload_bytes);

/// Counts the connections accepted at `port` (one of this process's published ports) against
/// max_connections and max_connections_per_host. actors::publish_actor calls it.
void guard_listening_port(uint16_t port);

/// How many numbers of closed CAF sockets are held until CAF has cleaned their connections up
/// (network_limits.cpp, held_sockets: CAF 0.17.6 must not see a new connection under a closed
/// one's number before that cleanup). For tests.
[[nodiscard]] size_t num_held_socket_numbers();

}  // namespace troupe::actors
