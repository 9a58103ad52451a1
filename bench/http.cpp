// bench_http: the HTTP gateway's cost. N streamed completions (default 64, all at once) through
// the CAF client API and the same N through HTTP (streamed SSE over loopback, one socket per
// request), against the same node in one process, alternating over rounds; each round reports
// generated tok/s and client-side TTFT / ITL medians, then the HTTP/CAF ratios of the medians.
//
//   bench_http [--clients N] [--tokens T] [--rounds R]
//
// Requests: a 31-token prompt (distinct per client), T new tokens (default 200), greedy, EOS
// ignored. TTFT is measured from submission to the first chunk as the client sees it; ITL is
// every gap between chunks.
//
// First: how long refusing issue 47's 800 KB body of 400,000 nested lists takes (the parse stops
// at the 65th level), against parsing a valid request of the same size, median of 11 each.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/client.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "actors/edge/http_gateway.hpp"
#include "runtime/openai/api.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

struct options {
  int32_t clients = 64;
  int32_t tokens = 200;
  int32_t rounds = 3;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const int value = i + 1 < argc ? std::atoi(argv[++i]) : 0;
    if (a == "--clients") o.clients = value;
    else if (a == "--tokens") o.tokens = value;
    else if (a == "--rounds") o.rounds = value;
    else std::fprintf(stderr, "unknown option %s\n", a.c_str()), std::exit(2);
  }
  return o;
}

/// When each chunk of one request reached its client, from its submission.
struct timeline {
  double submitted = 0;
  std::vector<double> chunks;
};

struct round_figures {
  double tokens_per_second = 0;
  double cpu_us_per_token = 0;  ///< the whole process's CPU time (engine, gateway, client) per token
  std::vector<double> ttft_ms, itl_ms;
};

/// CPU time of this process, all threads: unlike wall time, other processes' load leaves it be.
double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

round_figures figures_of(const std::vector<timeline>& requests, double seconds, double cpu_seconds, int64_t num_tokens) {
  round_figures f;
  f.tokens_per_second = static_cast<double>(num_tokens) / seconds;
  f.cpu_us_per_token = cpu_seconds * 1e6 / static_cast<double>(num_tokens);
  for (const timeline& t : requests) {
    if (t.chunks.empty()) continue;
    f.ttft_ms.push_back((t.chunks.front() - t.submitted) * 1e3);
    for (size_t i = 1; i < t.chunks.size(); i++) f.itl_ms.push_back((t.chunks[i] - t.chunks[i - 1]) * 1e3);
  }
  return f;
}

msg::completion_request request_of(int32_t i, const options& o) {
  msg::completion_request r;
  r.prompt = "Story number " + std::to_string(i) + ": once upon a time there was a little girl who loved to";
  r.max_tokens = o.tokens;
  r.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

round_figures caf_round(caf::actor_system& sys, const actors::balancer_client_actor& balancer, const options& o) {
  std::vector<timeline> requests(static_cast<size_t>(o.clients));
  std::mutex mutex;
  std::condition_variable all_done;
  int32_t num_done = 0;
  int64_t num_tokens = 0;
  const double start = now_seconds(), cpu_start = process_cpu_seconds();
  for (int32_t i = 0; i < o.clients; i++) {
    timeline& t = requests[static_cast<size_t>(i)];
    t.submitted = now_seconds();
    actors::spawn_client(
        sys, balancer, request_of(i, o), [&t](const msg::completion_chunk&) { t.chunks.push_back(now_seconds()); },
        [&](const expected<actors::completion>& c) {
          std::lock_guard<std::mutex> lock(mutex);
          num_tokens += c ? c->end.num_generated_tokens : 0;
          if (++num_done == o.clients) all_done.notify_one();
        });
  }
  std::unique_lock<std::mutex> lock(mutex);
  all_done.wait(lock, [&] { return num_done == o.clients; });
  return figures_of(requests, now_seconds() - start, process_cpu_seconds() - cpu_start, num_tokens);
}

/// One streamed completion on its own loopback connection, read by the client loop below.
struct http_stream {
  int fd = -1;
  timeline* times = nullptr;
  std::string received;
  size_t scanned = 0;
  int64_t num_tokens = 0;  ///< usage.completion_tokens, once [DONE] arrived
};

int connect_and_post(uint16_t port, int32_t i, const options& o) {
  const msg::completion_request r = request_of(i, o);
  const std::string body = "{\"prompt\":\"" + r.prompt + "\",\"max_tokens\":" + std::to_string(o.tokens) +
                           ",\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TROUPE_ASSERT(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  TROUPE_ASSERT(::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  return fd;
}

/// Reads what `s` has; true once its stream ended with [DONE].
bool read_stream(http_stream& s) {
  char buf[65536];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  TROUPE_ASSERT_MSG(n > 0, "the stream ends with [DONE]");
  const double at = now_seconds();
  const std::string_view done = "data: [DONE]";
  // Only what arrived now (and a marker's worth before it) is searched: no rescans.
  const size_t from = s.received.size() >= done.size() ? s.received.size() - done.size() : 0;
  s.received.append(buf, static_cast<size_t>(n));
  for (size_t p; (p = s.received.find("\"finish_reason\":null", s.scanned)) != std::string::npos; s.scanned = p + 1)
    s.times->chunks.push_back(at);
  if (s.received.find(done, from) == std::string::npos) return false;
  const std::string usage = "\"completion_tokens\":";
  s.num_tokens = std::atoll(s.received.c_str() + s.received.find(usage) + usage.size());
  ::close(s.fd);
  return true;
}

/// The HTTP client: one thread and epoll over all the streams, as the CAF path's client is one
/// callback per chunk on the actor threads (64 blocking reader threads would charge the client's
/// thread switches to the gateway).
round_figures http_round(uint16_t port, const options& o) {
  std::vector<timeline> requests(static_cast<size_t>(o.clients));
  std::vector<http_stream> streams(static_cast<size_t>(o.clients));
  const int epoll_fd = ::epoll_create1(0);
  const double start = now_seconds(), cpu_start = process_cpu_seconds();
  for (int32_t i = 0; i < o.clients; i++) {
    http_stream& s = streams[static_cast<size_t>(i)];
    s.times = &requests[static_cast<size_t>(i)];
    s.times->submitted = now_seconds();
    s.fd = connect_and_post(port, i, o);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = &s;
    TROUPE_ASSERT(::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, s.fd, &e) == 0);
  }
  epoll_event events[64];
  for (int32_t open = o.clients; open > 0;) {
    const int n = ::epoll_wait(epoll_fd, events, 64, -1);
    for (int i = 0; i < n; i++) open -= read_stream(*static_cast<http_stream*>(events[i].data.ptr)) ? 1 : 0;
  }
  const double seconds = now_seconds() - start, cpu_seconds = process_cpu_seconds() - cpu_start;
  ::close(epoll_fd);
  int64_t num_tokens = 0;
  for (const http_stream& s : streams) num_tokens += s.num_tokens;
  return figures_of(requests, seconds, cpu_seconds, num_tokens);
}

