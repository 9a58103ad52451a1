#include "actors/edge/socket_channel.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "runtime/common/error.hpp"

namespace troupe::gateway {
namespace {

using steady = std::chrono::steady_clock;

/// Whether `fd` is ready for `events` within `wait` (its end and errors count as ready).
bool ready_within(int fd, short events, std::chrono::milliseconds wait) {
  pollfd p{fd, events, 0};
  int n = 0;
  do n = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 1 << 30)));
  while (n < 0 && errno == EINTR);
  return n != 0;
}

/// What a TLS call that returned `result` waits for: POLLIN, POLLOUT, or 0 (it failed).
short wanted(SSL* ssl, int result) {
  const int e = SSL_get_error(ssl, result);
  return e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
}

std::chrono::milliseconds left(steady::time_point deadline) {
  return std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
}

}  // namespace

socket_channel::socket_channel(int fd, ssl_ctx_st* tls) : fd_(fd) {
  if (!tls) return;
  ssl_ = SSL_new(tls);
  TROUPE_ASSERT_MSG(ssl_ != nullptr, "SSL_new failed");
  SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  SSL_set_fd(ssl_, fd_);
}

socket_channel::~socket_channel() {
  if (ssl_) SSL_free(ssl_);
  ::close(fd_);
}

bool socket_channel::handshake(std::chrono::milliseconds bound) {
  if (!ssl_) return true;
  const steady::time_point deadline = steady::now() + bound;
  for (;;) {
    short events = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const int r = SSL_accept(ssl_);
      if (r == 1) return true;
      events = wanted(ssl_, r);
    }
    if (events == 0 || left(deadline).count() <= 0 || !ready_within(fd_, events, left(deadline))) return false;
  }
}

bool socket_channel::readable_within(std::chrono::milliseconds wait) {
  if (ssl_) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (SSL_pending(ssl_) > 0) return true;
  }
  return ready_within(fd_, POLLIN, wait);
}

ssize_t socket_channel::read_some(char* buf, size_t n) {
  if (!ssl_) {
    const ssize_t got = ::recv(fd_, buf, n, 0);
    if (got < 0 && errno == EINTR) return -1;
    return std::max<ssize_t>(got, 0);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const int got = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (got > 0) return got;
  // A read that needs the socket writable (a TLS key update) waits for input all the same: the
  // writer thread's next write, or the next read, carries it on.
  return wanted(ssl_, got) != 0 ? -1 : 0;
}

bool socket_channel::write_all(std::string_view bytes, std::chrono::milliseconds stall) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    if (!ssl_) {  // blocking: SO_SNDTIMEO bounds a send that makes no progress
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
      continue;
    }
    short events = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const int n = SSL_write(ssl_, bytes.data() + sent, static_cast<int>(std::min<size_t>(bytes.size() - sent, 1 << 30)));
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      events = wanted(ssl_, n);
    }
    if (events == 0 || !ready_within(fd_, events, stall)) return false;
  }
  return true;
}

}  // namespace troupe::gateway
