#include "actors/edge/msgpack_gateway.hpp"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <variant>

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/edge/listen.hpp"
#include "actors/edge/socket_channel.hpp"
#include "runtime/openai/api.hpp"
#include "messages/msgpack_rpc.hpp"

namespace troupe::gateway {
namespace {

using steady = std::chrono::steady_clock;

/// How long a stopping gateway waits for the ends of the requests it cancelled.
constexpr std::chrono::seconds stop_grace{2};

enum class read_end { done, closed, timed_out };

/// Appends bytes from `in` to `out` as they arrive until it holds `n` (a length the client
/// announced is never allocated ahead of its bytes), the peer closes or fails, or `deadline`.
read_end read_until(socket_channel& in, std::string& out, size_t n, steady::time_point deadline) {
  char buf[16 << 10];
  while (out.size() < n) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0) return read_end::timed_out;
    if (!in.readable_within(left)) continue;
    const ssize_t got = in.read_some(buf, std::min(sizeof buf, n - out.size()));
    if (got < 0) continue;
    if (got == 0) return read_end::closed;
    out.append(buf, static_cast<size_t>(got));
  }
  return read_end::done;
}

/// One msgpack request as the access log records it, from its arrival to its end frame: route
/// `msgpack`, the status an HTTP client would have had (200, or the error's), the balancer's id.
class msgpack_access {
 public:
  msgpack_access(const std::string& peer, const msg::completion_request& r, const openai::access_log_format& format,
                 std::shared_ptr<spdlog::logger> logger)
      : format_(format), logger_(std::move(logger)) {
    record_.route = "msgpack";
    record_.client = peer;
    if (!format.prompts) return;
    if (!r.prompt.empty() || r.messages.empty()) record_.prompts.push_back(r.prompt);
    for (const chat_message& m : r.messages) record_.prompts.push_back(m.content);
  }
  /// Writes the line of a request that ended with `end`, or failed with `e`.
  void write(const msg::completion_end* end, const error* e) {
    record_.status = e ? openai::error_from(*e).status : 200;
    if (end) {
      record_.request_id = std::to_string(end->request_id);
      record_.prompt_tokens = end->num_prompt_tokens;
      record_.completion_tokens = end->num_generated_tokens;
      if (end->num_generated_tokens > 0) record_.ttft_ms = static_cast<double>(end->ttft_ns) / 1e6;
      record_.finish_reason = engine::to_string(end->finish_reason);
    }
    record_.e2e_ms = std::chrono::duration<double, std::milli>(steady::now() - start_).count();
    logger_->info(format_.json ? openai::render_access_json(record_, format_) : openai::render_access_text(record_, format_));
  }

 private:
  const steady::time_point start_ = steady::now();
  const openai::access_log_format format_;
  const std::shared_ptr<spdlog::logger> logger_;
  openai::access_record record_;
};

/// A request in flight on a connection: its client actor (null until spawned) and its place
/// among its address's requests in flight.
struct in_flight_request {
  actors::client_actor client;
  std::shared_ptr<const void> counted;
};

/// One client connection. The reader thread owns the requests' start and the connection's end;
/// the writer thread drains `outbox`, where client actors push frames.
struct connection {
  connection(int socket, ssl_ctx_st* tls, std::string address, std::shared_ptr<const void> counted, const edge_limits& l)
      : channel(socket, tls), fd(socket), peer(std::move(address)), open(std::move(counted)), limits(l) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  socket_channel channel;  ///< closes the socket when the connection goes
  const int fd;
  const std::string peer;            ///< the client's address
  std::shared_ptr<const void> open;  ///< counts it among the open connections; the reader's, let go at its end
  const edge_limits limits;
  std::mutex mutex;
  std::condition_variable changed;  ///< outbox, in_flight, dropping or given_up changed
  // Guarded by mutex.
  std::deque<std::string> outbox;  ///< frames to write
  int64_t queued_bytes = 0;        ///< in outbox
  bool no_more_frames = false;     ///< the writer stops once outbox is empty
  bool dropping = false;           ///< the client is gone or does not read: frames are dropped
  bool given_up = false;           ///< a stopping gateway waits no more for the requests' ends
  std::map<uint64_t, in_flight_request> in_flight;  ///< by the client's id
  std::thread reader;
  std::atomic<bool> finished{false};  ///< the reader thread is done: join and drop it
  bool authorized = false;            ///< its key was accepted (the reader thread's)

