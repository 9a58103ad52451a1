// bench_cluster: end-to-end TTFT and E2E of the same workload on a one-node topology (one mixed
// engine) and on the three-node disaggregated topology (prefill engine + two decode engines,
// each node its own `troupe node` process on 127.0.0.1), with KV over CAF messages and over
// UCX, and with KV over CAF messages on mutual TLS ([tls], certificates from `troupe certs`).
// Requests arrive as a seeded Poisson process; every configuration gets the same requests and
// seeds, and the outputs are checked to be identical across configurations. Prints tokens/s.
//
//   build/bench/bench_cluster [--requests 128] [--max-tokens 64] [--rate 100]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>

#include "actors/client.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/tls.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "bench/troupe_process.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct options {
  int32_t requests = 128;
  int32_t max_tokens = 64;
  double rate = 100.0;  // requests per second
  std::string troupe;
};

struct config {
  std::string name;
  std::vector<std::string> nodes;  // started in this order; the balancer's node (node0) last
  std::string kv_transfer;
  bool tls = false;  // [tls] with the certificates in <dir>/certs
};

std::string topology_text(const config& c, int base_port, const fs::path& certs) {
  const std::string models = TROUPE_MODELS_DIR;
  std::string t = "[cluster]\nname = \"" + c.name + "\"\nkv_transfer = \"" + c.kv_transfer + "\"\n";
  if (c.tls) t += "\n[tls]\nca = \"" + (certs / "ca.pem").string() + "\"\n";
  for (size_t n = 0; n < c.nodes.size(); n++) {
    const std::string node = "node" + std::to_string(n);
    t += "\n[[node]]\nname = \"" + node + "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port + n) +
         "\nkv_port = " + std::to_string(base_port + 100 + n) + "\n";
    if (c.tls)
      t += "certificate = \"" + (certs / (node + ".pem")).string() + "\"\nkey = \"" +
           (certs / (node + "-key.pem")).string() + "\"\n";
  }
  t += "\n[load_balancer]\nnode = \"node0\"\nmax_waiting = 4096\n";
  auto engine = [&](const std::string& name, const std::string& node, const std::string& role) {
    t += "\n[[engine]]\nname = \"" + name + "\"\nnode = \"" + node + "\"\nrole = \"" + role + "\"\nmodel = \"" +
         models + "/stories260K.bin\"\ntokenizer = \"" + models + "/tok512.bin\"\n";
  };
  if (c.nodes.size() == 1) {
    engine("engine0", "node0", "mixed");
  } else {
    engine("prefill0", "node0", "prefill");
    engine("decode1", "node1", "decode");
    engine("decode2", "node2", "decode");
  }
  return t;
}

pid_t start_node(const std::string& troupe, const std::string& topo, const std::string& node, const fs::path& dir) {
  return start_program({troupe, "--log-level", "warn", "node", "--topology", topo, "--node", node},
                      (dir / (node + ".log")).string());
}

struct run_result {
  std::vector<double> ttft_ms, e2e_ms;
  std::map<size_t, std::vector<int32_t>> tokens;
  int32_t failed = 0;
  double seconds = 0;
};

run_result run_config(const config& c, const std::vector<msg::completion_request>& requests,
                      const std::vector<double>& arrivals, const options& o, const fs::path& dir) {
  const int base_port = 43000 + (::getpid() % 500) * 8;
  const std::string topo = (dir / (c.name + ".toml")).string();
  const fs::path certs = dir / "certs";
  std::ofstream(topo) << topology_text(c, base_port, certs);
  std::vector<pid_t> pids;
  for (size_t n = c.nodes.size(); n-- > 0;) pids.push_back(start_node(o.troupe, topo, "node" + std::to_string(n), dir));
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 0);
  const actors::tls_credentials tls = c.tls ? credentials_of(certs, "bench") : actors::tls_credentials{};
  TROUPE_ASSERT_MSG(actors::configure_network(cfg, tls).has_value(), "bad TLS files");
  run_result r;
  {
    caf::actor_system sys{cfg};
    actors::reach_options ro;
    ro.timeout = 30s;  // the nodes load their models first
    auto reached = actors::reach<actors::balancer_client_actor>(sys, "127.0.0.1", static_cast<uint16_t>(base_port), ro);
    TROUPE_ASSERT_MSG(reached.has_value(), "the balancer never listened");
    const actors::balancer_client_actor lb = *reached;
    std::mutex m;
    std::condition_variable cv;
    size_t done = 0;
    const double start = now_seconds();
    for (size_t i = 0; i < requests.size(); i++) {
      const double wait = arrivals[i] - (now_seconds() - start);
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      actors::spawn_client(sys, lb, requests[i], {}, [&, i](const expected<actors::completion>& out) {
        std::lock_guard<std::mutex> lock(m);
        if (out) {
          r.ttft_ms.push_back(out->end.ttft_ns / 1e6);
          r.e2e_ms.push_back(out->end.e2e_ns / 1e6);
          r.tokens[i] = out->tokens;
        } else {
          r.failed++;
          std::fprintf(stderr, "request %zu failed: %s\n", i, out.error().message.c_str());
        }
        done++;
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return done == requests.size(); });
    r.seconds = now_seconds() - start;
  }
  for (pid_t pid : pids) ::kill(pid, SIGTERM);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  return r;
}

