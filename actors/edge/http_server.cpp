#include "actors/edge/http_server.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <spdlog/spdlog.h>

#include "actors/edge/blocking_queue.hpp"
#include "actors/edge/listen.hpp"

namespace troupe::gateway {

namespace asio = boost::asio;
namespace beast_http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr uint32_t head_bytes_max = 64 << 10;
/// What one read asks of the socket.
constexpr size_t read_bytes = 16 << 10;

std::string text(boost::beast::string_view view) { return std::string(view.data(), view.size()); }

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

/// Where a connection is in reading its next request; each but `answering` has a deadline
/// (`handshake`: a TLS connection's, within header_timeout of its accept).
enum class reading { handshake, idle, head, body, answering };

/// A connection's bytes: a plain socket, or TLS over one.
class connection_stream {
 public:
  /// TLS over `s` with `tls`; plain when null.
  connection_stream(tcp::socket s, asio::ssl::context* tls) {
    if (tls) tls_.emplace(std::move(s), *tls);
    else plain_.emplace(std::move(s));
  }
  connection_stream(const connection_stream&) = delete;
  connection_stream& operator=(const connection_stream&) = delete;

  tcp::socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  template <class Handler>
  void handshake(Handler h) {
    tls_->async_handshake(asio::ssl::stream_base::server, std::move(h));
  }
  template <class Buffers, class Handler>
  void read_some(const Buffers& buffers, Handler h) {
    if (tls_) return tls_->async_read_some(buffers, std::move(h));
    plain_->async_read_some(buffers, std::move(h));
  }
  template <class Handler>
  void write(asio::const_buffer bytes, Handler h) {
    if (tls_) return asio::async_write(*tls_, bytes, std::move(h));
    asio::async_write(*plain_, bytes, std::move(h));
  }

 private:
  std::optional<tcp::socket> plain_;
  std::optional<asio::ssl::stream<tcp::socket>> tls_;
};

}  // namespace

/// One client connection. The loop thread owns the socket, the input and the parser; responses
/// append to `out` from any thread under `mutex`.
struct http_connection {
  http_connection(tcp::socket s, asio::ssl::context* tls, uint64_t number, http_server::impl* owner,
                  std::string address, std::shared_ptr<const void> counted)
      : id(number), server(owner), peer(std::move(address)), open(std::move(counted)) {
    stream.emplace(std::move(s), tls);
    read_deadline.emplace(stream->socket().get_executor());
    write_deadline.emplace(stream->socket().get_executor());
  }

  // The loop thread's alone. The stream is dropped when the connection closes, so none outlives
  // the server's io_context.
  std::optional<connection_stream> stream;
  const uint64_t id;
  http_server::impl* const server;
  const std::string peer;            ///< the client's address
  std::shared_ptr<const void> open;  ///< counts it among the open connections, until it closes
  std::optional<asio::steady_timer> read_deadline;   ///< dropped with the socket
  std::optional<asio::steady_timer> write_deadline;  ///< dropped with the socket
  reading phase = reading::answering;  ///< what read_deadline is armed for
  uint64_t num_read_deadlines = 0;     ///< tells a stale deadline from the one armed
  uint64_t num_writes = 0;             ///< tells a stale write deadline from the one armed
  boost::beast::flat_buffer in;
  std::optional<beast_http::request_parser<beast_http::string_body>> parser;
  bool head_checked = false;  ///< the parser's head was looked at (limits, Expect)
  bool discarding = false;    ///< a body over the limit follows: input is dropped
  std::string sending;        ///< what the write in flight sends
  // Guarded by mutex.
  std::mutex mutex;
  std::string out;
  std::shared_ptr<http_response> current;  ///< the response being answered; null between requests
  bool current_done = false;               ///< its last byte is queued
  bool close_after = false;
  bool write_posted = false;  ///< a wake-up to write `out` is posted to the loop
  bool writing = false;       ///< a write is in flight: its end takes up what `out` gained
  bool gone = false;          ///< closed: nothing more is queued or sent
  bool overflowed = false;    ///< `out` passed output_bytes_max: closing, nothing more is queued
};

struct http_server::impl {
  impl(http_server_options o, http_handler h) : options(std::move(o)), handler(std::move(h)) {}