  /// Queues `frame`. Past output_bytes_max unread, the client's requests are cancelled and the
  /// connection closes.
  void push(std::string frame) {
    std::lock_guard<std::mutex> lock(mutex);
    if (dropping) return;
    queued_bytes += static_cast<int64_t>(frame.size());
    outbox.push_back(std::move(frame));
    if (queued_bytes > limits.output_bytes_max)
      close_broken(std::to_string(queued_bytes) + " bytes left unread (the limit is " +
                   std::to_string(limits.output_bytes_max) + ", --gateway-output-mib)");
    changed.notify_all();
  }
  /// The connection cannot go on (`why`): its requests are cancelled, its output dropped, its
  /// socket shut (the reader and the writer wake). Called with `mutex` held.
  void close_broken(const std::string& why) {
    if (std::exchange(dropping, true)) return;
    spdlog::warn("msgpack: closing a connection from {}: {}; cancelling its {} request(s)", peer, why, in_flight.size());
    outbox.clear();
    queued_bytes = 0;
    for (const auto& [id, r] : in_flight)
      if (r.client) caf::anon_send(r.client, msg::cancel_request{});
    ::shutdown(fd, SHUT_RDWR);
    changed.notify_all();
  }
  void write_frames() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [this] { return !outbox.empty() || no_more_frames; });
      if (outbox.empty()) return;
      std::string frame = std::move(outbox.front());
      outbox.pop_front();
      queued_bytes -= static_cast<int64_t>(frame.size());
      changed.notify_all();
      lock.unlock();
      if (channel.write_all(frame, limits.write_timeout)) continue;
      lock.lock();
      close_broken("a write failed or made no progress for " + std::to_string(limits.write_timeout.count()) + " ms");
    }
  }
  void stop_writing() {
    std::lock_guard<std::mutex> lock(mutex);
    no_more_frames = true;
    changed.notify_all();
  }
  /// Waits while over half of output_bytes_max is unread (the client's next frames wait);
  /// false once the connection is closing.
  bool wait_for_the_client() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [this] { return dropping || queued_bytes <= limits.output_bytes_max / 2; });
    return !dropping;
  }
  [[nodiscard]] bool idle() {
    std::lock_guard<std::mutex> lock(mutex);
    return in_flight.empty() && outbox.empty();
  }
  void refuse(std::optional<uint64_t> id, std::string message) {
    push(wire::encode_error(id, {errc::invalid_argument, std::move(message)}));
  }
  void end_request(uint64_t id, std::string frame) {
    push(std::move(frame));
    std::lock_guard<std::mutex> lock(mutex);
    in_flight.erase(id);
    changed.notify_all();
  }
  /// The client's cancel frame for `id`: its request ends with finish_reason "cancelled". An id
  /// not in flight (its end already went out, or never used) is ignored.
  void cancel(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = in_flight.find(id);
    if (it == in_flight.end() || !it->second.client) return;
    spdlog::info("msgpack: the client cancels request id {}", id);
    caf::anon_send(it->second.client, msg::cancel_request{});
  }
  void cancel_all() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [id, r] : in_flight) {
      spdlog::info("msgpack: the client of request id {} went away: cancelling it", id);
      if (r.client) caf::anon_send(r.client, msg::cancel_request{});
    }
  }
  /// Until every request has ended (or a stopping gateway gave up on them).
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [this] { return in_flight.empty() || given_up; });
  }
  void give_up() {
    std::lock_guard<std::mutex> lock(mutex);
    given_up = true;
    changed.notify_all();
  }
};

}  // namespace

struct msgpack_gateway::impl {
  impl(caf::actor_system& s, actors::balancer_client_actor lb, msgpack_options o)
      : sys(s),
        load_balancer(std::move(lb)),
        options(std::move(o)),
        open_connections(options.limits.max_connections, options.limits.max_connections_per_address),
        requests(std::numeric_limits<int64_t>::max(), options.limits.max_in_flight_per_address) {}

  caf::actor_system& sys;
  actors::balancer_client_actor load_balancer;
  msgpack_options options;
  address_counts open_connections;  ///< connections by client address
  address_counts requests;          ///< requests in flight by client address
  const std::shared_ptr<spdlog::logger> access_log = access_logger();
  int listen_fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  std::mutex connections_mutex;
  std::condition_variable changed;  ///< stopping, or a connection finished
  std::list<std::shared_ptr<connection>> connections;  // guarded by connections_mutex

