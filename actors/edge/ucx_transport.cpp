#include "actors/edge/ucx_transport.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include <ucp/api/ucp.h>

namespace troupe::transport {

namespace {

constexpr ucp_tag_t full_tag_mask = ~ucp_tag_t{0};

/// The idle progress thread sleeps at most this long: a guard against a missed wake-up, not a
/// polling period (UCX events and `ucp_worker_signal` end the sleep early).
constexpr int idle_wait_guard_ms = 100;

/// With requests in flight a missed wake-up would stall a transfer, so the guard is short.
constexpr int busy_wait_guard_ms = 1;

/// How long shutdown waits for outstanding requests to drain after cancelling them.
constexpr auto shutdown_guard = std::chrono::seconds(5);

std::string address_string(const std::string& address, uint16_t port) {
  return address + ":" + std::to_string(port);
}

/// IPv4 only: the cluster speaks IPv4 and getaddrinfo keeps host names working.
troupe::expected<sockaddr_in> resolve(const std::string& address, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(address.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return troupe::fail(troupe::errc::invalid_argument,
                        "UCX: cannot resolve '" + address + "': " + ::gai_strerror(rc));
  }
  sockaddr_in resolved{};
  std::memcpy(&resolved, found->ai_addr, sizeof(resolved));
  ::freeaddrinfo(found);
  resolved.sin_port = htons(port);
  return resolved;
}

/// A connection to one peer. The error handler only marks it; the progress loop closes it.
struct endpoint {
  ucp_ep_h ep = nullptr;
  std::string address;  ///< "address:port" of the peer; "" for endpoints the listener accepted
  bool failed = false;
  ucs_status_t failure = UCS_OK;
};

void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<endpoint*>(arg);
  peer->failed = true;
  peer->failure = status;
}

/// A send or receive that the progress thread has not handed to UCX yet.
struct queued_op {
  bool is_send = false;
  std::string address;
  uint16_t port = 0;
  uint64_t tag = 0;
  std::vector<uint8_t> bytes;
  send_callback send_done;
  receive_callback receive_done;
};

}  // namespace

class ucx_transport::impl {
 public:
  impl() = default;
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl();

  troupe::expected<void> open(const ucx_options& options);
  void start() { thread_ = std::thread([this] { run(); }); }
  [[nodiscard]] uint16_t port() const { return port_; }
  void enqueue(queued_op op);

 private:
  /// A send or receive handed to UCX: its buffer lives until the request completed. The UCX
  /// callback only records the status (it may run inside the submitting call); the loop then
  /// frees the request and queues the user's callback.
  struct in_flight {
    std::string what;  ///< for error messages: "send to address:port" / "receive of tag N"
    std::vector<uint8_t> bytes;
    uint64_t refused_length = 0;  ///< a receive of a message longer than max_message_bytes: its length
    send_callback send_done;
    receive_callback receive_done;
    void* request = nullptr;  ///< UCX request, nullptr when UCX completed at once
    bool completed = false;
    ucs_status_t status = UCS_INPROGRESS;
  };

  troupe::expected<void> open_context(const std::string& tls);
  troupe::expected<void> resolve_allowed(const std::vector<std::string>& hosts);
  [[nodiscard]] bool allowed(ucp_conn_request_h request) const;
  troupe::expected<void> open_listener(const std::string& address, uint16_t port);

  void run();
  bool take_queued(std::vector<queued_op>& ops);
  void submit_send(queued_op op);
  bool match_waiting_receives();
  void receive_probed(queued_op op, ucp_tag_message_h message, size_t length);
  endpoint* connect(const std::string& address, uint16_t port, std::string& error);
  void accept(ucp_conn_request_h request);
  void reap_failed_endpoints();
  void close_endpoint(std::unique_ptr<endpoint> peer);
  void poll_closing();
  void wait_for_events();
  bool fire_completions();
  void shutdown();