  http_server_options options;
  http_handler handler;
  std::optional<asio::ssl::context> tls;  ///< options.tls's, for asio; none: plaintext
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer stop_timer{io};
  asio::steady_timer accept_timer{io};
  bool starved = false;  ///< accepting failed (out of descriptors): said once, retried after a pause
  address_counts open_connections{options.limits.max_connections, options.limits.max_connections_per_address};
  uint16_t port = 0;
  std::thread loop;
  std::vector<std::thread> workers;
  blocking_queue<std::function<void()>> tasks;  ///< an empty function stops a worker
  std::atomic<bool> stopping{false};
  std::map<uint64_t, std::shared_ptr<http_connection>> connections;  // the loop thread's
  uint64_t num_accepted = 0;

  /// Asks the loop to write what `c` queued, unless a write or a wake-up is already on its way
  /// (called with c's mutex held: the server outlives every call while `c` is not gone).
  void wake(const std::shared_ptr<http_connection>& c) {
    if (c->writing || c->write_posted) return;
    c->write_posted = true;
    asio::post(io, [this, c] { write_out(c); });
  }

  /// `c` has queued more than output_bytes_max for a client that does not read: it closes
  /// (called with c's mutex held, as `wake`).
  void overflow(const std::shared_ptr<http_connection>& c) {
    if (std::exchange(c->overflowed, true)) return;
    asio::post(io, [this, c] {
      spdlog::warn("http: closing a connection from {}: over {} bytes queued unread (--gateway-output-mib)", c->peer,
                   options.limits.output_bytes_max);
      close_connection(c);
    });
  }

  void accept();
  void accept_later(error_code ec);
  void admit(tcp::socket socket);
  void handshake(const std::shared_ptr<http_connection>& c);
  void expect(const std::shared_ptr<http_connection>& c, reading next);
  void on_read_deadline(const std::shared_ptr<http_connection>& c, reading missed);
  void read(const std::shared_ptr<http_connection>& c);
  void parse_requests(const std::shared_ptr<http_connection>& c);
  void dispatch(const std::shared_ptr<http_connection>& c, http_request req, bool close_after);
  void refuse(const std::shared_ptr<http_connection>& c, int status, std::string_view why);
  void write_out(const std::shared_ptr<http_connection>& c);
  void written(const std::shared_ptr<http_connection>& c, error_code ec);
  void close_connection(const std::shared_ptr<http_connection>& c);
  void stop();
};

// ---- http_response ----

bool http_response::queue(std::string_view bytes, bool last) {
  http_connection& c = *connection_;
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.gone || c.overflowed || c.current.get() != this || c.current_done) return false;
  if (!c.out.empty() && static_cast<int64_t>(c.out.size() + bytes.size()) > c.server->options.limits.output_bytes_max) {
    c.server->overflow(connection_);
    return false;
  }
  c.out.append(bytes);
  c.current_done = last;
  c.server->wake(connection_);
  return true;
}

namespace {

std::string status_line(int status) {
  const auto reason = beast_http::obsolete_reason(beast_http::int_to_status(static_cast<unsigned>(status)));
  return "HTTP/1.1 " + std::to_string(status) + " " + text(reason) + "\r\n";
}

/// A 429 or 503 says when to try again (RFC 9110 10.2.3): in a second, as OpenAI's clients and
/// proxies read it. Other statuses: nothing.
std::string retry_after(int status) { return status == 429 || status == 503 ? "\r\nRetry-After: 1" : ""; }

}  // namespace

void http_response::add_header(std::string_view name, std::string_view value) {
  std::lock_guard<std::mutex> lock(mutex_);
  extra_head_.append("\r\n").append(name).append(": ").append(value);
}

std::string http_response::head_end() {
  std::lock_guard<std::mutex> lock(mutex_);
  return extra_head_ + (close_after_ ? "\r\nConnection: close" : "") + "\r\n\r\n";
}

void http_response::reply(int status, std::string_view content_type, std::string_view body) {
  status_ = status;
  std::string bytes = status_line(status) + "Content-Type: ";
  bytes.append(content_type);
  bytes += "\r\nContent-Length: " + std::to_string(body.size()) + retry_after(status) + head_end();
  bytes.append(body);
  queue(bytes, true);
}

void http_response::begin_stream(std::string_view content_type) {
  status_ = 200;
  std::string bytes = status_line(200) + "Content-Type: ";
  bytes.append(content_type);
  bytes += "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked" + head_end();
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
  released.clear();  // let go before the callback: whoever it wakes sees the tokens gone
  if (callback) callback();
}

// ---- the loop ----

void http_server::impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;  // stopping
    if (ec) return accept_later(ec);
    starved = false;
    admit(std::move(socket));
    accept();
  });
}