  void accept_connections();
  void admit(int fd);
  void serve(const std::shared_ptr<connection>& c);
  void finish(const std::shared_ptr<connection>& c);
  bool wait_first_byte(connection& c);
  bool read_frame(const std::shared_ptr<connection>& self);
  /// Handles one frame; false: the connection ends (its key was refused).
  bool handle_frame(const std::shared_ptr<connection>& c, const std::string& body);
  void start_request(const std::shared_ptr<connection>& c, wire::request decoded);
  std::optional<error> enroll(connection& c, uint64_t id);
  bool wait_finished(std::chrono::milliseconds bound);
};

/// Accepts until the gateway stops. Out of descriptors (or memory), it waits `accept_backoff`
/// between tries (the pending connection stays in the backlog) and says so once per spell.
void msgpack_gateway::impl::accept_connections() {
  bool starved = false;
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (stopping) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd >= 0) {
      starved = false;
      admit(fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) {
      spdlog::error("msgpack: accept failed (errno {}): no new connections", errno);
      return;
    }
    if (!std::exchange(starved, true))
      spdlog::warn("msgpack: cannot accept a connection (errno {}: out of descriptors or memory): retrying every {} ms",
                   errno, accept_backoff.count());
    std::unique_lock<std::mutex> lock(connections_mutex);
    changed.wait_for(lock, accept_backoff, [this] { return stopping.load(); });
  }
}