  void submitted(in_flight& op, ucs_status_ptr_t request);
  void collect_completed();
  void finish(in_flight& op);
  static void on_send_done(void* request, ucs_status_t status, void* user_data);
  static void on_receive_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t*,
                              void* user_data);
  static void on_connection_request(ucp_conn_request_h request, void* arg);

  // Created by open() on the creating thread, then touched only by the progress thread.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int event_fd_ = -1;
  uint16_t port_ = 0;

  // Shared with callers of send/receive.
  std::mutex mutex_;
  std::vector<queued_op> queued_;
  bool stopping_ = false;
  bool stopped_ = false;

  // Progress thread only.
  std::map<std::string, std::unique_ptr<endpoint>> client_endpoints_;  // key "address:port"
  std::vector<std::unique_ptr<endpoint>> server_endpoints_;
  std::vector<std::pair<void*, std::unique_ptr<endpoint>>> closing_;  // close request, peer
  std::deque<queued_op> waiting_receives_;  // posted by the caller, no message matched yet
  std::vector<std::unique_ptr<in_flight>> in_flight_;  // handed to UCX, not yet collected
  std::vector<std::function<void()>> completions_;

  std::thread thread_;
  uint64_t max_message_bytes_ = 0;
  std::vector<in_addr_t> allowed_peers_;  // network byte order; empty: any
};

// ---- set-up and teardown ---------------------------------------------------------------------

troupe::expected<void> ucx_transport::impl::open(const ucx_options& options) {
  if (options.address.empty()) {
    return troupe::fail(troupe::errc::invalid_argument, "UCX: listen host must not be empty");
  }
  max_message_bytes_ = options.max_message_bytes;
  if (auto resolved = resolve_allowed(options.allowed_peers); !resolved) return resolved;
  if (auto opened = open_context(options.tls); !opened) return opened;
  return open_listener(options.address, options.port);
}

troupe::expected<void> ucx_transport::impl::resolve_allowed(const std::vector<std::string>& hosts) {
  for (const std::string& address : hosts) {
    auto peer_address = resolve(address, 0);
    if (!peer_address) return tl::unexpected(peer_address.error());
    allowed_peers_.push_back(peer_address->sin_addr.s_addr);
  }
  return {};
}

/// Whether a connection request comes from an allowed peer's IPv4 address (any, with no list).
bool ucx_transport::impl::allowed(ucp_conn_request_h request) const {
  if (allowed_peers_.empty()) return true;
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) != UCS_OK || attr.client_address.ss_family != AF_INET) return false;
  const auto* from = reinterpret_cast<const sockaddr_in*>(&attr.client_address);
  return std::find(allowed_peers_.begin(), allowed_peers_.end(), from->sin_addr.s_addr) != allowed_peers_.end();
}

troupe::expected<void> ucx_transport::impl::open_context(const std::string& tls) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    return troupe::fail(troupe::errc::internal,
                        std::string("UCX: cannot read config: ") + ucs_status_string(status));
  }
  if (!tls.empty()) status = ucp_config_modify(config, "TLS", tls.c_str());
  if (status != UCS_OK) {
    ucp_config_release(config);
    return troupe::fail(troupe::errc::invalid_argument,
                        "UCX: invalid TLS '" + tls + "': " + ucs_status_string(status));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    return troupe::fail(troupe::errc::internal, "UCX: cannot create a context (TLS '" + tls +
                                                    "'): " + ucs_status_string(status));
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status == UCS_OK) status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) {
    return troupe::fail(troupe::errc::internal,
                        std::string("UCX: cannot create a worker: ") + ucs_status_string(status));
  }
  return {};
}

troupe::expected<void> ucx_transport::impl::open_listener(const std::string& address,
                                                          uint16_t port) {
  auto listen_address = resolve(address, port);
  if (!listen_address) return tl::unexpected(listen_address.error());
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*listen_address);
  params.sockaddr.addrlen = sizeof(*listen_address);
  params.conn_handler.cb = &impl::on_connection_request;
  params.conn_handler.arg = this;
  ucs_status_t status = ucp_listener_create(worker_, &params, &listener_);
  if (status != UCS_OK) {
    listener_ = nullptr;
    return troupe::fail(troupe::errc::io_error, "UCX: cannot listen on " +
                                                    address_string(address, port) + ": " +
                                                    ucs_status_string(status));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  status = ucp_listener_query(listener_, &attr);
  if (status != UCS_OK || attr.sockaddr.ss_family != AF_INET) {
    return troupe::fail(troupe::errc::internal, "UCX: cannot query the listener on " +
                                                    address_string(address, port));
  }
  port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  TROUPE_ASSERT(port_ != 0);
  TROUPE_ASSERT(port == 0 || port_ == port);
  return {};
}

