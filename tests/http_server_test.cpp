// actors/edge/http_server over real loopback sockets: exact response bytes (whole and streamed),
// pipelined requests answered in order (a chunked request body among them), Expect: 100-continue,
// the requests it refuses (400, 431, 413, a body over the limit), and a client leaving
// mid-stream, which abandons the response.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "actors/edge/http_server.hpp"
#include "tests/support/loopback_socket.hpp"

namespace troupe::gateway {
namespace {

/// A blocking client socket from 127.0.0.`source` to 127.0.0.1:port (a read waits 30 s at most:
/// a test of today's code fails instead of hanging).
class client {
 public:
  explicit client(uint16_t port, int source = 1) : fd_(testing::loopback_socket(source)) {
    connected_ = testing::connect_loopback(fd_, port);
  }
  ~client() { close(); }
  [[nodiscard]] bool connected() const { return connected_; }
  void send(const std::string& bytes) const { ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size())); }
  /// What arrives until `text` has (or the server closed).
  std::string read_until(const std::string& text) {
    while (received_.find(text) == std::string::npos && read_some()) {
    }
    const size_t end = received_.find(text);
    const size_t n = end == std::string::npos ? received_.size() : end + text.size();
    std::string out = received_.substr(0, n);
    received_.erase(0, n);
    return out;
  }
  /// Everything until the server closes the connection.
  std::string read_to_end() {
    while (read_some()) {
    }
    return std::exchange(received_, "");
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool read_some() {
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    received_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int fd_;
  bool connected_ = false;
  std::string received_;
};

/// Answers GET /hello with "hi"; GET /stream with the stream "ab", "c"; POST /echo with its body.
void answer(const http_request& req, const std::shared_ptr<http_response>& res) {
  if (req.body_too_large) return res->reply(400, "text/plain", "too large: " + std::to_string(req.content_length));
  if (req.path == "/hello") return res->reply(200, "text/plain", "hi");
  if (req.path == "/echo") return res->reply(200, "text/plain", req.method + " " + req.body);
  if (req.path == "/stream") {
    res->begin_stream("text/event-stream");
    res->write("ab");
    return res->end_stream("c");
  }
  res->reply(404, "text/plain", "no " + req.target);
}

std::unique_ptr<http_server> start(http_handler handler = answer, edge_limits limits = {}) {
  http_server_options o;
  o.body_bytes_max = 16;
  o.limits = limits;
  auto server = http_server::start(o, std::move(handler));
  EXPECT_TRUE(server.has_value()) << server.error().message;
  return server ? std::move(*server) : nullptr;
}

TEST(HttpServer, AWholeResponseAndAStreamAreTheseBytes) {
  auto server = start();
  ASSERT_TRUE(server);
  client c(server->port());
  ASSERT_TRUE(c.connected());
  c.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(c.read_until("hi"), "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi");
  c.send("GET /stream?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(c.read_until("0\r\n\r\n"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: "
            "chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n");
  c.send("GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(c.read_to_end(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi");
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  auto server = start();
  ASSERT_TRUE(server);
  client c(server->port());
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\none"
         "GET /nothing HTTP/1.1\r\n\r\n"
         "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\ntw\r\n1\r\no\r\n0\r\n\r\n"
         "POST /echo HTTP/1.1\r\ncontent-length: 5\r\nConnection: close\r\n\r\nthree");
  EXPECT_EQ(c.read_to_end(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\nPOST one"
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nno /nothing"
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\nPOST two"
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\nConnection: close\r\n\r\nPOST three");
}

TEST(HttpServer, ExpectContinueIsAnsweredBeforeTheBody) {
  auto server = start();
  ASSERT_TRUE(server);
  client c(server->port());
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(c.read_until("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  c.send("body");
  EXPECT_EQ(c.read_until("POST body"), "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nPOST body");
}

TEST(HttpServer, RequestsItCannotReadAreRefusedAndTheConnectionCloses) {
  auto server = start();
  ASSERT_TRUE(server);
  const std::string close = "\r\nConnection: close\r\n\r\n";
  struct refused {
    std::string request, answer;
  };
  const refused cases[] = {
      {"NONSENSE\r\n\r\n", "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 24" +
                               close + "a malformed request head"},
      {"POST /echo HTTP/1.1\r\nContent-Length: x\r\n\r\n",
       "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 24" + close +
           "a malformed request head"},
      {"GET /hello HTTP/1.1\r\n" + std::string(70 << 10, 'x') + "\r\n\r\n",
       "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 31" +
           close + "the request head is over 64 KiB"},
      // A chunked body over the limit (16 bytes) is refused as it arrives.
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n" + std::string(17, 'x') + "\r\n0\r\n\r\n",
       "HTTP/1.1 413 Payload Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 34" + close +
           "the request body is over the limit"},
      // Over the limit (16 bytes): the handler answers, unread, and the connection closes.
      {"POST /echo HTTP/1.1\r\nContent-Length: 17\r\n\r\n",
       "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 13" + close + "too large: 17"},
  };
  for (const refused& r : cases) {
    client c(server->port());
    c.send(r.request);
    EXPECT_EQ(c.read_to_end(), r.answer) << r.request;
  }
  client fresh(server->port());
  fresh.send("GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_NE(fresh.read_to_end().find("\r\n\r\nhi"), std::string::npos);
}

TEST(HttpServer, AClientLeavingMidStreamAbandonsTheResponseAndItsTokenIsLetGo) {
  std::promise<std::shared_ptr<http_response>> begun;
  std::promise<void> abandoned;
  auto server = start([&](const http_request&, const std::shared_ptr<http_response>& res) {
    res->begin_stream("text/event-stream");
    res->write("first");
    res->on_abandoned([&] { abandoned.set_value(); });
    begun.set_value(res);
  });
  ASSERT_TRUE(server);
  auto token = std::make_shared<int>(7);
  std::weak_ptr<int> watched = token;
  {
    client c(server->port());
    c.send("GET /stream HTTP/1.1\r\n\r\n");
    EXPECT_NE(c.read_until("first\r\n").find("5\r\nfirst\r\n"), std::string::npos);
    auto res = begun.get_future().get();
    res->hold(std::move(token));
  }  // the client closes
  ASSERT_EQ(abandoned.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(watched.expired());
}

// Connections are capped per client address and in all: one more is answered 503 and closed,
// while another address still gets in. Before: no cap (every connection was served).
TEST(HttpServer, ConnectionsAreCappedPerAddressAndInAll) {
  edge_limits l;
  l.max_connections = 3;
  l.max_connections_per_address = 2;
  auto server = start(answer, l);
  ASSERT_TRUE(server);
  client a(server->port(), 2), b(server->port(), 2), refused(server->port(), 2);
  const std::string why = "too many connections: at most 3 in all and 2 per address";
  const std::string answer_503 = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
                                 std::to_string(why.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + why;
  EXPECT_EQ(refused.read_to_end(), answer_503);
  client other(server->port(), 3);
  other.send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(other.read_until("hi"), "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi");
  client fourth(server->port(), 4);  // 3 open in all
  EXPECT_EQ(fourth.read_to_end(), answer_503);
  a.close();  // its place frees once the server saw it go
  std::string served;
  for (int i = 0; i < 1000 && served.find("hi") == std::string::npos; i++) {
    client again(server->port(), 4);
    again.send("GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
    served = again.read_to_end();
  }
  EXPECT_NE(served.find("\r\n\r\nhi"), std::string::npos);
}

// A request head must arrive within header_timeout of its first byte and its body within
// body_timeout of the head (else 408 and the connection closes); a connection waiting for its
// next request closes after idle_timeout. Before: each waited forever.
TEST(HttpServer, ALateHeadOrBodyIsA408AndAnIdleConnectionCloses) {
  edge_limits l;
  l.header_timeout = std::chrono::milliseconds(100);
  l.body_timeout = std::chrono::milliseconds(100);
  l.idle_timeout = std::chrono::milliseconds(100);
  auto server = start(answer, l);
  ASSERT_TRUE(server);
  const auto late = [](const std::string& what, const std::string& flag) {
    const std::string why = "the request " + what + " took over 100 ms (--gateway-" + flag + "-timeout-ms)";
    return "HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
           std::to_string(why.size()) + "\r\nConnection: close\r\n\r\n" + why;
  };
  client head(server->port());
  head.send("GET /hello HTTP/1.1\r\nHost: x\r\n");
  EXPECT_EQ(head.read_to_end(), late("head", "header"));
  client body(server->port());
  body.send("POST /echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nab");
  EXPECT_EQ(body.read_to_end(), late("body", "body"));
  client idle(server->port());
  idle.send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(idle.read_to_end(), "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi");
}

/// Streams `num_chunks` chunks of `chunk_bytes` (no end) until a write is refused; `abandoned`
/// is set when the client is dropped.
http_handler stream_without_end(int num_chunks, size_t chunk_bytes, std::promise<void>& abandoned) {
  return [=, &abandoned](const http_request&, const std::shared_ptr<http_response>& res) {
    res->on_abandoned([&abandoned] { abandoned.set_value(); });
    res->begin_stream("text/event-stream");
    for (int i = 0; i < num_chunks && res->write(std::string(chunk_bytes, 'x')); i++) {
    }
  };
}

// Output queued for a client that does not read is capped: past output_bytes_max the connection
// closes and its response is abandoned (its request is cancelled). Before: 16 MiB queued, never
// abandoned (the wait below ran out).
TEST(HttpServer, OutputLeftUnreadPastTheCapAbandonsTheResponse) {
  edge_limits l;
  l.output_bytes_max = 1 << 20;
  std::promise<void> abandoned;
  auto server = start(stream_without_end(256, 64 << 10, abandoned), l);
  ASSERT_TRUE(server);
  client c(server->port());
  c.send("GET /stream HTTP/1.1\r\n\r\n");
  EXPECT_EQ(abandoned.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
}

// A write that takes over write_timeout (a client that stopped reading) closes the connection
// and abandons its response. Before: the write waited forever.
TEST(HttpServer, AWriteStalledPastTheWriteTimeoutAbandonsTheResponse) {
  edge_limits l;
  l.write_timeout = std::chrono::milliseconds(100);
  l.output_bytes_max = int64_t{1} << 30;
  std::promise<void> abandoned;
  auto server = start(stream_without_end(1, size_t{64} << 20, abandoned), l);  // more than the sockets hold
  ASSERT_TRUE(server);
  client c(server->port());
  c.send("GET /stream HTTP/1.1\r\n\r\n");
  EXPECT_EQ(abandoned.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
}

}  // namespace
}  // namespace troupe::gateway
