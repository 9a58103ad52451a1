#include "gateway/http_server.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <map>
#include <cstdio>
#include <optional>
#include <thread>

#include <fcntl.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/blocking_queue.hpp"
#include "gateway/listen.hpp"

namespace troupe::gateway {

namespace {

constexpr size_t head_bytes_max = 64 << 10;
/// How long a stopping server waits for the responses in progress to be written.
constexpr std::chrono::seconds stop_wait{10};

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

/// What the loop needs of a request head besides the request itself.
struct head_facts {
  bool keep_alive = true;
  bool expect_continue = false;
  bool chunked = false;
};

/// Parses a request head (without its blank line). False: malformed.
bool parse_head(std::string_view head, http_request& req, head_facts& facts) {
  const size_t line_end = head.find("\r\n");
  const std::string_view line = head.substr(0, line_end);
  const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return false;
  req.method = std::string(line.substr(0, sp1));
  req.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  const std::string_view version = line.substr(sp2 + 1);
  if (req.method.empty() || req.target.empty() || version.rfind("HTTP/1.", 0) != 0) return false;
  req.path = req.target.substr(0, req.target.find('?'));
  facts.keep_alive = version == "HTTP/1.1";
  for (size_t at = line_end; at != std::string_view::npos && at < head.size();) {
    const size_t begin = at + 2, end = head.find("\r\n", begin);
    const std::string_view field = head.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    at = end;
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    std::string name = lower(field.substr(0, colon));
    const std::string value(trimmed(field.substr(colon + 1)));
    if (name == "content-length") {
      if (value.empty() || value.size() > 18 || !std::all_of(value.begin(), value.end(), [](char d) { return d >= '0' && d <= '9'; })) return false;
      req.content_length = std::stoll(value);
    }
    if (name == "connection" && lower(value) == "close") facts.keep_alive = false;
    if (name == "expect" && lower(value) == "100-continue") facts.expect_continue = true;
    if (name == "transfer-encoding" && lower(value) != "identity") facts.chunked = true;
    req.headers.emplace_back(std::move(name), value);
  }
  return true;
}

/// `bytes` as one chunk of a chunked body ("" for none).
std::string chunk_of(std::string_view bytes) {
  if (bytes.empty()) return "";
  char size[24];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  std::string chunk(size, static_cast<size_t>(n));
  chunk.append(bytes);
  chunk += "\r\n";
  return chunk;
}

}  // namespace

/// One client connection. The loop thread owns the socket and `in`; responses append to `out`
/// from any thread under `mutex`.
struct http_connection {
  http_connection(int socket, uint64_t number, http_server::impl* s) : fd(socket), id(number), server(s) {}

  const int fd;
  const uint64_t id;
  http_server::impl* const server;
  // The loop thread's alone.
  std::string in;
  bool continue_sent = false;
  bool watching_out = false;
  // Guarded by mutex.
  std::mutex mutex;
  std::string out;
  std::shared_ptr<http_response> current;  ///< the response being answered; null between requests
  bool current_done = false;               ///< its last byte is queued
  bool close_after = false;
  bool flush_posted = false;
  bool gone = false;  ///< closed: nothing more is queued or sent
};

struct http_server::impl {
  impl(http_server_options o, http_handler h) : options(std::move(o)), handler(std::move(h)) {}

  http_server_options options;
  http_handler handler;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  uint16_t port = 0;
  std::thread loop;
  std::vector<std::thread> workers;
  blocking_queue<std::function<void()>> tasks;  ///< an empty function stops a worker
  std::atomic<bool> stopping{false};
  std::map<uint64_t, std::shared_ptr<http_connection>> connections;  // the loop thread's
  uint64_t num_accepted = 0;
  std::mutex posts_mutex;
  std::vector<std::shared_ptr<http_connection>> posts;  ///< connections with output to flush; guarded
  bool taking_posts = false;  ///< the loop is flushing posts and looks again before it sleeps; guarded

