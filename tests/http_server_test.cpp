// gateway/http_server over real loopback sockets: exact response bytes (whole and streamed),
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

#include "gateway/http_server.hpp"

namespace troupe::gateway {
namespace {

/// A blocking client socket to 127.0.0.1:port.
class client {
 public:
  explicit client(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
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

std::unique_ptr<http_server> start(http_handler handler = answer) {
  http_server_options o;
  o.body_bytes_max = 16;
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

}  // namespace
}  // namespace troupe::gateway
