#pragma once

/// The msgpack gateway (docs/msgpack.md): length-prefixed msgpack frames over TCP in front of
/// the load balancer. Each connection has a reader thread and a writer thread (so connections
/// are capped, in all and per client address: `edge_limits`). The reader
/// decodes frames (`wire::decode_frame`): each request goes to a client actor
/// (`actors::spawn_client`) whose callbacks encode its chunks and its end as frames and push them
/// into the connection's queue; the writer thread writes them. No actor waits on a socket.
/// Several requests may be in flight on one connection, told apart by the client's ids; a cancel
/// frame stops one of them. A connection that closes cancels its requests in flight (the engine
/// frees their KV blocks).
///
/// Bounds (edge_limits, docs/security.md "Limits at the edges"): a frame must arrive within
/// header_timeout of its first byte and is read as its bytes come (an announced length is never
/// allocated ahead of them); a connection with nothing in flight closes after idle_timeout of
/// silence; a write that makes no progress for write_timeout closes it. Output the client leaves
/// unread pauses its next frames at half of output_bytes_max and, past it, cancels its requests
/// and closes it. Requests in flight are capped per connection and per client address, and a
/// priority below `priority_min` is raised to it. Out of descriptors, accepting waits 100 ms
/// between tries. Stopping ends within drain_timeout + 2 s, whatever the clients do.

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/client.hpp"
#include "actors/edge/access.hpp"
#include "actors/edge/edge_limits.hpp"
#include "runtime/common/error.hpp"
#include "runtime/openai/log_lines.hpp"

namespace troupe::gateway {

struct msgpack_options {
  std::string address = "127.0.0.1";
  uint16_t port = 0;                 ///< 0: any free port (`msgpack_gateway::port` says which)
  size_t frame_bytes_max = 1 << 20;  ///< a longer frame is answered with an error, then closed
  actors::client_timeouts timeouts;
  edge_limits limits;
  /// API keys (a connection's first frame is `{"type": "auth", "key"}`, else it is refused) and
  /// TLS; its CORS origins and metrics_public do not apply.
  access_options access;
  /// One access line per request at its end (the logger `access`): text or JSON, with the
  /// prompt or not (docs/http.md "Logs").
  openai::access_log_format access_log;
  /// A stopping gateway waits this long for its requests in flight, then cancels them.
  std::chrono::milliseconds drain_timeout{30000};
};

class msgpack_gateway {
 public:
  /// Listens on address:port and serves on threads of its own until destroyed. Errors:
  /// invalid_argument without a load balancer, io_error naming the address that cannot be bound.
  [[nodiscard]] static expected<std::unique_ptr<msgpack_gateway>> start(caf::actor_system& sys,
                                                                        actors::balancer_client_actor load_balancer,
                                                                        msgpack_options options);
  /// Stops listening and accepting frames; waits for the requests in flight to end (at most
  /// drain_timeout, then they are cancelled, and 2 s more for their ends to be written).
  ~msgpack_gateway();
  msgpack_gateway(const msgpack_gateway&) = delete;
  msgpack_gateway& operator=(const msgpack_gateway&) = delete;

  [[nodiscard]] uint16_t port() const;

  struct impl;

 private:
  explicit msgpack_gateway(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::gateway