void print_round(const char* path, const round_figures& f) {
  std::printf("  %-4s %8.0f tok/s  %6.1f CPU us/token  TTFT p50 %8.2f ms  ITL p50 %6.3f ms\n", path,
              f.tokens_per_second, f.cpu_us_per_token, percentile(f.ttft_ms, 50), percentile(f.itl_ms, 50));
}

/// The median milliseconds `parse_request` takes on `body`, of 11 runs; `ok`: whether it parsed.
double parse_ms(const std::string& body, bool& ok) {
  const openai::served_model model{"stories260K", "bench", 0};
  std::vector<double> ms;
  for (int r = 0; r < 11; r++) {
    const double start = now_seconds();
    ok = openai::parse_request(openai::endpoint::completions, body, model).has_value();
    ms.push_back((now_seconds() - start) * 1e3);
  }
  return percentile(ms, 50);
}

void print_json_rejection() {
  const std::string nested = R"({"prompt":"x","guided_json":)" + std::string(400000, '[') + std::string(400000, ']') + "}";
  const std::string valid = R"({"prompt":")" + std::string(800000, 'a') + R"("})";
  bool refused_ok = true, valid_ok = false;
  const double refused_ms = parse_ms(nested, refused_ok), valid_ms = parse_ms(valid, valid_ok);
  TROUPE_ASSERT(!refused_ok && valid_ok);
  std::printf("request body of 400,000 nested lists (800 KB): refused in %.3f ms; a valid 800 KB body parses in %.3f ms\n",
              refused_ms, valid_ms);
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const options o = parse(argc, argv);
  print_json_rejection();
  const std::string dir = TROUPE_MODELS_DIR;
  topology::topology top = topology::single_node(dir + "/stories260K.bin", dir + "/tok512.bin");
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, topology::node_compute_threads(top, top.nodes[0].name));
  caf::actor_system sys{cfg};
  topology::launch_options options;  // detached executors
  options.seed_base = 1;
  auto node = topology::launch_node(sys, top, top.nodes[0].name, options);
  TROUPE_ASSERT_MSG(node.has_value(), "the benchmark topology launches");
  gateway::gateway_options g;
  g.model.id = "stories260K";
  auto http = gateway::http_gateway::start(sys, g);
  TROUPE_ASSERT_MSG(http.has_value(), "the gateway listens");
  (*http)->serve(node->load_balancer, node->engines, node->tok, node->context_tokens, node->chat);
  std::printf("%d streamed completions at once, %d new tokens each, greedy, ignore_eos; %d rounds\n", o.clients,
              o.tokens, o.rounds);
  std::vector<double> ratios, caf_cpu, http_cpu, caf_ttft, http_ttft, caf_itl, http_itl;
  (void)caf_round(sys, node->load_balancer, {1, 2, 1});  // warm-up: weights packed, KV pool touched
  for (int32_t round = 0; round < o.rounds; round++) {
    const round_figures c = caf_round(sys, node->load_balancer, o);
    const round_figures h = http_round((*http)->port(), o);
    std::printf("round %d: HTTP/CAF tok/s %.3f\n", round, h.tokens_per_second / c.tokens_per_second);
    print_round("CAF", c);
    print_round("HTTP", h);
    ratios.push_back(h.tokens_per_second / c.tokens_per_second);
    caf_cpu.push_back(c.cpu_us_per_token), http_cpu.push_back(h.cpu_us_per_token);
    caf_ttft.push_back(percentile(c.ttft_ms, 50)), http_ttft.push_back(percentile(h.ttft_ms, 50));
    caf_itl.push_back(percentile(c.itl_ms, 50)), http_itl.push_back(percentile(h.itl_ms, 50));
  }
  std::printf("median over rounds: HTTP/CAF tok/s %.3f; CPU us/token CAF %.1f, HTTP %.1f; TTFT p50 CAF %.2f ms, "
              "HTTP %.2f ms; ITL p50 CAF %.3f ms, HTTP %.3f ms\n",
              percentile(ratios, 50), percentile(caf_cpu, 50), percentile(http_cpu, 50), percentile(caf_ttft, 50),
              percentile(http_ttft, 50), percentile(caf_itl, 50), percentile(http_itl, 50));
  http->reset();
  topology::shutdown_node(sys, *node);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