/// A failed accept (out of descriptors, most likely) is tried again after `accept_backoff`: the
/// client stays in the backlog, and the loop does not spin on it.
void http_server::impl::accept_later(error_code ec) {
  if (!std::exchange(starved, true))
    spdlog::warn("http: cannot accept a connection ({}): retrying every {} ms", ec.message(), accept_backoff.count());
  accept_timer.expires_after(accept_backoff);
  accept_timer.async_wait([this](error_code e) {
    if (!e && acceptor.is_open()) accept();
  });
}

/// A new connection, if its address and the server have room; else a 503 (if the socket takes
/// it at once) and it is closed.
void http_server::impl::admit(tcp::socket socket) {
  error_code ec;
  const tcp::endpoint remote = socket.remote_endpoint(ec);
  const std::string peer = ec ? std::string() : remote.address().to_string();
  std::shared_ptr<const void> counted = open_connections.enter(peer);
  if (!counted && tls) {  // a TLS client could not read a plaintext answer
    socket.close(ec);
    return;
  }
  if (!counted) {
    const std::string why = "too many connections: at most " + std::to_string(options.limits.max_connections) +
                            " in all and " + std::to_string(options.limits.max_connections_per_address) + " per address";
    send_now(socket.native_handle(), "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                     "Content-Length: " + std::to_string(why.size()) + retry_after(503) +
                                     "\r\nConnection: close\r\n\r\n" + why);
    socket.close(ec);
    return;
  }
  socket.set_option(tcp::no_delay(true), ec);
  auto c = std::make_shared<http_connection>(std::move(socket), tls ? &*tls : nullptr, ++num_accepted, this, peer,
                                             std::move(counted));
  connections.emplace(c->id, c);
  if (tls) return handshake(c);
  expect(c, reading::idle);
  read(c);
}

/// A TLS connection's handshake, within header_timeout; then its requests.
void http_server::impl::handshake(const std::shared_ptr<http_connection>& c) {
  expect(c, reading::handshake);
  c->stream->handshake([this, c](error_code ec) {
    if (!c->stream) return;  // closed meanwhile
    if (ec) {
      spdlog::debug("http: a TLS handshake with {} failed: {}", c->peer, ec.message());
      return close_connection(c);
    }
    expect(c, reading::idle);
    read(c);
  });
}

/// Arms `c`'s read deadline for `next`: idle_timeout for the next request's first byte,
/// header_timeout from it for the head, body_timeout from the head for the body; none while a
/// request is answered.
void http_server::impl::expect(const std::shared_ptr<http_connection>& c, reading next) {
  if (c->phase == next || !c->stream) return;
  c->phase = next;
  const uint64_t number = ++c->num_read_deadlines;
  if (next == reading::answering) return (void)c->read_deadline->cancel();
  const edge_limits& l = options.limits;
  c->read_deadline->expires_after(next == reading::idle   ? l.idle_timeout
                                  : next == reading::body ? l.body_timeout
                                                          : l.header_timeout);
  c->read_deadline->async_wait([this, c, next, number](error_code ec) {
    if (!ec && c->stream && c->num_read_deadlines == number) on_read_deadline(c, next);
  });
}

/// The client took too long: an idle connection closes, a late head or body is answered 408.
void http_server::impl::on_read_deadline(const std::shared_ptr<http_connection>& c, reading missed) {
  const edge_limits& l = options.limits;
  if (missed == reading::idle) return close_connection(c);
  if (missed == reading::handshake) {
    spdlog::info("http: a TLS handshake with {} took over {} ms: closing", c->peer, l.header_timeout.count());
    return close_connection(c);
  }
  const bool head = missed == reading::head;
  spdlog::info("http: a request {} from {} took over {} ms: 408", head ? "head" : "body", c->peer,
               (head ? l.header_timeout : l.body_timeout).count());
  refuse(c, 408, std::string("the request ") + (head ? "head" : "body") + " took over " +
                     std::to_string((head ? l.header_timeout : l.body_timeout).count()) + " ms (--gateway-" +
                     (head ? "header" : "body") + "-timeout-ms)");
}

