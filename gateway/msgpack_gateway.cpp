#include "gateway/msgpack_gateway.hpp"

#include <atomic>
#include <cerrno>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "gateway/blocking_queue.hpp"
#include "gateway/listen.hpp"
#include "wire/msgpack_rpc.hpp"

namespace troupe::gateway {
namespace {

/// Reads until `out` is full, the peer closed or the socket failed; returns the bytes read.
size_t read_exact(int fd, std::string& out) {
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::recv(fd, out.data() + got, out.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return got;
    got += static_cast<size_t>(n);
  }
  return got;
}

bool write_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

/// One client connection. The reader thread owns the requests' start and the connection's end;
/// the writer thread drains `outbox`, where client actors push frames.
struct connection {
  explicit connection(int socket) : fd(socket) {}
  ~connection() { ::close(fd); }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  const int fd;
  blocking_queue<std::optional<std::string>> outbox;  ///< frames to write; nullopt: stop
  std::mutex mutex;
  std::condition_variable idle;
  std::map<uint64_t, actors::client_actor> in_flight;  ///< by the client's id; guarded by mutex
  std::thread reader;
  std::atomic<bool> finished{false};  ///< the reader thread is done: join and drop it

  void write_frames() {
    bool broken = false;
    while (std::optional<std::string> frame = outbox.pop()) {
      if (broken || write_all(fd, *frame)) continue;
      broken = true;  // the client is gone: wake the reader, which cancels what is in flight
      ::shutdown(fd, SHUT_RDWR);
    }
  }
  void refuse(std::optional<uint64_t> id, std::string message) {
    outbox.push(wire::encode_error(id, {errc::invalid_argument, std::move(message)}));
  }
  void end_request(uint64_t id, std::string frame) {
    outbox.push(std::move(frame));
    std::lock_guard<std::mutex> lock(mutex);
    in_flight.erase(id);
    idle.notify_all();
  }
  /// The client's cancel frame for `id`: its request ends with finish_reason "cancelled". An id
  /// not in flight (its end already went out, or never used) is ignored.
  void cancel(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = in_flight.find(id);
    if (it == in_flight.end() || !it->second) return;
    spdlog::info("msgpack: the client cancels request id {}", id);
    caf::anon_send(it->second, msg::cancel_request{});
  }
  void cancel_all() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [id, client] : in_flight) {
      spdlog::info("msgpack: the client of request id {} went away: cancelling it", id);
      caf::anon_send(client, msg::cancel_request{});
    }
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex);
    idle.wait(lock, [this] { return in_flight.empty(); });
  }
};

}  // namespace

struct msgpack_gateway::impl {
  impl(caf::actor_system& s, actors::balancer_client_actor lb, msgpack_options o)
      : sys(s), load_balancer(std::move(lb)), options(std::move(o)) {}

  caf::actor_system& sys;
  actors::balancer_client_actor load_balancer;
  msgpack_options options;
  int listen_fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  std::mutex connections_mutex;
  std::list<std::shared_ptr<connection>> connections;  // guarded by connections_mutex

  void accept_connections();
  void serve(const std::shared_ptr<connection>& c);
  bool read_frame(const std::shared_ptr<connection>& self);
  void handle_frame(const std::shared_ptr<connection>& c, const std::string& body);
  void start_request(const std::shared_ptr<connection>& c, wire::request decoded);
};

void msgpack_gateway::impl::accept_connections() {
  for (;;) {
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0 && stopping) return;
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      spdlog::error("msgpack: accept failed (errno {}): no new connections", errno);
      return;
    }
    auto c = std::make_shared<connection>(fd);
    std::lock_guard<std::mutex> lock(connections_mutex);
    for (auto it = connections.begin(); it != connections.end();) {
      if (!(*it)->finished) {
        ++it;
        continue;
      }
      (*it)->reader.join();
      it = connections.erase(it);
    }
    connections.push_back(c);
    c->reader = std::thread([this, c] { serve(c); });
  }
}

/// The connection's life: frames until it ends, then its requests end (cancelled when the client
/// left; run to their end when the gateway stops), then the writer flushes and stops.
void msgpack_gateway::impl::serve(const std::shared_ptr<connection>& c) {
  std::thread writer([c] { c->write_frames(); });
  while (read_frame(c)) {
  }
  if (!stopping) c->cancel_all();
  c->wait_idle();
  c->outbox.push(std::nullopt);
  writer.join();
  ::shutdown(c->fd, SHUT_RDWR);  // the client sees the end now; the descriptor is closed when reaped
  c->finished = true;
}