  /// Asks the loop to flush `c` (called with c's mutex held: the server outlives every call).
  void post(std::shared_ptr<http_connection> c) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(posts_mutex);
      wake = posts.empty() && !taking_posts;
      posts.push_back(std::move(c));
    }
    if (wake) wake_loop();
  }
  void wake_loop() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void run();
  void accept_all();
  void on_readable(const std::shared_ptr<http_connection>& c);
  void parse_requests(const std::shared_ptr<http_connection>& c);
  void dispatch(const std::shared_ptr<http_connection>& c, http_request req, bool close_after);
  void refuse(const std::shared_ptr<http_connection>& c, int status, std::string_view why);
  void flush(const std::shared_ptr<http_connection>& c);
  void watch_out(http_connection& c, bool on);
  void close_connection(const std::shared_ptr<http_connection>& c);
  void take_posts();
  bool stopped_serving();
};

// ---- http_response ----

bool http_response::queue(std::string_view bytes, bool last) {
  http_connection& c = *connection_;
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.gone || c.current.get() != this || c.current_done) return false;
  c.out.append(bytes);
  c.current_done = last;
  if (!c.flush_posted) {
    c.flush_posted = true;
    c.server->post(connection_);
  }
  return true;
}

void http_response::reply(int status, std::string_view content_type, std::string_view body) {
  std::string bytes = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\nContent-Type: ";
  bytes.append(content_type);
  bytes += "\r\nContent-Length: " + std::to_string(body.size()) + (close_after_ ? "\r\nConnection: close" : "") + "\r\n\r\n";
  bytes.append(body);
  queue(bytes, true);
}

void http_response::begin_stream(std::string_view content_type) {
  std::string bytes = "HTTP/1.1 200 OK\r\nContent-Type: ";
  bytes.append(content_type);
  bytes += std::string("\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked") +
           (close_after_ ? "\r\nConnection: close" : "") + "\r\n\r\n";
  queue(bytes, false);
}

bool http_response::write(std::string_view bytes) { return bytes.empty() || queue(chunk_of(bytes), false); }

void http_response::end_stream(std::string_view last_bytes) {
  std::string bytes = chunk_of(last_bytes);
  bytes += "0\r\n\r\n";
  queue(bytes, true);
}

void http_response::on_abandoned(std::function<void()> f) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!finished_) {
    abandoned_ = std::move(f);
    return;
  }
  const bool run = is_abandoned_;
  lock.unlock();
  if (run) f();
}

void http_response::hold(std::shared_ptr<const void> token) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!finished_) held_.push_back(std::move(token));
}

void http_response::finish(bool abandoned) {
  std::function<void()> callback;
  std::vector<std::shared_ptr<const void>> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TROUPE_ASSERT(!finished_);
    finished_ = true;
    is_abandoned_ = abandoned;
    if (abandoned) callback = std::move(abandoned_);
    abandoned_ = nullptr;
    released.swap(held_);
  }
  if (callback) callback();
}

// ---- the loop ----

void http_server::impl::run() {
  std::optional<std::chrono::steady_clock::time_point> stop_deadline;
  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(epoll_fd, events, 64, stop_deadline ? 100 : -1);
    // Closed connections stay alive until the batch is done: a later event may name them.
    std::vector<std::shared_ptr<http_connection>> batch;
    for (int i = 0; i < n; i++) {
      const uint64_t key = events[i].data.u64;
      if (key == 0) {
        accept_all();
        continue;
      }
      if (key == 1) {
        take_posts();
        continue;
      }
      auto it = connections.find(key - 2);
      if (it == connections.end()) continue;
      batch.push_back(it->second);
      if (events[i].events & EPOLLOUT) flush(it->second);
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(it->second);
    }
    if (!stopping) continue;
    if (!stop_deadline) stop_deadline = std::chrono::steady_clock::now() + stop_wait;
    if (stopped_serving() || std::chrono::steady_clock::now() >= *stop_deadline) break;
  }
  while (!connections.empty()) close_connection(connections.begin()->second);
}