/// Reads whatever the client sends, always: requests (pipelined ones wait in `in` until their
/// turn), and the end of the connection, which abandons a response in progress.
void http_server::impl::read(const std::shared_ptr<http_connection>& c) {
  c->stream->read_some(c->in.prepare(read_bytes), [this, c](error_code ec, size_t n) {
    if (!c->stream) return;  // closed meanwhile
    if (ec) return close_connection(c);  // the client closed its end, or the socket failed
    if (c->phase == reading::idle) expect(c, reading::head);
    c->in.commit(n);
    if (c->discarding) c->in.consume(c->in.size());
    if (c->in.size() > head_bytes_max + options.body_bytes_max + read_bytes) return close_connection(c);
    parse_requests(c);
    if (c->stream) read(c);
  });
}

/// Starts the next request in `c->in`, if it is all there and none is being answered. Beast's
/// parser reads the head (at most 64 KiB), then the body (Content-Length or chunked, at most
/// body_bytes_max).
void http_server::impl::parse_requests(const std::shared_ptr<http_connection>& c) {
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->current || c->gone || c->discarding) return;
  }
  if (!c->parser) {
    c->parser.emplace();
    c->parser->header_limit(head_bytes_max);
    // The head is checked against the limit first (a Content-Length over it is the handler's
    // to answer); the limit then holds for the body as it arrives (chunked ones too).
    c->parser->body_limit(std::numeric_limits<uint64_t>::max());
    c->head_checked = false;
  }
  auto& parser = *c->parser;
  while (!parser.is_done()) {
    error_code ec;
    const size_t used = c->in.size() == 0 ? 0 : parser.put(c->in.data(), ec);
    c->in.consume(used);
    if (ec == beast_http::error::need_more) return;
    if (ec == beast_http::error::header_limit) return refuse(c, 431, "the request head is over 64 KiB");
    if (ec == beast_http::error::body_limit) return refuse(c, 413, "the request body is over the limit");
    if (ec) return refuse(c, 400, parser.is_header_done() ? "a malformed request body" : "a malformed request head");
    if (parser.is_header_done() && !c->head_checked) {
      c->head_checked = true;
      const auto& head = parser.get();
      const boost::optional<uint64_t> length = parser.content_length();
      if (length && *length > options.body_bytes_max) {
        http_request req;
        req.method = text(head.method_string());
        req.target = text(head.target());
        req.path = req.target.substr(0, req.target.find('?'));
        req.content_length = static_cast<int64_t>(*length);
        req.peer = c->peer;
        req.secure = tls.has_value();
        req.body_too_large = true;  // the body is not read: the connection closes after the answer
        c->parser.reset();
        c->in.consume(c->in.size());
        c->discarding = true;
        return dispatch(c, std::move(req), true);
      }
      parser.body_limit(options.body_bytes_max);
      if (!parser.is_done()) expect(c, reading::body);
      const auto continues = head[beast_http::field::expect];
      if (!parser.is_done() && lower_ascii(text(continues)) == "100-continue") {
        std::lock_guard<std::mutex> lock(c->mutex);
        c->out += "HTTP/1.1 100 Continue\r\n\r\n";
        wake(c);
      }
      continue;
    }
    if (used == 0) return;  // nothing buffered: wait for the client
  }
  beast_http::request<beast_http::string_body> message = c->parser->release();
  c->parser.reset();
  http_request req;
  req.method = text(message.method_string());
  req.target = text(message.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& field : message)
    req.headers.emplace_back(lower_ascii(text(field.name_string())), text(field.value()));
  req.body = std::move(message.body());
  req.content_length = static_cast<int64_t>(req.body.size());
  req.peer = c->peer;
  req.secure = tls.has_value();
  dispatch(c, std::move(req), !message.keep_alive());
}

void http_server::impl::dispatch(const std::shared_ptr<http_connection>& c, http_request req, bool close_after) {
  expect(c, reading::answering);
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
  c->parser.reset();
  c->in.consume(c->in.size());
  c->discarding = true;
  expect(c, reading::answering);
  auto response = std::make_shared<http_response>(c, true);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->current = response;
    c->current_done = false;
    c->close_after = true;
  }
  response->reply(status, "text/plain; charset=utf-8", why);
}

/// Sends everything `c` queued in one write.
void http_server::impl::write_out(const std::shared_ptr<http_connection>& c) {
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->write_posted = false;
    if (c->gone || c->writing || c->out.empty()) return;
    c->writing = true;
    c->sending.clear();
    c->sending.swap(c->out);
  }
  c->stream->write(asio::buffer(c->sending), [this, c](error_code ec, size_t) { written(c, ec); });
  // A client that does not read stalls the write: past write_timeout the connection closes.
  const uint64_t number = ++c->num_writes;
  c->write_deadline->expires_after(options.limits.write_timeout);
  c->write_deadline->async_wait([this, c, number](error_code ec) {
    if (ec || !c->stream || c->num_writes != number) return;
    spdlog::info("http: closing a connection from {}: a write took over {} ms (--gateway-write-timeout-ms)", c->peer,
                 options.limits.write_timeout.count());
    close_connection(c);
  });
}