int run(int argc, char** argv) {
  options o;
  o.troupe = default_troupe_binary(argv[0]);
  CLI::App app{"end-to-end latency: one node vs three-node disaggregation"};
  app.add_option("--requests", o.requests, "requests per configuration")->check(CLI::Range(1, 100000));
  app.add_option("--max-tokens", o.max_tokens, "new tokens per request")->check(CLI::Range(1, 400));
  app.add_option("--rate", o.rate, "Poisson arrival rate, requests/s")->check(CLI::Range(0.1, 1e6));
  app.add_option("--troupe", o.troupe, "the troupe binary");
  CLI11_PARSE(app, argc, argv);
  std::printf("$ %s\n", command_line(argc, argv).c_str());

  auto tok = tokenizer::load(std::string(TROUPE_MODELS_DIR) + "/tok512.bin", 512);
  TROUPE_ASSERT(tok.has_value());
  // Prompts: windows of a fixed text, 8 to 120 tokens; seeded sampling; Poisson arrivals.
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. It was "
      "shiny and new. Lily wanted to share the ball with her friends, so she ran back to them and they played "
      "together all day long until the sun went down and their moms called them home for dinner.";
  std::mt19937_64 rng(2026);
  std::vector<msg::completion_request> requests;
  std::vector<double> arrivals;
  double t = 0;
  std::exponential_distribution<double> gap(o.rate);
  for (int32_t i = 0; i < o.requests; i++) {
    msg::completion_request r;
    const size_t words = 4 + rng() % 80;
    size_t end = 0;
    for (size_t w = 0; w < words && end != std::string::npos; w++) end = text.find(' ', end + 1);
    r.prompt = text.substr(0, end == std::string::npos ? text.size() : end);
    r.max_tokens = o.max_tokens;
    r.ignore_eos = true;
    r.has_seed = true;
    r.seed = 100 + static_cast<uint64_t>(i);
    r.temperature = 1.0f;
    r.top_p = 0.9f;
    requests.push_back(r);
    arrivals.push_back(t);
    t += gap(rng);
  }
  std::printf("%d requests, Poisson %.1f req/s, prompts 5-90 tokens, %d new tokens each, T=1 top-p 0.9\n",
              o.requests, o.rate, o.max_tokens);
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_cluster_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  if (auto certs = make_certs(o.troupe, dir, "node0,node1,node2", "bench"); !certs) {
    std::fprintf(stderr, "%s\n", certs.error().message.c_str());
    fs::remove_all(dir);
    return 1;
  }
  const std::vector<config> configs = {{"single-node", {"node0"}, "caf"},
                                       {"three-node-caf", {"node0", "node1", "node2"}, "caf"},
                                       {"three-node-caf-tls", {"node0", "node1", "node2"}, "caf", true},
                                       {"three-node-ucx", {"node0", "node1", "node2"}, "ucx"}};
  std::vector<run_result> results;
  for (const config& c : configs) {
    results.push_back(run_config(c, requests, arrivals, o, dir));
    const run_result& r = results.back();
    size_t num_tokens = 0;
    for (const auto& [i, tokens] : r.tokens) num_tokens += tokens.size();
    std::printf("\n%s: %zu ok, %d failed, %.2f s, %.0f tokens/s\n", c.name.c_str(), r.ttft_ms.size(), r.failed,
                r.seconds, static_cast<double>(num_tokens) / r.seconds);
    print_metric("TTFT", r.ttft_ms);
    print_metric("E2E", r.e2e_ms);
  }
  fs::remove_all(dir);
  std::printf("\nratios to single-node (median): ");
  for (size_t i = 1; i < results.size(); i++)
    std::printf("%s TTFT %.2fx E2E %.2fx; ", configs[i].name.c_str(),
                percentile(results[i].ttft_ms, 50) / percentile(results[0].ttft_ms, 50),
                percentile(results[i].e2e_ms, 50) / percentile(results[0].e2e_ms, 50));
  bool same = true;
  for (size_t i = 1; i < results.size(); i++) same = same && results[i].tokens == results[0].tokens;
  std::printf("\noutputs identical across configurations: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
