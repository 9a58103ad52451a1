// bench_rss_rounds: does a server's memory grow with the requests it has served? Sends rounds of
// short requests to a running `troupe serve` and prints the server's VmRSS after each round.
//
//   bench_rss_rounds --connect HOST:PORT --pid SERVER_PID [--rounds 12] [--requests 1000]
//                    [--concurrency 32] [--tokens 8]
//   bench_rss_rounds --in-process 1 [...]   (serves from its own process: no network)
//
// Each request: a distinct short prompt, `tokens` new tokens, seeded sampling. A round ends when
// every request of it has ended (completed or failed; failures are counted). Run it through
// scripts/rss-rounds.sh, which starts and stops the server (and sets MALLOC_CONF).

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <unistd.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>

#include "actors/client.hpp"
#include "actors/system/type_ids.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

struct options {
  std::string address = "127.0.0.1";
  uint16_t port = 7100;
  long pid = 0;
  int rounds = 12;
  int requests = 1000;
  int concurrency = 32;
  int tokens = 8;
  bool in_process = false;  ///< serve from this process (no network): is growth in the middleman?
};

/// A field of /proc/PID/status in kB ("VmRSS", "VmHWM"), or -1.
long status_kb(long pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// Sends `o.requests` requests, at most `o.concurrency` at a time; returns how many failed.
int run_round(caf::actor_system& sys, const actors::balancer_client_actor& lb, const options& o, int round) {
  std::mutex m;
  std::condition_variable cv;
  int in_flight = 0, done = 0, failed = 0;
  for (int i = 0; i < o.requests; i++) {
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return in_flight < o.concurrency; });
      in_flight++;
    }
    msg::completion_request r;
    r.prompt = "Once upon a time " + std::to_string(round * o.requests + i);
    r.max_tokens = o.tokens;
    r.has_seed = true;
    r.seed = static_cast<uint64_t>(i);
    actors::spawn_client(sys, lb, std::move(r), {}, [&](const expected<actors::completion>& c) {
      std::lock_guard<std::mutex> lock(m);
      in_flight--;
      done++;
      if (!c) failed++;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done == o.requests; });
  return failed;
}

int run(const options& o) {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 1);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  std::optional<topology::launched_node> node;
  caf::expected<actors::balancer_client_actor> lb = actors::balancer_client_actor{};
  if (o.in_process) {
    const std::string models = TROUPE_MODELS_DIR;
    topology::launch_options options;  // detached executors
    options.seed_base = 1;
    auto launched = topology::launch_node(
        sys, topology::single_node(models + "/stories260K.bin", models + "/tok512.bin"), "local", options);
    if (!launched) {
      std::fprintf(stderr, "%s\n", launched.error().message.c_str());
      return 2;
    }
    node = std::move(*launched);
    lb = node->load_balancer;
  } else {
    lb = sys.middleman().remote_actor<actors::balancer_client_actor>(o.address, o.port);
  }
  if (!lb) {
    std::fprintf(stderr, "cannot reach %s:%u: %s\n", o.address.c_str(), o.port, sys.render(lb.error()).c_str());
    return 2;
  }
  std::printf("round  requests  failed  VmRSS_kB  VmHWM_kB  seconds\n");
  std::printf("%5d  %8d  %6d  %8ld  %8ld  %7.2f\n", 0, 0, 0, status_kb(o.pid, "VmRSS"), status_kb(o.pid, "VmHWM"), 0.0);
  for (int round = 1; round <= o.rounds; round++) {
    const auto start = std::chrono::steady_clock::now();
    const int failed = run_round(sys, *lb, o, round);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%5d  %8d  %6d  %8ld  %8ld  %7.2f\n", round, o.requests, failed, status_kb(o.pid, "VmRSS"),
                status_kb(o.pid, "VmHWM"), seconds);
    std::fflush(stdout);
  }
  if (node) topology::shutdown_node(sys, *node);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  troupe::bench::options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--connect") {
      const size_t colon = value.rfind(':');
      o.address = value.substr(0, colon);
      o.port = static_cast<uint16_t>(std::stoi(value.substr(colon + 1)));
    } else if (flag == "--pid") {
      o.pid = std::stol(value);
    } else if (flag == "--rounds") {
      o.rounds = std::stoi(value);
    } else if (flag == "--requests") {
      o.requests = std::stoi(value);
    } else if (flag == "--concurrency") {
      o.concurrency = std::stoi(value);
    } else if (flag == "--in-process") {
      o.in_process = value == "1";
      if (o.in_process) o.pid = ::getpid();
    } else if (flag == "--tokens") {
      o.tokens = std::stoi(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (o.pid <= 0) {
    std::fprintf(stderr, "usage: bench_rss_rounds --connect HOST:PORT --pid SERVER_PID [--rounds N] [--requests N] "
                         "[--concurrency N] [--tokens N]\n");
    return 2;
  }
  return troupe::bench::run(o);
}