ucx_transport::impl::~impl() {
  if (thread_.joinable()) {
    TROUPE_ASSERT_MSG(std::this_thread::get_id() != thread_.get_id(),
                      "a ucx_transport must not be destroyed from its own callbacks");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ucp_worker_signal(worker_);
    thread_.join();
  }
  TROUPE_ASSERT(client_endpoints_.empty() && server_endpoints_.empty());
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

// ---- callers' side ---------------------------------------------------------------------------

void ucx_transport::impl::enqueue(queued_op op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TROUPE_ASSERT_MSG(!stopped_, "send/receive on a ucx_transport that is being destroyed");
    queued_.push_back(std::move(op));
  }
  ucp_worker_signal(worker_);
}

// ---- the progress thread ---------------------------------------------------------------------

void ucx_transport::impl::run() {
  std::vector<queued_op> ops;
  for (;;) {
    bool stop = take_queued(ops);
    bool worked = !ops.empty();
    for (auto& op : ops) {
      if (op.is_send) {
        submit_send(std::move(op));
      } else {
        waiting_receives_.push_back(std::move(op));
      }
    }
    ops.clear();
    while (ucp_worker_progress(worker_) != 0) {
    }
    reap_failed_endpoints();
    poll_closing();
    worked |= match_waiting_receives();
    collect_completed();
    worked |= fire_completions();
    if (stop) break;
    // Work just handed to UCX may need more progress before it raises an event.
    if (!worked) wait_for_events();
  }
  shutdown();
}

/// Moves the queued operations into `ops`; returns whether the transport is stopping.
bool ucx_transport::impl::take_queued(std::vector<queued_op>& ops) {
  std::lock_guard<std::mutex> lock(mutex_);
  TROUPE_ASSERT(ops.empty());
  ops.swap(queued_);
  return stopping_;
}

void ucx_transport::impl::wait_for_events() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queued_.empty() || stopping_) return;
  }
  // BUSY: events arrived since the last progress (or a signal is pending): go round again.
  ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) return;
  TROUPE_ASSERT_MSG(status == UCS_OK, ucs_status_string(status));
  pollfd fd{event_fd_, POLLIN, 0};
  bool idle = in_flight_.empty() && closing_.empty();
  ::poll(&fd, 1, idle ? idle_wait_guard_ms : busy_wait_guard_ms);
}

/// Returns whether any callback ran.
bool ucx_transport::impl::fire_completions() {
  // Callbacks may call send/receive (they only enqueue), so run them outside any UCX call.
  std::vector<std::function<void()>> ready;
  ready.swap(completions_);
  for (auto& fire : ready) fire();
  return !ready.empty();
}

void ucx_transport::impl::on_send_done(void*, ucs_status_t status, void* user_data) {
  auto* op = static_cast<in_flight*>(user_data);
  op->completed = true;
  op->status = status;
}

void ucx_transport::impl::on_receive_done(void*, ucs_status_t status, const ucp_tag_recv_info_t*,
                                          void* user_data) {
  auto* op = static_cast<in_flight*>(user_data);
  op->completed = true;
  op->status = status;
}

/// Records what a `*_nbx` call returned: NULL = done at once, an error, or a request.
void ucx_transport::impl::submitted(in_flight& op, ucs_status_ptr_t request) {
  if (request == nullptr) {
    op.completed = true;
    op.status = UCS_OK;
  } else if (UCS_PTR_IS_ERR(request)) {
    op.completed = true;
    op.status = UCS_PTR_STATUS(request);
  } else {
    op.request = request;
  }
}

void ucx_transport::impl::collect_completed() {
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    in_flight& op = **it;
    if (!op.completed) {
      ++it;
      continue;
    }
    if (op.request != nullptr) ucp_request_free(op.request);
    finish(op);
    it = in_flight_.erase(it);
  }
}

void ucx_transport::impl::finish(in_flight& op) {
  TROUPE_ASSERT(op.completed);
  TROUPE_ASSERT(op.status != UCS_INPROGRESS);
  troupe::errc code = op.status == UCS_ERR_CANCELED ? troupe::errc::cancelled
                                                    : troupe::errc::io_error;
  std::string message = "UCX: " + op.what + " failed: " + ucs_status_string(op.status);
  if (op.send_done) {
    troupe::expected<void> result;
    if (op.status != UCS_OK) result = troupe::fail(code, std::move(message));
    completions_.push_back([done = std::move(op.send_done), result = std::move(result)] {
      done(result);
    });
    return;
  }
  TROUPE_ASSERT(op.receive_done);
  troupe::expected<std::vector<uint8_t>> result = std::move(op.bytes);
  if (op.refused_length > 0)
    result = troupe::fail(troupe::errc::invalid_argument,
                          "UCX: " + op.what + " refused: the message of " + std::to_string(op.refused_length) +
                              " bytes exceeds the largest this node takes, " + std::to_string(max_message_bytes_) +
                              " ([limits] max_message_mib)");
  else if (op.status != UCS_OK)
    result = troupe::fail(code, std::move(message));
  completions_.push_back(
      [done = std::move(op.receive_done), result = std::move(result)]() mutable {
        done(std::move(result));
      });
}

