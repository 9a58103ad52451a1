#include "actors/system/network_limits.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caf/actor_system_config.hpp>
#include <caf/node_id.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/network/native_socket.hpp>
#include <caf/timespan.hpp>
#include <spdlog/spdlog.h>

#include "runtime/common/error.hpp"

namespace troupe::actors {
namespace {

// Process-wide: CAF's network threads read them from the functions below.
std::atomic<uint32_t> max_message_bytes{network_limits{}.max_message_bytes};
std::atomic<int32_t> idle_timeout_ms{network_limits{}.idle_timeout_ms};
std::atomic<int32_t> tls_handshake_timeout_ms{network_limits{}.tls_handshake_timeout_ms};
std::atomic<int32_t> max_connections{network_limits{}.max_connections};
std::atomic<int32_t> max_connections_per_address{network_limits{}.max_connections_per_address};

/// The connections accepted at the published ports, by socket and by peer address.
class connection_table {
 public:
  void guard(uint16_t port) {
    std::lock_guard lock(mutex_);
    ports_.insert(port);
  }

  /// Whether `listener` is one of the published ports' sockets.
  bool guards(int listener) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
    const uint16_t port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    std::lock_guard lock(mutex_);
    return ports_.count(port) != 0;
  }

  /// Counts `fd` (just accepted from `peer`) unless a limit is reached: then false.
  bool admit(int fd, const std::string& peer) {
    std::lock_guard lock(mutex_);
    const int32_t total = max_connections.load(), per_host = max_connections_per_address.load();
    int32_t& from_peer = by_peer_[peer];
    if (static_cast<int32_t>(peer_of_.size()) >= total || from_peer >= per_host) {
      if (from_peer == 0) by_peer_.erase(peer);
      spdlog::warn("refused a CAF connection from {}: {} open in all (limit {}), {} from that address (limit {}) "
                   "([limits] max_connections, max_connections_per_host)",
                   peer, peer_of_.size(), total, from_peer, per_host);
      return false;
    }
    from_peer++;
    peer_of_[fd] = peer;
    mark(fd, true);
    return true;
  }

  /// `fd` is being closed: uncounts it if it was counted. close() is called for every file of
  /// the process (and in forked children, where a lock held by another thread at the fork would
  /// never be released): only a counted socket takes the lock.
  void closing(int fd) {
    if (!marked(fd)) return;
    std::lock_guard lock(mutex_);
    auto it = peer_of_.find(fd);
    if (it == peer_of_.end()) return;
    if (auto by = by_peer_.find(it->second); by != by_peer_.end() && --by->second == 0) by_peer_.erase(by);
    peer_of_.erase(it);
    mark(fd, false);
  }

 private:
  std::mutex mutex_;
  std::set<uint16_t> ports_;
  std::map<int, std::string> peer_of_;   // counted socket -> its peer's address
  std::map<std::string, int32_t> by_peer_;  // peer's address -> its counted sockets
  // One bit per file descriptor below 65536: counted (set and cleared under the lock). A
  // higher descriptor is always looked up under the lock.
  static constexpr int num_marked = 1 << 16;
  std::array<std::atomic<uint64_t>, num_marked / 64> marks_{};

  [[nodiscard]] bool marked(int fd) const {
    if (fd < 0) return false;
    if (fd >= num_marked) return true;
    return (marks_[static_cast<size_t>(fd) / 64].load(std::memory_order_acquire) >> (fd % 64)) & 1u;
  }
  void mark(int fd, bool on) {
    if (fd < 0 || fd >= num_marked) return;
    const uint64_t bit = uint64_t{1} << (fd % 64);
    if (on)
      marks_[static_cast<size_t>(fd) / 64].fetch_or(bit, std::memory_order_release);
    else
      marks_[static_cast<size_t>(fd) / 64].fetch_and(~bit, std::memory_order_release);
  }
};

connection_table& connections() {
  static connection_table* table = new connection_table;  // never destroyed: close() may run at exit
  return *table;
}

/// The peer's address of a connected socket, as text ("?" when unknown).
std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  else if (addr.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof text);
  return text;
}

/// The function these definitions replace: a sanitizer's interceptor when the binary has one
/// (ASan and TSan intercept accept and close to track sockets), else libc's.
template <class Function>
Function next_function(const char* name) {
  void* f = ::dlsym(RTLD_DEFAULT, ("__interceptor_" + std::string(name)).c_str());
  if (f == nullptr) f = ::dlsym(RTLD_NEXT, name);
  TROUPE_ASSERT_MSG(f != nullptr, "the C library's socket functions are not found");
  return reinterpret_cast<Function>(f);
}

