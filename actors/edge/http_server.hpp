#pragma once

/// A small HTTP/1.1 server on Boost.Beast and Boost.Asio, for the gateway (docs/http.md): one
/// io_context thread accepts, reads and writes every socket, and Beast's request parser reads
/// every request; handlers run on a few worker threads and answer through an `http_response` from
/// any thread (an actor's callback included) without waiting on a socket. A streamed response is
/// a chunked body: each `write` appends to the connection's output queue and posts one wake-up to
/// the loop unless a write is in flight (whose end takes up what was queued meanwhile), so a
/// burst of chunks costs one write per connection, not one thread hand-off per chunk (what one
/// blocking server thread per stream costs; docs/BENCHMARKS-history.md).
///
/// Supported: request bodies with Content-Length or chunked (`Expect: 100-continue` answered),
/// keep-alive, pipelined requests answered in order. Refused: request heads over 64 KiB (431),
/// malformed requests (400), chunked bodies over the body limit (413); the connection is then
/// closed. A Content-Length over the limit is not read: the handler answers it
/// (`body_too_large`) and the connection closes. A client that closes its connection while its
/// response runs "abandons" it (the handler's callback is told once).
///
/// Bounds (edge_limits, docs/security.md "Limits at the edges"): connections in all and per
/// client address (one more is answered 503 if its socket takes it at once, and closed); a
/// connection waiting for its next request closes after idle_timeout, a request head must
/// arrive within header_timeout of its first byte and its body within body_timeout of the head
/// (else 408 and close); a write that takes over write_timeout closes the connection, and so does
/// output queued past output_bytes_max (a client that does not read): its response is abandoned.
/// Out of descriptors, accepting waits 100 ms between tries.
///
/// With a TLS context (`http_server_options::tls`, actors/edge/access.hpp) every connection is
/// HTTPS: its handshake must end within header_timeout of the accept, else it closes.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/edge/access.hpp"
#include "actors/edge/edge_limits.hpp"
#include "runtime/common/error.hpp"

namespace troupe::gateway {

struct http_request {
  std::string method;
  std::string target;  ///< as sent, query included
  std::string path;    ///< the target up to '?'
  std::vector<std::pair<std::string, std::string>> headers;  ///< names lower-cased, in order
  std::string body;
  int64_t content_length = 0;
  bool body_too_large = false;  ///< Content-Length over the limit: the body was not read
  std::string peer;             ///< the client's address (what edge_limits count by)
  bool secure = false;          ///< it came over TLS
};

struct http_connection;
class http_server;

/// The answer to one request: exactly one `reply`, or `begin_stream`, `write`s and `end_stream`.
/// Thread-safe. Calls after the client went away (or after the end) do nothing.
class http_response {
 public:
  http_response(std::shared_ptr<http_connection> c, bool close_after) : connection_(std::move(c)), close_after_(close_after) {}

  /// One more header line of the response (`name: value`, no CR or LF in either); before
  /// `reply` or `begin_stream`.
  void add_header(std::string_view name, std::string_view value);
  void reply(int status, std::string_view content_type, std::string_view body);
  void begin_stream(std::string_view content_type);
  /// One chunk of the stream; false once the client is gone.
  bool write(std::string_view bytes);
  /// Ends the stream after `last_bytes` (one chunk, unless empty), queued at once.
  void end_stream(std::string_view last_bytes = {});
  /// `f` runs once, on the loop thread, if the client goes away before the response's last byte
  /// (at once if it already has).
  void on_abandoned(std::function<void()> f);
  /// `token` is kept until the last byte is written or the client is gone.
  void hold(std::shared_ptr<const void> token);
  /// The status of the response begun (`reply`, or 200 for `begin_stream`); 0 before (the access log).
  [[nodiscard]] int status() const { return status_.load(); }

 private:
  friend class http_server;
  /// Appends `bytes` to the output; `last`: the response ends with them. False if gone.
  bool queue(std::string_view bytes, bool last);
  /// The response is over: written, or its client gone (`abandoned`: the callback runs); what it
  /// held is let go. Called once, by the loop thread.
  void finish(bool abandoned);
  /// The added header lines, Connection: close where it closes, and the blank line.
  [[nodiscard]] std::string head_end();

  std::shared_ptr<http_connection> connection_;
  const bool close_after_;
  std::atomic<int> status_{0};
  std::mutex mutex_;
  std::function<void()> abandoned_;  // guarded by mutex_
  bool finished_ = false;            // guarded by mutex_; then nothing is held or called back
  bool is_abandoned_ = false;        // guarded by mutex_
  std::vector<std::shared_ptr<const void>> held_;  // guarded by mutex_
  std::string extra_head_;                         // guarded by mutex_: "\r\nName: value" lines
};

using http_handler = std::function<void(const http_request&, const std::shared_ptr<http_response>&)>;

struct http_server_options {
  std::string address = "127.0.0.1";
  uint16_t port = 0;  ///< 0: any free port
  size_t body_bytes_max = 1 << 20;
  int32_t num_workers = 4;  ///< threads running handlers (a handler may block, e.g. /metrics)
  edge_limits limits;       ///< max_in_flight_per_* and priority_min are the handler's to apply
  tls_context tls;          ///< null: plaintext; else every connection is TLS with it (handshake within header_timeout)
  /// A stopping server lets the responses in progress be written this long, then closes.
  std::chrono::milliseconds stop_timeout{10000};
};

class http_server {
 public:
  /// Listens on address:port and serves with `handler` until destroyed. Errors: io_error naming the
  /// address that cannot be bound, invalid_argument for bad options.
  [[nodiscard]] static expected<std::unique_ptr<http_server>> start(http_server_options options, http_handler handler);
  /// Stops accepting, lets the responses in progress end and be written (stop_timeout at most),
  /// closes.
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  [[nodiscard]] uint16_t port() const;

  struct impl;

 private:
  explicit http_server(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::gateway