/// Reads one frame and starts its request (or answers its error). False: the connection ends.
bool msgpack_gateway::impl::read_frame(const std::shared_ptr<connection>& self) {
  connection& c = *self;
  std::string header(wire::frame_header_bytes, '\0');
  const size_t got = read_exact(c.fd, header);
  if (got == 0) return false;  // the client closed between frames
  if (got < header.size()) {
    c.refuse(std::nullopt, "the connection ended inside a frame header");
    return false;
  }
  const uint32_t length = wire::frame_length(header);
  if (length > options.frame_bytes_max) {
    c.refuse(std::nullopt, "the frame has " + std::to_string(length) + " bytes; the limit is " +
                               std::to_string(options.frame_bytes_max) + ": closing the connection");
    return false;
  }
  std::string body(length, '\0');
  if (read_exact(c.fd, body) < length) {
    c.refuse(std::nullopt, "the connection ended inside a frame of " + std::to_string(length) + " bytes");
    return false;
  }
  handle_frame(self, body);
  return true;
}

void msgpack_gateway::impl::handle_frame(const std::shared_ptr<connection>& c, const std::string& body) {
  auto decoded = wire::decode_frame(body);
  if (!decoded) return c->outbox.push(wire::encode_error(decoded.error().id, decoded.error().problem));
  if (const auto* cancel = std::get_if<wire::cancel>(&*decoded)) return c->cancel(cancel->id);
  start_request(c, std::get<wire::request>(std::move(*decoded)));
}

void msgpack_gateway::impl::start_request(const std::shared_ptr<connection>& c, wire::request decoded) {
  const uint64_t id = decoded.id;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    // The entry is made before the client exists: its end may come before spawn_client returns.
    if (!c->in_flight.emplace(id, actors::client_actor{}).second)
      return c->refuse(id, "the id " + std::to_string(id) + " is already in flight on this connection");
  }
  actors::client_actor client = actors::spawn_client(
      sys, load_balancer, std::move(decoded.completion),
      [c, id](const msg::completion_chunk& chunk) { c->outbox.push(wire::encode_chunk(id, chunk)); },
      [c, id](const expected<actors::completion>& outcome) {
        c->end_request(id, outcome ? wire::encode_end(id, outcome->end) : wire::encode_error(id, outcome.error()));
      },
      options.timeouts);
  std::lock_guard<std::mutex> lock(c->mutex);
  if (auto it = c->in_flight.find(id); it != c->in_flight.end()) it->second = std::move(client);
}


expected<std::unique_ptr<msgpack_gateway>> msgpack_gateway::start(caf::actor_system& sys,
                                                                  actors::balancer_client_actor load_balancer,
                                                                  msgpack_options options) {
  if (!load_balancer) return fail(errc::invalid_argument, "the msgpack gateway needs the load balancer's node");
  if (options.frame_bytes_max < 1) return fail(errc::invalid_argument, "the msgpack gateway needs a frame limit of 1 byte or more");
  auto state = std::make_unique<impl>(sys, std::move(load_balancer), std::move(options));
  impl& s = *state;
  s.listen_fd = listen_on(s.options.host, s.options.port);
  if (s.listen_fd < 0)
    return fail(errc::io_error, "cannot listen for msgpack on " + s.options.host + ":" + std::to_string(s.options.port));
  s.port = bound_port(s.listen_fd);
  s.acceptor = std::thread([&s] { s.accept_connections(); });
  return std::unique_ptr<msgpack_gateway>(new msgpack_gateway(std::move(state)));
}

msgpack_gateway::msgpack_gateway(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

msgpack_gateway::~msgpack_gateway() {
  impl& s = *impl_;
  s.stopping = true;
  ::shutdown(s.listen_fd, SHUT_RDWR);  // wakes accept()
  s.acceptor.join();
  ::close(s.listen_fd);
  // No more frames are read; what is in flight runs to its end and is written.
  std::lock_guard<std::mutex> lock(s.connections_mutex);
  for (const auto& c : s.connections) ::shutdown(c->fd, SHUT_RD);
  for (const auto& c : s.connections) c->reader.join();
}

uint16_t msgpack_gateway::port() const { return impl_->port; }

}  // namespace troupe::gateway