using accept_function = int (*)(int, sockaddr*, socklen_t*);
using close_function = int (*)(int);

close_function libc_close() {
  static const close_function f = next_function<close_function>("close");
  return f;
}

/// The numbers of closed BASP connections, held until CAF has cleaned the connection up.
///
/// CAF 0.17.6's BASP broker names a connection by its socket's number and cleans a closed one
/// up later, through its message queue (after every message received before the close is
/// delivered). Linux gives a new socket the lowest free number, so a connection accepted in
/// between can get the closed one's number; the late cleanup then erases the new connection's
/// route and state (basp_broker::connection_cleanup -> routing_table::erase_direct), and the
/// node can no longer answer that peer: a client's request was lost with no error (its
/// `troupe client` waited out the first-token timeout). So a connected socket CAF closes is
/// replaced by /dev/null under the same number (dup3: the connection closes at once, the number
/// stays taken) and the number is released when CAF's cleanup of that connection has run.
/// Numbers whose cleanup never comes (a system shut down) are released oldest first beyond a
/// bound, so a process cannot run out of descriptors through them.
class held_sockets {
 public:
  /// CAF closes `fd`: true if its number is now held (the caller must not close it).
  bool hold(int fd) {
    if (!is_connected_socket(fd)) return false;
    std::lock_guard lock(mutex_);
    if (cleaned_.erase(fd) != 0) return false;  // the cleanup came first: nothing to wait for
    if (placeholder_ < 0) placeholder_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (placeholder_ < 0 || ::dup3(placeholder_, fd, O_CLOEXEC) < 0) return false;
    held_.push_back(fd);
    while (held_.size() > bound()) release_locked(held_.front());
    return true;
  }

  /// CAF's cleanup of connection `fd` has run: releases its number, or remembers that the
  /// cleanup came before the close.
  void cleaned_up(int fd) {
    std::lock_guard lock(mutex_);
    if (!release_locked(fd) && is_connected_socket(fd)) {
      cleaned_.insert(fd);
      while (cleaned_.size() > bound()) cleaned_.erase(cleaned_.begin());
    }
  }

  /// `fd` is a new socket (accepted): an earlier cleanup of that number is not its own.
  void reused(int fd) {
    std::lock_guard lock(mutex_);
    cleaned_.erase(fd);
  }

  [[nodiscard]] size_t size() {
    std::lock_guard lock(mutex_);
    return held_.size();
  }

 private:
  std::mutex mutex_;
  int placeholder_ = -1;
  std::deque<int> held_;  // oldest first
  std::set<int> cleaned_;

  static bool is_connected_socket(int fd) {
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    int listening = 0;
    socklen_t len = sizeof listening;
    return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening == 0;
  }

  /// At most an eighth of the descriptor limit, and at most 256.
  static size_t bound() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 256;
    return std::max<size_t>(1, std::min<size_t>(256, static_cast<size_t>(limit.rlim_cur) / 8));
  }

  bool release_locked(int fd) {
    auto it = std::find(held_.begin(), held_.end(), fd);
    if (it == held_.end()) return false;
    held_.erase(it);
    libc_close()(fd);
    return true;
  }
};

held_sockets& held() {
  static held_sockets* h = new held_sockets;  // never destroyed: CAF may close sockets at exit
  return *h;
}

}  // namespace

void apply_network_limits(caf::actor_system_config& cfg, const network_limits& limits) {
  TROUPE_ASSERT(limits.max_message_bytes > 0 && limits.idle_timeout_ms >= 0 && limits.tls_handshake_timeout_ms > 0 &&
                limits.max_connections > 0 && limits.max_connections_per_address > 0);
  max_message_bytes.store(limits.max_message_bytes);
  idle_timeout_ms.store(limits.idle_timeout_ms);
  tls_handshake_timeout_ms.store(limits.tls_handshake_timeout_ms);
  max_connections.store(limits.max_connections);
  max_connections_per_address.store(limits.max_connections_per_address);
  if (limits.idle_timeout_ms == 0) return;
  // CAF closes a BASP connection that received nothing for connection-timeout, checked at each
  // heartbeat tick; the heartbeats keep a quiet but live peer's connection open (both ends send
  // them: every troupe process configures this).
  const auto timeout = std::chrono::milliseconds(limits.idle_timeout_ms);
  cfg.set("middleman.heartbeat-interval", caf::timespan{timeout / 4});
  cfg.set("middleman.connection-timeout", caf::timespan{timeout});
}