/// A new connection, if its address and the gateway have room (else an error frame, sent if
/// the socket takes it at once, and it is closed), served on a reader thread of its own.
void msgpack_gateway::impl::admit(int fd) {
  const std::string peer = peer_address(fd);
  std::shared_ptr<const void> counted = open_connections.enter(peer);
  if (!counted) {
    spdlog::debug("msgpack: refused a connection from {}: too many open", peer);
    if (!options.access.tls)  // a TLS client could not read a plaintext frame
      send_now(fd, wire::encode_error(std::nullopt, {errc::overloaded, "too many connections: at most " +
                                                   std::to_string(options.limits.max_connections) + " in all and " +
                                                   std::to_string(options.limits.max_connections_per_address) +
                                                   " per address (--gateway-max-connections[-per-address])"}));
    ::close(fd);
    return;
  }
  const auto wait = options.limits.write_timeout;
  timeval send_timeout{static_cast<time_t>(wait.count() / 1000), static_cast<suseconds_t>(wait.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  auto c = std::make_shared<connection>(fd, options.access.tls.get(), peer, std::move(counted), options.limits);
  std::lock_guard<std::mutex> lock(connections_mutex);
  for (auto it = connections.begin(); it != connections.end();) {
    if (!(*it)->finished) {
      ++it;
      continue;
    }
    (*it)->reader.join();
    it = connections.erase(it);
  }
  try {
    c->reader = std::thread([this, c] { serve(c); });
  } catch (const std::system_error& e) {  // out of threads: this connection closes, the others go on
    spdlog::error("msgpack: cannot start a thread for a connection from {} ({}): closing it", peer, e.what());
    return;
  }
  connections.push_back(c);
}

/// The connection's life: frames until it ends, then its requests end (cancelled when the client
/// left; run to their end when the gateway stops, within its bound), then the writer flushes.
void msgpack_gateway::impl::serve(const std::shared_ptr<connection>& c) {
  if (!c->channel.handshake(options.limits.header_timeout)) {
    spdlog::info("msgpack: a TLS handshake with {} failed or took over {} ms: closing", c->peer,
                 options.limits.header_timeout.count());
    return finish(c);
  }
  std::thread writer;
  try {
    writer = std::thread([c] { c->write_frames(); });
  } catch (const std::system_error& e) {
    spdlog::error("msgpack: cannot start a thread for a connection from {} ({}): closing it", c->peer, e.what());
    return finish(c);
  }
  while (read_frame(c)) {
  }
  if (!stopping) c->cancel_all();
  c->wait_idle();
  c->stop_writing();
  writer.join();
  finish(c);
}

void msgpack_gateway::impl::finish(const std::shared_ptr<connection>& c) {
  ::shutdown(c->fd, SHUT_RDWR);  // the client sees the end now; the descriptor is closed when reaped
  c->open.reset();
  std::lock_guard<std::mutex> lock(connections_mutex);
  c->finished = true;
  changed.notify_all();
}

/// Waits for the next frame's first byte. A connection with nothing in flight and nothing to
/// write that stays silent for idle_timeout is closed (false).
bool msgpack_gateway::impl::wait_first_byte(connection& c) {
  for (;;) {
    if (c.channel.readable_within(options.limits.idle_timeout)) return true;
    if (!c.idle()) continue;
    spdlog::info("msgpack: closing a connection from {}: idle for {} ms", c.peer, options.limits.idle_timeout.count());
    return false;
  }
}

/// Reads one frame and starts its request (or answers its error). False: the connection ends.
bool msgpack_gateway::impl::read_frame(const std::shared_ptr<connection>& self) {
  connection& c = *self;
  if (!c.wait_for_the_client() || !wait_first_byte(c)) return false;
  const auto deadline = steady::now() + options.limits.header_timeout;
  const std::string late = "a frame took over " + std::to_string(options.limits.header_timeout.count()) +
                           " ms to arrive (--gateway-header-timeout-ms): closing the connection";
  std::string header;
  const read_end head = read_until(c.channel, header, wire::frame_header_bytes, deadline);
  if (head == read_end::closed && header.empty()) return false;  // the client closed between frames
  if (head != read_end::done) {
    c.refuse(std::nullopt, head == read_end::timed_out ? late : "the connection ended inside a frame header");
    return false;
  }
  const uint32_t length = wire::frame_length(header);
  if (length > options.frame_bytes_max) {
    c.refuse(std::nullopt, "the frame has " + std::to_string(length) + " bytes; the limit is " +
                               std::to_string(options.frame_bytes_max) + ": closing the connection");
    return false;
  }
  std::string body;
  const read_end rest = read_until(c.channel, body, length, deadline);
  if (rest != read_end::done) {
    c.refuse(std::nullopt, rest == read_end::timed_out
                               ? late
                               : "the connection ended inside a frame of " + std::to_string(length) + " bytes");
    return false;
  }
  return handle_frame(self, body);
}

bool msgpack_gateway::impl::handle_frame(const std::shared_ptr<connection>& c, const std::string& body) {
  auto decoded = wire::decode_frame(body);
  const auto* key = decoded ? std::get_if<wire::auth>(&*decoded) : nullptr;
  if (!options.access.keys.empty() && !c->authorized) {
    if (!key || !options.access.keys.accepts(key->key)) {
      spdlog::info("msgpack: refused a connection from {}: {}", c->peer, key ? "a wrong API key" : "no API key");
      c->push(wire::encode_unauthenticated(key ? "the API key is not valid"
                                               : "this gateway needs an API key: send {\"type\": \"auth\", \"key\": KEY} first"));
      return false;
    }
    c->authorized = true;
    return true;
  }
  if (key) return true;  // no keys, or accepted already: nothing to do
  if (!decoded) {
    c->push(wire::encode_error(decoded.error().id, decoded.error().problem));
    return true;
  }
  if (const auto* cancel = std::get_if<wire::cancel>(&*decoded))
    c->cancel(cancel->id);
  else
    start_request(c, std::get<wire::request>(std::move(*decoded)));
  return true;
}

/// Counts request `id` in flight on `c`, or says why it is refused: its id is in flight already,
/// or the connection or its address has the most requests in flight allowed.
std::optional<error> msgpack_gateway::impl::enroll(connection& c, uint64_t id) {
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.in_flight.count(id) != 0)
    return error{errc::invalid_argument, "the id " + std::to_string(id) + " is already in flight on this connection"};
  const edge_limits& l = options.limits;
  if (c.in_flight.size() >= static_cast<size_t>(l.max_in_flight_per_connection))
    return error{errc::overloaded, "too many requests in flight on this connection: " +
                                       std::to_string(l.max_in_flight_per_connection) +
                                       " (--gateway-max-in-flight-per-connection); wait for one to finish"};
  std::shared_ptr<const void> counted = requests.enter(c.peer);
  if (!counted) return error{errc::overloaded, too_many_in_flight(l)};
  // The entry is made before the client exists: its end may come before spawn_client returns.
  c.in_flight.emplace(id, in_flight_request{actors::client_actor{}, std::move(counted)});
  return std::nullopt;
}

void msgpack_gateway::impl::start_request(const std::shared_ptr<connection>& c, wire::request decoded) {
  const uint64_t id = decoded.id;
  if (auto refused = enroll(*c, id)) return c->push(wire::encode_error(id, *refused));
  // A client asks for its priority; it gets no more urgent one than its allowance.
  decoded.completion.priority = std::max(decoded.completion.priority, options.limits.priority_min);
  // A forced tool_choice's text is read into calls; the client actor runs both callbacks in turn.
  std::shared_ptr<openai::forced_call_reader> forced;
  if (decoded.tool_mode.forced()) forced = std::make_shared<openai::forced_call_reader>(decoded.tool_mode);
  auto access = std::make_shared<msgpack_access>(c->peer, decoded.completion, options.access_log, access_log);
  actors::client_actor client = actors::spawn_client(
      sys, load_balancer, std::move(decoded.completion),
      [c, id, forced](const msg::completion_chunk& chunk) {
        c->push(forced ? wire::encode_forced_chunk(id, chunk, *forced) : wire::encode_chunk(id, chunk));
      },
      [c, id, forced, access](const expected<actors::completion>& outcome) {
        access->write(outcome ? &outcome->end : nullptr, outcome ? nullptr : &outcome.error());
        if (!outcome) return c->end_request(id, wire::encode_error(id, outcome.error()));
        if (forced)
          if (std::string cut = wire::encode_cut_call(id, outcome->end, *forced); !cut.empty()) c->push(std::move(cut));
        c->end_request(id, wire::encode_end(id, outcome->end));
      },
      options.timeouts);
  std::lock_guard<std::mutex> lock(c->mutex);
  if (auto it = c->in_flight.find(id); it != c->in_flight.end()) it->second.client = std::move(client);
}

/// Whether every connection finished within `bound`.
bool msgpack_gateway::impl::wait_finished(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(connections_mutex);
  return changed.wait_for(lock, bound, [this] {
    return std::all_of(connections.begin(), connections.end(), [](const auto& c) { return c->finished.load(); });
  });
}

expected<std::unique_ptr<msgpack_gateway>> msgpack_gateway::start(caf::actor_system& sys,
                                                                  actors::balancer_client_actor load_balancer,
                                                                  msgpack_options options) {
  if (!load_balancer) return fail(errc::invalid_argument, "the msgpack gateway needs the load balancer's node");
  if (options.frame_bytes_max < 1) return fail(errc::invalid_argument, "the msgpack gateway needs a frame limit of 1 byte or more");
  if (auto ok = check_edge_limits(options.limits); !ok) return tl::unexpected(ok.error());
  // OpenSSL writes a TLS connection with write(2): a client gone would raise SIGPIPE and end the
  // process. It is ignored (such a write fails with EPIPE), as servers do.
  if (options.access.tls) std::signal(SIGPIPE, SIG_IGN);
  auto state = std::make_unique<impl>(sys, std::move(load_balancer), std::move(options));
  impl& s = *state;
  s.listen_fd = listen_on(s.options.address, s.options.port);
  if (s.listen_fd < 0)
    return fail(errc::io_error, "cannot listen for msgpack on " + s.options.address + ":" + std::to_string(s.options.port));
  s.port = bound_port(s.listen_fd);
  s.acceptor = std::thread([&s] { s.accept_connections(); });
  return std::unique_ptr<msgpack_gateway>(new msgpack_gateway(std::move(state)));
}

msgpack_gateway::msgpack_gateway(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

/// No more connections or frames; the requests in flight run to their end, for drain_timeout at
/// most, then they are cancelled and their connections closed; after stop_grace nothing more is
/// waited for (their client actors' callbacks hold their connections, not the gateway).
msgpack_gateway::~msgpack_gateway() {
  impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.connections_mutex);
    s.stopping = true;
    s.changed.notify_all();
  }
  ::shutdown(s.listen_fd, SHUT_RDWR);  // wakes accept()
  s.acceptor.join();
  ::close(s.listen_fd);
  std::list<std::shared_ptr<connection>> all;
  {
    std::lock_guard<std::mutex> lock(s.connections_mutex);
    all = s.connections;
  }
  for (const auto& c : all) ::shutdown(c->fd, SHUT_RD);
  if (!s.wait_finished(s.options.drain_timeout)) {
    spdlog::warn("msgpack: requests still in flight after {} ms: cancelling them", s.options.drain_timeout.count());
    for (const auto& c : all) {
      std::lock_guard<std::mutex> lock(c->mutex);
      c->close_broken("the gateway stops");
    }
    if (!s.wait_finished(stop_grace))
      for (const auto& c : all) c->give_up();
  }
  for (const auto& c : all) c->reader.join();
}

uint16_t msgpack_gateway::port() const { return impl_->port; }

}  // namespace troupe::gateway