/// While stopping: no new connection, idle ones closed. True once none is left.
bool http_server::impl::stopped_serving() {
  if (listen_fd >= 0) {
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
    ::close(listen_fd);
    listen_fd = -1;
  }
  std::vector<std::shared_ptr<http_connection>> idle;
  for (const auto& [id, c] : connections) {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (!c->current) idle.push_back(c);
  }
  for (const auto& c : idle) close_connection(c);
  return connections.empty();
}

void http_server::impl::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: all taken; anything else: the next wake-up retries
    const int yes = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    auto c = std::make_shared<http_connection>(fd, ++num_accepted, this);
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.u64 = c->id + 2;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &e) != 0) {
      ::close(fd);
      continue;
    }
    connections.emplace(c->id, std::move(c));
  }
}

void http_server::impl::take_posts() {
  uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
  // Chunks queued while the loop flushes need no wake-up of their own: it looks again before it
  // sleeps, so a burst of chunks (an engine step's, one per stream) costs one wake-up.
  for (;;) {
    std::vector<std::shared_ptr<http_connection>> taken;
    {
      std::lock_guard<std::mutex> lock(posts_mutex);
      taken.swap(posts);
      taking_posts = !taken.empty();
    }
    if (taken.empty()) return;
    for (const auto& c : taken) flush(c);
  }
}

void http_server::impl::on_readable(const std::shared_ptr<http_connection>& c) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      c->in.append(buf, static_cast<size_t>(n));
      if (c->in.size() > head_bytes_max + options.body_bytes_max + sizeof buf) return close_connection(c);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return close_connection(c);  // the client closed its end, or the socket failed
  }
  parse_requests(c);
}

/// Starts the next request in `c->in`, if it is all there and none is being answered.
void http_server::impl::parse_requests(const std::shared_ptr<http_connection>& c) {
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->current || c->gone) return;
  }
  const size_t head_end = c->in.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (c->in.size() > head_bytes_max) refuse(c, 431, "the request head is over 64 KiB");
    return;
  }
  http_request req;
  head_facts facts;
  if (head_end > head_bytes_max) return refuse(c, 431, "the request head is over 64 KiB");
  if (!parse_head(std::string_view(c->in).substr(0, head_end), req, facts)) return refuse(c, 400, "a malformed request head");
  if (facts.chunked) return refuse(c, 411, "chunked request bodies are not supported: send Content-Length");
  if (req.content_length > static_cast<int64_t>(options.body_bytes_max)) {
    req.body_too_large = true;  // the body is not read: the connection closes after the answer
    c->in.clear();
    return dispatch(c, std::move(req), true);
  }
  const size_t total = head_end + 4 + static_cast<size_t>(req.content_length);
  if (c->in.size() < total) {
    if (!facts.expect_continue || c->continue_sent) return;
    c->continue_sent = true;
    std::lock_guard<std::mutex> lock(c->mutex);
    c->out += "HTTP/1.1 100 Continue\r\n\r\n";
    if (!c->flush_posted) c->flush_posted = true, post(c);
    return;
  }
  req.body = c->in.substr(head_end + 4, static_cast<size_t>(req.content_length));
  c->in.erase(0, total);
  c->continue_sent = false;
  dispatch(c, std::move(req), !facts.keep_alive);
}

void http_server::impl::dispatch(const std::shared_ptr<http_connection>& c, http_request req, bool close_after) {
  auto response = std::make_shared<http_response>(c, close_after || stopping);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->current = response;
    c->current_done = false;
    c->close_after = close_after || stopping;
  }
  tasks.push([this, req = std::move(req), response] { handler(req, response); });
}

