// `troupe serve --msgpack-port 0` over real TCP (docs/msgpack.md): the Node.js example client
// (npm @msgpack/msgpack) against `troupe generate`, and bad frames on raw sockets, each answered
// by its error frame with the connection kept or closed as the protocol says.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include <msgpack.hpp>

#include "tests/support/golden.hpp"
#include "tests/support/metrics_page.hpp"
#include "tests/support/npm_packages.hpp"
#include "tests/support/process.hpp"
#include "tests/support/server_process.hpp"
#include "messages/msgpack_rpc.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;

const std::string prompt = "Once upon a time";

/// A blocking TCP connection to 127.0.0.1:port that reads whole frames.
class frame_socket {
 public:
  explicit frame_socket(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~frame_socket() { ::close(fd_); }
  [[nodiscard]] bool connected() const { return connected_; }
  void send(const std::string& bytes) { ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size())); }
  void close_writing() { ::shutdown(fd_, SHUT_WR); }
  /// The next whole frame, header included; "" at end of stream.
  std::string read_frame() {
    std::string header = read_bytes(wire::frame_header_bytes);
    if (header.size() < wire::frame_header_bytes) return "";
    return header + read_bytes(wire::frame_length(header));
  }

 private:
  std::string read_bytes(size_t n) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd_, out.data() + got, n - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    out.resize(got);
    return out;
  }
  int fd_;
  bool connected_ = false;
};

/// The string value of `key` in the map frame `f` ("" when absent or not a string).
std::string text_field(const std::string& f, const std::string& key) {
  const msgpack::object_handle h = msgpack::unpack(f.data() + wire::frame_header_bytes, f.size() - wire::frame_header_bytes);
  const msgpack::object& map = h.get();
  for (uint32_t i = 0; i < map.via.map.size; i++) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.as<std::string>() == key && kv.val.type == msgpack::type::STR) return kv.val.as<std::string>();
  }
  return "";
}

class Msgpack : public ::testing::Test {
 protected:
  fs::path dir_;
  std::unique_ptr<server_process> server_;
  std::string address_;  ///< 127.0.0.1:PORT
  int port_ = 0;
  int http_port_ = 0;  ///< the same server's HTTP gateway, for /metrics

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_msgpack_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    server_ = std::make_unique<server_process>(
        dir_, std::vector<std::string>{"serve", "--port", "0", "--msgpack-port", "0", "--http-port", "0"});
    ASSERT_TRUE(server_->started());
    const std::string out = server_->read_until("msgpack gateway listening on ");
    const std::string http_line = "HTTP gateway listening on http://127.0.0.1:";
    const size_t http = out.find(http_line);
    ASSERT_NE(http, std::string::npos) << out;
    http_port_ = std::atoi(out.c_str() + http + http_line.size());
    const std::smatch m = [&] { std::smatch s; std::regex_search(out, s, std::regex("msgpack gateway listening on ([0-9.]+:([0-9]+))")); return s; }();
    ASSERT_EQ(m.size(), 3u) << out << server_->err();
    address_ = m[1];
    port_ = std::stoi(m[2]);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  /// What `troupe generate --no-echo ARGS -i prompt` prints before the newline it ends with.
  std::string generated(std::vector<std::string> args) {
    args.insert(args.end(), {"--no-echo", "-i", prompt});
    args.insert(args.begin(), "generate");
    const cli_result r = run_troupe(args, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.substr(0, r.out.size() - 1);
  }

  /// The value of `name`'s sample on the server's /metrics page (-1 if absent).
  double metric(const std::string& name) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(http_port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string page;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
      if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
        char buf[4096];
        for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) page.append(buf, static_cast<size_t>(n));
      }
    }
    ::close(fd);
    return sample_value(page, name);
  }

  /// Sends a greedy request of `max_tokens` with `id` on `s` and returns its text at its end frame.
  std::string greedy_over(frame_socket& s, uint64_t id, int32_t max_tokens) {
    msg::completion_request request;
    request.prompt = prompt;
    request.max_tokens = max_tokens;
    request.temperature = 0;
    s.send(wire::encode_request(id, request));
    std::string text;
    for (std::string f = s.read_frame(); !f.empty(); f = s.read_frame()) {
      const std::string type = text_field(f, "type");
      if (type != "chunk") {
        EXPECT_EQ(type, "end") << text_field(f, "message");
        return text;
      }
      text += text_field(f, "text");
    }
    ADD_FAILURE() << "the connection closed before the end frame";
    return text;
  }
};

