#pragma once

/// The listening socket both gateways (HTTP, msgpack) start from.

#include <cstdint>
#include <string>

namespace troupe::gateway {

/// A listening socket on address:port (IPv4 or IPv6, as `address` resolves; SO_REUSEADDR, backlog
/// SOMAXCONN), or -1.
[[nodiscard]] int listen_on(const std::string& address, uint16_t port);

/// The numeric address of the peer of the connected socket `fd` ("" if unknown): what the
/// gateways count connections and requests by (edge_limits).
[[nodiscard]] std::string peer_address(int fd);

/// Sends `bytes` on `fd` if the socket takes them at once (a refusal on a connection about to
/// close; a client that does not read gets nothing, and nothing waits).
void send_now(int fd, const std::string& bytes);

/// The port the socket `fd` is bound to.
[[nodiscard]] uint16_t bound_port(int fd);

}  // namespace troupe::gateway