network_limits current_network_limits() {
  return {max_message_bytes.load(), idle_timeout_ms.load(), tls_handshake_timeout_ms.load(), max_connections.load(),
          max_connections_per_address.load()};
}

bool fits_between(const caf::node_id& to, const caf::node_id& from, uint64_t payload_bytes) {
  return to == from || payload_bytes + kv_message_overhead_bytes <= max_message_bytes.load();
}

void guard_listening_port(uint16_t port) { connections().guard(port); }

size_t num_held_socket_numbers() { return held().size(); }

}  // namespace troupe::actors

// CAF 0.17.6 accepts every connection at a published port (policy::tcp::try_accept calls
// accept, then closes with close_socket, i.e. close): nothing bounds how many a peer holds
// open. These definitions take the place of libc's for the whole process (the executable's
// symbols come first) and count the sockets accepted at published ports: one over
// [limits] max_connections or max_connections_per_host is closed at once, and accept reports
// EAGAIN, which CAF treats as "nothing to accept". Every other accept and close is libc's
// unchanged. tests/limits_test.cpp (...MaxConnections...) fails without them.
extern "C" int accept(int listener, sockaddr* addr, socklen_t* len) {
  using troupe::actors::accept_function;
  static const accept_function libc_accept = troupe::actors::next_function<accept_function>("accept");
  const int fd = libc_accept(listener, addr, len);
  if (fd >= 0) troupe::actors::held().reused(fd);
  if (fd < 0 || !troupe::actors::connections().guards(listener)) return fd;
  if (troupe::actors::connections().admit(fd, troupe::actors::peer_address(fd))) return fd;
  troupe::actors::libc_close()(fd);
  errno = EAGAIN;
  return -1;
}

extern "C" int close(int fd) {
  troupe::actors::connections().closing(fd);
  return troupe::actors::libc_close()(fd);
}

// CAF 0.17.6's BASP broker reads a frame header, checks it with basp::valid, then reserves the
// payload length the header announces before reading any of it: one 32-byte header claiming
// 4 GiB made the receiving node allocate 4 GiB, before any handshake (issue 21). CAF calls
// valid() through the PLT, so this definition takes its place (the executable's symbol comes
// first): a header announcing more than max_message_bytes is invalid, and CAF closes that
// connection as it does any malformed frame. Everything else is CAF's own check.
// tests/limits_test.cpp (OversizedHeader.*) fails without it.
namespace caf::io::basp {

bool valid(const header& hdr) {
  using function = bool (*)(const header&);
  static const function caf_valid =
      reinterpret_cast<function>(::dlsym(RTLD_NEXT, "_ZN3caf2io4basp5validERKNS1_6headerE"));
  TROUPE_ASSERT_MSG(caf_valid != nullptr, "libcaf_io's caf::io::basp::valid not found");
  const uint32_t limit = troupe::actors::max_message_bytes.load(std::memory_order_relaxed);
  if (hdr.payload_len > limit) {
    spdlog::warn("closed a CAF connection whose peer announced a {}-byte message (the limit is {} bytes: "
                 "[limits] max_message_mib)",
                 hdr.payload_len, limit);
    return false;
  }
  return caf_valid(hdr);
}

}  // namespace caf::io::basp

// The two ends of held_sockets (above): CAF closes every socket through close_socket and cleans
// every BASP connection up through connection_cleanup, both called through the PLT, so these
// definitions take their place. tests/limits_test.cpp (...SocketNumber...) fails without them.
namespace caf::io {

void network::close_socket(native_socket fd) {
  if (troupe::actors::held().hold(fd)) {
    troupe::actors::connections().closing(fd);  // the connection is closed: uncounted
    return;
  }
  ::close(fd);
}

void basp_broker::connection_cleanup(connection_handle hdl, sec code) {
  using function = void (*)(basp_broker*, connection_handle, sec);
  static const function caf_cleanup = reinterpret_cast<function>(
      ::dlsym(RTLD_NEXT, "_ZN3caf2io11basp_broker18connection_cleanupENS0_17connection_handleENS_3secE"));
  TROUPE_ASSERT_MSG(caf_cleanup != nullptr, "libcaf_io's caf::io::basp_broker::connection_cleanup not found");
  caf_cleanup(this, hdl, code);
  troupe::actors::held().cleaned_up(static_cast<int>(hdl.id()));
}

}  // namespace caf::io