/// Answers a request the server cannot read with `status` and closes the connection.
void http_server::impl::refuse(const std::shared_ptr<http_connection>& c, int status, std::string_view why) {
  c->in.clear();
  auto response = std::make_shared<http_response>(c, true);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->current = response;
    c->current_done = false;
    c->close_after = true;
  }
  response->reply(status, "text/plain; charset=utf-8", why);
}

void http_server::impl::flush(const std::shared_ptr<http_connection>& c) {
  std::unique_lock<std::mutex> lock(c->mutex);
  c->flush_posted = false;
  if (c->gone) return;
  size_t sent = 0;
  while (sent < c->out.size()) {
    const ssize_t n = ::send(c->fd, c->out.data() + sent, c->out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    lock.unlock();
    return close_connection(c);  // the client is gone
  }
  c->out.erase(0, sent);
  watch_out(*c, !c->out.empty());
  if (!c->out.empty() || !c->current || !c->current_done) return;
  const std::shared_ptr<http_response> done = std::move(c->current);
  c->current.reset();
  const bool close = c->close_after || stopping;
  lock.unlock();
  done->finish(false);
  if (close) return close_connection(c);
  parse_requests(c);  // a pipelined request may be waiting
}

void http_server::impl::watch_out(http_connection& c, bool on) {
  if (c.watching_out == on) return;
  c.watching_out = on;
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0u);
  e.data.u64 = c.id + 2;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &e);
}

void http_server::impl::close_connection(const std::shared_ptr<http_connection>& c) {
  std::shared_ptr<http_response> unfinished;
  bool abandoned = false;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->gone) return;
    c->gone = true;
    abandoned = c->current && !c->current_done;
    unfinished = std::move(c->current);
    c->current.reset();
    c->out.clear();
  }
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  connections.erase(c->id);
  if (unfinished) unfinished->finish(abandoned);
}

// ---- http_server ----

expected<std::unique_ptr<http_server>> http_server::start(http_server_options options, http_handler handler) {
  if (options.num_workers < 1) return fail(errc::invalid_argument, "the HTTP server needs at least one worker thread");
  auto state = std::make_unique<impl>(std::move(options), std::move(handler));
  impl& s = *state;
  s.listen_fd = listen_on(s.options.host, s.options.port);
  if (s.listen_fd < 0)
    return fail(errc::io_error, "cannot listen for HTTP on " + s.options.host + ":" + std::to_string(s.options.port));
  s.port = bound_port(s.listen_fd);
  s.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ::fcntl(s.listen_fd, F_SETFL, ::fcntl(s.listen_fd, F_GETFL) | O_NONBLOCK);
  epoll_event listen_event{};
  listen_event.events = EPOLLIN;
  listen_event.data.u64 = 0;
  epoll_event wake_event{};
  wake_event.events = EPOLLIN;
  wake_event.data.u64 = 1;
  if (s.epoll_fd < 0 || s.wake_fd < 0 || ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.listen_fd, &listen_event) != 0 ||
      ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &wake_event) != 0)
    return fail(errc::io_error, "cannot set up the HTTP server's event loop (errno " + std::to_string(errno) + ")");
  for (int32_t i = 0; i < s.options.num_workers; i++)
    s.workers.emplace_back([&s] {
      while (std::function<void()> task = s.tasks.pop()) task();
    });
  s.loop = std::thread([&s] { s.run(); });
  return std::unique_ptr<http_server>(new http_server(std::move(state)));
}

http_server::http_server(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

http_server::~http_server() {
  impl& s = *impl_;
  s.stopping = true;
  s.wake_loop();
  s.loop.join();
  for (size_t i = 0; i < s.workers.size(); i++) s.tasks.push(nullptr);
  for (std::thread& t : s.workers) t.join();
  ::close(s.wake_fd);
  ::close(s.epoll_fd);
}

uint16_t http_server::port() const { return impl_->port; }

}  // namespace troupe::gateway