void ucx_transport::impl::submit_send(queued_op op) {
  std::string error;
  endpoint* peer = connect(op.address, op.port, error);
  if (peer == nullptr) {
    completions_.push_back([done = std::move(op.send_done), error] {
      done(troupe::fail(troupe::errc::io_error, error));
    });
    return;
  }
  auto& flight = *in_flight_.emplace_back(std::make_unique<in_flight>());
  flight.what = "send to " + address_string(op.address, op.port);
  flight.bytes = std::move(op.bytes);
  flight.send_done = std::move(op.send_done);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &impl::on_send_done;
  param.user_data = &flight;
  submitted(flight, ucp_tag_send_nbx(peer->ep, flight.bytes.data(), flight.bytes.size(), op.tag,
                                     &param));
}

/// The cached endpoint to address:port, created on first use; nullptr with `error` set if UCX
/// refuses at once (an unreachable peer usually shows up later, through the error handler).
endpoint* ucx_transport::impl::connect(const std::string& address, uint16_t port,
                                       std::string& error) {
  std::string peer_address = address_string(address, port);
  auto found = client_endpoints_.find(peer_address);
  if (found != client_endpoints_.end()) return found->second.get();
  auto socket_address = resolve(address, port);
  if (!socket_address) {
    error = socket_address.error().message;
    return nullptr;
  }
  auto peer = std::make_unique<endpoint>();
  peer->address = peer_address;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*socket_address);
  params.sockaddr.addrlen = sizeof(*socket_address);
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &on_endpoint_error;
  params.err_handler.arg = peer.get();
  ucs_status_t status = ucp_ep_create(worker_, &params, &peer->ep);
  if (status != UCS_OK) {
    error = "UCX: cannot connect to " + peer_address + ": " + ucs_status_string(status);
    return nullptr;
  }
  endpoint* result = peer.get();
  client_endpoints_.emplace(peer_address, std::move(peer));
  return result;
}

void ucx_transport::impl::on_connection_request(ucp_conn_request_h request, void* arg) {
  static_cast<impl*>(arg)->accept(request);
}

void ucx_transport::impl::accept(ucp_conn_request_h request) {
  if (!allowed(request)) {
    std::fprintf(stderr, "troupe: UCX: rejected a connection on port %u from a host that is not a node of the "
                         "topology\n", static_cast<unsigned>(port_));
    (void)ucp_listener_reject(listener_, request);
    return;
  }
  auto peer = std::make_unique<endpoint>();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &on_endpoint_error;
  params.err_handler.arg = peer.get();
  ucs_status_t status = ucp_ep_create(worker_, &params, &peer->ep);
  if (status != UCS_OK) {
    // The client sees its endpoint fail; nothing to hand to anyone here.
    std::fprintf(stderr, "troupe: UCX: cannot accept a connection on port %u: %s\n",
                 static_cast<unsigned>(port_), ucs_status_string(status));
    return;
  }
  server_endpoints_.push_back(std::move(peer));
}

void ucx_transport::impl::reap_failed_endpoints() {
  for (auto it = client_endpoints_.begin(); it != client_endpoints_.end();) {
    if (it->second->failed) {
      close_endpoint(std::move(it->second));
      it = client_endpoints_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = server_endpoints_.begin(); it != server_endpoints_.end();) {
    if ((*it)->failed) {
      close_endpoint(std::move(*it));
      it = server_endpoints_.erase(it);
    } else {
      ++it;
    }
  }
}

/// Force close: a graceful one waits for the peer, which may be dead or gone.
void ucx_transport::impl::close_endpoint(std::unique_ptr<endpoint> peer) {
  TROUPE_ASSERT(peer != nullptr && peer->ep != nullptr);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(peer->ep, &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    closing_.emplace_back(request, std::move(peer));
  }
}

void ucx_transport::impl::poll_closing() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(it->first) != UCS_INPROGRESS) {
      ucp_request_free(it->first);
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
}

