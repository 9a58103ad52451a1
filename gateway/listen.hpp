#pragma once

/// The listening socket both gateways (HTTP, msgpack) start from.

#include <cstdint>
#include <string>

namespace troupe::gateway {

/// A listening socket on host:port (IPv4 or IPv6, as `host` resolves; SO_REUSEADDR, backlog
/// SOMAXCONN), or -1.
[[nodiscard]] int listen_on(const std::string& host, uint16_t port);

/// The port the socket `fd` is bound to.
[[nodiscard]] uint16_t bound_port(int fd);

}  // namespace troupe::gateway