/// A write ended: more was queued meanwhile (write it), or the response is over (finish it, then
/// close or read the next request).
void http_server::impl::written(const std::shared_ptr<http_connection>& c, error_code ec) {
  if (!c->stream) return;  // closed meanwhile
  if (ec) return close_connection(c);  // the client is gone
  ++c->num_writes;  // its deadline is stale now
  c->write_deadline->cancel();
  std::unique_lock<std::mutex> lock(c->mutex);
  c->writing = false;
  if (!c->out.empty()) {
    lock.unlock();
    return write_out(c);
  }
  if (!c->current || !c->current_done) return;
  const std::shared_ptr<http_response> done = std::move(c->current);
  c->current.reset();
  const bool close = c->close_after || stopping;
  lock.unlock();
  done->finish(false);
  if (close) return close_connection(c);
  expect(c, c->in.size() > 0 ? reading::head : reading::idle);
  parse_requests(c);  // a pipelined request may be waiting
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
  error_code ignored;
  c->stream->socket().close(ignored);  // the read (and any write) in flight ends with operation_aborted
  c->stream.reset();
  c->read_deadline.reset();  // their waits end with operation_aborted
  c->write_deadline.reset();
  c->open.reset();
  c->parser.reset();
  connections.erase(c->id);
  if (unfinished) unfinished->finish(abandoned);
  if (stopping && connections.empty()) stop_timer.cancel();
}

/// No new connection, idle ones closed; the others once their responses are written, or when
/// `stop_timeout` is over. The loop ends when none is left.
void http_server::impl::stop() {
  error_code ignored;
  acceptor.close(ignored);
  accept_timer.cancel();
  std::vector<std::shared_ptr<http_connection>> idle;
  for (const auto& [id, c] : connections) {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (!c->current) idle.push_back(c);
  }
  for (const auto& c : idle) close_connection(c);
  if (connections.empty()) return;
  stop_timer.expires_after(options.stop_timeout);
  stop_timer.async_wait([this](error_code ec) {
    if (ec) return;  // cancelled: every connection closed in time
    while (!connections.empty()) close_connection(connections.begin()->second);
  });
}

// ---- http_server ----

expected<std::unique_ptr<http_server>> http_server::start(http_server_options options, http_handler handler) {
  if (options.num_workers < 1) return fail(errc::invalid_argument, "the HTTP server needs at least one worker thread");
  if (auto ok = check_edge_limits(options.limits); !ok) return tl::unexpected(ok.error());
  auto state = std::make_unique<impl>(std::move(options), std::move(handler));
  impl& s = *state;
  if (s.options.tls) {
    SSL_CTX_up_ref(s.options.tls.get());  // asio's context frees its reference
    s.tls.emplace(s.options.tls.get());
  }
  const int fd = listen_on(s.options.address, s.options.port);
  if (fd < 0) return fail(errc::io_error, "cannot listen for HTTP on " + s.options.address + ":" + std::to_string(s.options.port));
  s.port = bound_port(fd);
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  error_code ec;
  s.acceptor.assign(address.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    return fail(errc::io_error, "cannot set up the HTTP server's event loop: " + ec.message());
  }
  s.accept();
  for (int32_t i = 0; i < s.options.num_workers; i++)
    s.workers.emplace_back([&s] {
      while (std::function<void()> task = s.tasks.pop()) task();
    });
  s.loop = std::thread([&s] {
    s.io.run();
    // Whatever is left when the loop ends (nothing, unless stopping was cut short) is closed.
    while (!s.connections.empty()) s.close_connection(s.connections.begin()->second);
  });
  return std::unique_ptr<http_server>(new http_server(std::move(state)));
}

http_server::http_server(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

http_server::~http_server() {
  impl& s = *impl_;
  s.stopping = true;
  asio::post(s.io, [&s] { s.stop(); });
  s.loop.join();
  for (size_t i = 0; i < s.workers.size(); i++) s.tasks.push(nullptr);
  for (std::thread& t : s.workers) t.join();
}

uint16_t http_server::port() const { return impl_->port; }

}  // namespace troupe::gateway