TEST_F(Msgpack, TheNodeExampleStreamsTheGreedyTextReplaysASeedCancelsAndReadsAnErrorFrame) {
  if (const std::string missing = npm_package_missing("@msgpack/msgpack", dir_); !missing.empty()) GTEST_SKIP() << missing;
  const cli_result r = run_node("examples/clients/msgpack_client.mjs", {address_, prompt, "40"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = [](const std::string& s) { return std::regex_replace(s, std::regex("\n"), "\\n"); };
  const std::string seeded = json(generated({"-t", "1", "-s", "42", "--top-p", "1", "-n", "40"}));
  EXPECT_EQ(r.out, "{\"greedy\":\"" + json(generated({"-t", "0", "-n", "40"})) + "\",\"finishReason\":\"length\",\"seeded\":[\"" +
                       seeded + "\",\"" + seeded + "\"],\"seeds\":[\"42\",\"42\"],\"cancelled\":\"cancelled\"," +
                       "\"error\":{\"code\":\"invalid_argument\"," +
                       "\"message\":\"unknown key 'tempurature'\"}}\n");
}

TEST_F(Msgpack, ABadRequestIsAnErrorFrameAndTheConnectionGoesOn) {
  frame_socket s(port_);
  ASSERT_TRUE(s.connected());
  // {"id": 1, "tempurature": 0}
  s.send(wire::frame(std::string("\x82\xa2id\x01\xab", 6) + "tempurature" + std::string(1, '\0')));
  EXPECT_EQ(s.read_frame(), wire::encode_error(1, {errc::invalid_argument, "unknown key 'tempurature'"}));
  s.send(wire::frame("\xa3not"));  // a string, not a map
  EXPECT_EQ(s.read_frame(), wire::encode_error(std::nullopt, {errc::invalid_argument, "the request is not a map"}));
  EXPECT_EQ(greedy_over(s, 2, 20), generated({"-t", "0", "-n", "20"}));
}

TEST_F(Msgpack, AFrameOverTheLimitIsAnErrorThenTheConnectionCloses) {
  frame_socket s(port_);
  ASSERT_TRUE(s.connected());
  s.send(std::string("\x00\x10\x00\x01", 4));  // 1 MiB + 1
  EXPECT_EQ(s.read_frame(), wire::encode_error(std::nullopt, {errc::invalid_argument,
                                                              "the frame has 1048577 bytes; the limit is 1048576: closing the connection"}));
  EXPECT_EQ(s.read_frame(), "");
  frame_socket fresh(port_);
  EXPECT_EQ(greedy_over(fresh, 1, 20), generated({"-t", "0", "-n", "20"}));
}

TEST_F(Msgpack, ATruncatedFrameAtEndOfStreamIsAnErrorThenTheConnectionCloses) {
  frame_socket s(port_);
  ASSERT_TRUE(s.connected());
  s.send(std::string("\x00\x00\x00\x0a\x82\xa2", 6));
  s.close_writing();
  EXPECT_EQ(s.read_frame(),
            wire::encode_error(std::nullopt, {errc::invalid_argument, "the connection ended inside a frame of 10 bytes"}));
  EXPECT_EQ(s.read_frame(), "");
}

/// Sends request `id`: 500 tokens, EOS ignored (long enough to act on mid-stream), and reads
/// its first chunk.
void start_long_request(frame_socket& s, uint64_t id) {
  msg::completion_request request;
  request.prompt = "x";
  request.max_tokens = 500;
  request.ignore_eos = true;
  s.send(wire::encode_request(id, request));
  EXPECT_EQ(text_field(s.read_frame(), "type"), "chunk");
}

TEST_F(Msgpack, AClientThatDisconnectsCancelsItsRequestsInFlight) {
  {
    frame_socket s(port_);
    ASSERT_TRUE(s.connected());
    start_long_request(s, 7);
  }
  // The gateway learns it from a read (the peer closed) or from a write that fails first (reset
  // by the peer): either way it cancels the request, and says so.
  EXPECT_TRUE(file_holds_within(
      (dir_ / "serve.err").string(),
      [](const std::string& log) {
        return log.find("the client of request id 7 went away: cancelling it") != std::string::npos ||
               log.find("a write failed or made no progress for 30000 ms; cancelling its 1 request(s)") != std::string::npos;
      },
      std::chrono::seconds(30)))
      << server_->err();
  frame_socket fresh(port_);
  EXPECT_EQ(greedy_over(fresh, 1, 20), generated({"-t", "0", "-n", "20"}));
}

TEST_F(Msgpack, ACancelFrameEndsItsRequestAsCancelledAndItsKvBlocksAreFreed) {
  frame_socket s(port_);
  ASSERT_TRUE(s.connected());
  start_long_request(s, 3);
  s.send(wire::encode_cancel(3));
  s.send(wire::encode_cancel(99));  // no such request: ignored, no frame answers it
  std::string end = s.read_frame();
  while (text_field(end, "type") == "chunk") end = s.read_frame();
  EXPECT_EQ(text_field(end, "type"), "end") << text_field(end, "message");
  EXPECT_EQ(text_field(end, "finish_reason"), "cancelled");
  // The next frames on the connection are request 4's: the cancel of 99 added none.
  EXPECT_EQ(greedy_over(s, 4, 20), generated({"-t", "0", "-n", "20"}));
  // The cancel travels client -> request -> engine: scrape until the engine has let go.
  bool released = false;
  for (int i = 0; i < 500 && !released; i++)
    released = metric("vllm:num_requests_running") == 0 && metric("troupe:num_kv_blocks_in_use") == 0;
  EXPECT_TRUE(released) << server_->err();
}

TEST_F(Msgpack, ChunksCarryTheTopLogprobsAskedForWithTheGreedyTokenFirst) {
  frame_socket s(port_);
  ASSERT_TRUE(s.connected());
  msg::completion_request request;
  request.prompt = prompt;
  request.max_tokens = 8;
  request.temperature = 0;
  request.num_top_logprobs = 2;
  s.send(wire::encode_request(5, request));
  int32_t num_tokens = 0;
  for (std::string f = s.read_frame(); text_field(f, "type") == "chunk"; f = s.read_frame()) {
    const msgpack::object_handle h = msgpack::unpack(f.data() + wire::frame_header_bytes, f.size() - wire::frame_header_bytes);
    std::map<std::string, msgpack::object> fields;
    for (uint32_t i = 0; i < h.get().via.map.size; i++)
      fields[h.get().via.map.ptr[i].key.as<std::string>()] = h.get().via.map.ptr[i].val;
    const auto tokens = fields.at("tokens").as<std::vector<int32_t>>();
    const auto logprobs = fields.at("logprobs").as<std::vector<float>>();
    const auto tops = fields.at("top_logprobs").as<std::vector<std::vector<std::tuple<int32_t, float>>>>();
    ASSERT_EQ(tops.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); i++) {
      ASSERT_EQ(tops[i].size(), 2u);
      EXPECT_EQ(std::get<0>(tops[i][0]), tokens[i]);  // greedy: the chosen token is the most likely
      EXPECT_EQ(std::get<1>(tops[i][0]), logprobs[i]);
      EXPECT_GE(std::get<1>(tops[i][0]), std::get<1>(tops[i][1]));
    }
    num_tokens += static_cast<int32_t>(tokens.size());
  }
  EXPECT_EQ(num_tokens, 8);
}

}  // namespace
}  // namespace troupe::testing