/// Hands every waiting receive whose message has arrived to UCX; returns whether any had.
bool ucx_transport::impl::match_waiting_receives() {
  bool matched = false;
  for (auto it = waiting_receives_.begin(); it != waiting_receives_.end();) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h message = ucp_tag_probe_nb(worker_, it->tag, full_tag_mask, 1, &info);
    if (message == nullptr) {
      ++it;
      continue;
    }
    queued_op op = std::move(*it);
    it = waiting_receives_.erase(it);
    receive_probed(std::move(op), message, info.length);
    matched = true;
  }
  return matched;
}

void ucx_transport::impl::receive_probed(queued_op op, ucp_tag_message_h message, size_t length) {
  auto& flight = *in_flight_.emplace_back(std::make_unique<in_flight>());
  flight.what = "receive of tag " + std::to_string(op.tag);
  if (length > max_message_bytes_)
    flight.refused_length = length;  // received into no buffer: UCX discards it as truncated
  else
    flight.bytes.resize(length);
  flight.receive_done = std::move(op.receive_done);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv = &impl::on_receive_done;
  param.user_data = &flight;
  submitted(flight, ucp_tag_msg_recv_nbx(worker_, flight.bytes.data(), flight.bytes.size(), message, &param));
}

/// Every callback still owed fires (cancelled), then all endpoints close; runs on the thread.
void ucx_transport::impl::shutdown() {
  std::vector<queued_op> late;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    late.swap(queued_);
  }
  for (auto& op : late) {
    if (!op.is_send) {
      waiting_receives_.push_back(std::move(op));
      continue;
    }
    completions_.push_back([done = std::move(op.send_done)] {
      done(troupe::fail(troupe::errc::cancelled, "UCX: transport shut down before the send"));
    });
  }
  for (auto& op : waiting_receives_) {
    completions_.push_back([done = std::move(op.receive_done)] {
      done(troupe::fail(troupe::errc::cancelled, "UCX: transport shut down before a message"));
    });
  }
  waiting_receives_.clear();
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  for (auto& op : in_flight_) {
    if (op->receive_done && !op->completed) ucp_request_cancel(worker_, op->request);
  }
  for (auto& [peer_address, peer] : client_endpoints_) close_endpoint(std::move(peer));
  client_endpoints_.clear();
  for (auto& peer : server_endpoints_) close_endpoint(std::move(peer));
  server_endpoints_.clear();
  auto deadline = std::chrono::steady_clock::now() + shutdown_guard;
  while ((!in_flight_.empty() || !closing_.empty()) &&
         std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(worker_);
    poll_closing();
    collect_completed();
  }
  fire_completions();
  TROUPE_ASSERT_MSG(in_flight_.empty() && closing_.empty(),
                    "UCX requests still outstanding 5 s after shutdown began");
}

// ---- ucx_transport ---------------------------------------------------------------------------

troupe::expected<std::unique_ptr<ucx_transport>> ucx_transport::create(
    const ucx_options& options) {
  auto state = std::make_unique<impl>();
  if (auto opened = state->open(options); !opened) return tl::unexpected(opened.error());
  state->start();
  return std::unique_ptr<ucx_transport>(new ucx_transport(std::move(state)));
}

ucx_transport::ucx_transport(std::unique_ptr<impl> state) : impl_(std::move(state)) {
  TROUPE_ASSERT(impl_ != nullptr);
}

ucx_transport::~ucx_transport() = default;

uint16_t ucx_transport::port() const { return impl_->port(); }

void ucx_transport::send(const std::string& address, uint16_t port, uint64_t tag,
                         std::vector<uint8_t> bytes, send_callback done) {
  TROUPE_ASSERT(done != nullptr);
  queued_op op;
  op.is_send = true;
  op.address = address;
  op.port = port;
  op.tag = tag;
  op.bytes = std::move(bytes);
  op.send_done = std::move(done);
  impl_->enqueue(std::move(op));
}

void ucx_transport::receive(uint64_t tag, receive_callback done) {
  TROUPE_ASSERT(done != nullptr);
  queued_op op;
  op.tag = tag;
  op.receive_done = std::move(done);
  impl_->enqueue(std::move(op));
}

}  // namespace troupe::transport
