#pragma once

/// The bytes of one msgpack gateway connection, for its reader thread and its writer thread:
/// plain recv/send on the socket, or TLS (OpenSSL on the socket set non-blocking: the two
/// threads' SSL calls take turns on a mutex, and every wait for the socket happens outside it,
/// so a reader waiting for bytes never holds up a write).

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string_view>

#include <sys/types.h>

struct ssl_st;
struct ssl_ctx_st;

namespace troupe::gateway {

class socket_channel {
 public:
  /// Over `fd` (owned: closed by the destructor); TLS with `tls` unless null.
  socket_channel(int fd, ssl_ctx_st* tls);
  ~socket_channel();
  socket_channel(const socket_channel&) = delete;
  socket_channel& operator=(const socket_channel&) = delete;

  [[nodiscard]] int fd() const { return fd_; }
  /// The TLS handshake, within `bound` (plain: true at once). False: it failed or took longer.
  [[nodiscard]] bool handshake(std::chrono::milliseconds bound);
  /// Whether bytes (or the end, or an error) can be read within `wait`.
  [[nodiscard]] bool readable_within(std::chrono::milliseconds wait);
  /// Up to `n` bytes into `buf`: how many (> 0), 0 at the end or on a failure, -1 when none has
  /// come yet (wait with readable_within).
  [[nodiscard]] ssize_t read_some(char* buf, size_t n);
  /// All of `bytes`; false if the peer is gone or a write made no progress for `stall`.
  [[nodiscard]] bool write_all(std::string_view bytes, std::chrono::milliseconds stall);

 private:
  const int fd_;
  ssl_st* ssl_ = nullptr;  ///< null: plain
  std::mutex mutex_;       ///< the SSL object's turns (TLS only)
};

}  // namespace troupe::gateway
