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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/client.hpp"
#include "actors/type_ids.hpp"
#include "bench/figures.hpp"
#include "gateway/http_gateway.hpp"
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
  std::vector<double> ttft_ms, itl_ms;
};

round_figures figures_of(const std::vector<timeline>& requests, double seconds, int64_t num_tokens) {
  round_figures f;
  f.tokens_per_second = static_cast<double>(num_tokens) / seconds;
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
  const double start = now_seconds();
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
  return figures_of(requests, now_seconds() - start, num_tokens);
}

/// One streamed completion over a fresh loopback connection; returns its generated tokens (usage).
int64_t http_stream(uint16_t port, int32_t i, const options& o, timeline& t) {
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
  t.submitted = now_seconds();
  TROUPE_ASSERT(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  TROUPE_ASSERT(::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  std::string received;
  size_t scanned = 0;
  char buf[16384];
  while (received.find("data: [DONE]") == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    TROUPE_ASSERT_MSG(n > 0, "the stream ends with [DONE]");
    received.append(buf, static_cast<size_t>(n));
    const double at = now_seconds();
    for (size_t p; (p = received.find("\"finish_reason\":null", scanned)) != std::string::npos; scanned = p + 1) {
      t.chunks.push_back(at);
    }
  }
  ::close(fd);
  const std::string usage = "\"completion_tokens\":";
  return std::atoll(received.c_str() + received.find(usage) + usage.size());
}

round_figures http_round(uint16_t port, const options& o) {
  std::vector<timeline> requests(static_cast<size_t>(o.clients));
  std::vector<std::thread> threads;
  std::vector<int64_t> tokens(static_cast<size_t>(o.clients));
  const double start = now_seconds();
  for (int32_t i = 0; i < o.clients; i++)
    threads.emplace_back([&, i] { tokens[static_cast<size_t>(i)] = http_stream(port, i, o, requests[static_cast<size_t>(i)]); });
  for (std::thread& t : threads) t.join();
  const double seconds = now_seconds() - start;
  int64_t num_tokens = 0;
  for (const int64_t n : tokens) num_tokens += n;
  return figures_of(requests, seconds, num_tokens);
}

void print_round(const char* path, const round_figures& f) {
  std::printf("  %-4s %8.0f tok/s  TTFT p50 %8.2f ms  ITL p50 %6.3f ms\n", path, f.tokens_per_second,
              percentile(f.ttft_ms, 50), percentile(f.itl_ms, 50));
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const options o = parse(argc, argv);
  const std::string dir = TROUPE_MODELS_DIR;
  topology::topology top = topology::single_node(dir + "/stories260K.bin", dir + "/tok512.bin");
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg);
  caf::actor_system sys{cfg};
  auto node = topology::launch_node(sys, top, top.nodes[0].name, {true, 1});
  TROUPE_ASSERT_MSG(node.has_value(), "the benchmark topology launches");
  gateway::gateway_options g;
  g.model.id = "stories260K";
  auto http = gateway::http_gateway::start(sys, g);
  TROUPE_ASSERT_MSG(http.has_value(), "the gateway listens");
  (*http)->serve(node->load_balancer, node->engines);
  std::printf("%d streamed completions at once, %d new tokens each, greedy, ignore_eos; %d rounds\n", o.clients,
              o.tokens, o.rounds);
  std::vector<double> caf_tps, http_tps, caf_ttft, http_ttft, caf_itl, http_itl;
  (void)caf_round(sys, node->load_balancer, {1, 2, 1});  // warm-up: weights packed, KV pool touched
  for (int32_t round = 0; round < o.rounds; round++) {
    const round_figures c = caf_round(sys, node->load_balancer, o);
    const round_figures h = http_round((*http)->port(), o);
    std::printf("round %d\n", round);
    print_round("CAF", c);
    print_round("HTTP", h);
    caf_tps.push_back(c.tokens_per_second), http_tps.push_back(h.tokens_per_second);
    caf_ttft.push_back(percentile(c.ttft_ms, 50)), http_ttft.push_back(percentile(h.ttft_ms, 50));
    caf_itl.push_back(percentile(c.itl_ms, 50)), http_itl.push_back(percentile(h.itl_ms, 50));
  }
  std::printf("median over rounds: HTTP/CAF tok/s %.3f; TTFT p50 CAF %.2f ms, HTTP %.2f ms; ITL p50 CAF %.3f ms, "
              "HTTP %.3f ms\n",
              percentile(http_tps, 50) / percentile(caf_tps, 50), percentile(caf_ttft, 50), percentile(http_ttft, 50),
              percentile(caf_itl, 50), percentile(http_itl, 50));
  http->reset();
  topology::shutdown_node(sys, *node);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
