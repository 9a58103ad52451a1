#pragma once

// Client sockets for the gateway tests: bound to a 127.0.0.x source address (the gateways count
// connections and requests per client address), reads bounded in time (a test of code that
// never answers fails instead of hanging), whole msgpack frames.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "messages/msgpack_rpc.hpp"

namespace troupe::testing {

/// A TCP socket bound to 127.0.0.`source`, not connected yet; a read on it waits `read_wait_s`
/// at most.
inline int loopback_socket(int source, int read_wait_s = 30) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(0x7f000000 | static_cast<uint32_t>(source));
  ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from);
  timeval wait{read_wait_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  return fd;
}

/// Connects `fd` to 127.0.0.1:port.
inline bool connect_loopback(int fd, uint16_t port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
}

/// `n` bytes from `fd` (fewer if the stream ends or a read times out).
inline std::string read_exactly(int fd, size_t n) {
  std::string out;
  char buf[1 << 12];
  while (out.size() < n) {
    const ssize_t r = ::read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (r <= 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

/// Everything until the end of the stream (or a read times out).
inline std::string read_to_end(int fd) {
  std::string out;
  char buf[1 << 14];
  for (ssize_t r; (r = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(r));
  return out;
}

/// The next whole msgpack frame on `fd`, header included; "" at the end of the stream.
inline std::string read_frame(int fd) {
  std::string header = read_exactly(fd, wire::frame_header_bytes);
  if (header.size() < wire::frame_header_bytes) return "";
  return header + read_exactly(fd, wire::frame_length(header));
}

}  // namespace troupe::testing
