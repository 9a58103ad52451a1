// bench_serve: vLLM-style serving metrics through the real actor system (load balancer ->
// request actors -> engine -> step executor on its own thread), next to the single-stream
// reference generator measured in the same run.
//
//   bench_serve [--synthetic] [--clients N] [--rate R] [--tokens T] [--threads K] [--runs R]
//
// N clients (default: 1 and 64, one run each) each send one request: a 32-token prompt
// (a window of a greedy story, distinct per client), T new tokens (default 200; 64 with
// --synthetic), greedy, EOS ignored. Arrivals: all at once, or Poisson at R requests/s (seeded).
// Reported: TTFT, TPOT (per request: (E2E - TTFT) / (tokens - 1)), ITL (every gap), E2E — mean,
// p50, p90, p99 in ms; request and token throughput; executor busy fraction (time with a step in
// flight / wall time of the run). Ratios use the reference generator's single-stream tok/s. With
// --runs R (default 1; odd, rounded up) each client count is served R times, each run right after a fresh
// reference measurement, and the median of the R side-by-side ratios is printed: the host is
// shared and its speed drifts between seconds, so a ratio of two figures taken far apart is noise.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/client.hpp"
#include "actors/engine_actor.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

constexpr int32_t prompt_tokens = 32;

struct options {
  bool synthetic = false;
  std::vector<int32_t> clients = {1, 64};
  double rate = 0;  // requests per second; 0 = all at once
  int32_t tokens = 200;
  int32_t threads = 1;
  int32_t runs = 1;
};

options parse(int argc, char** argv) {
  options o;
  parse_arguments(argc, argv, [&](const std::string& a, const auto& next) {
    if (a == "--synthetic") o.synthetic = true, o.tokens = 64;
    else if (a == "--clients") o.clients = {std::stoi(next())};
    else if (a == "--rate") o.rate = std::stod(next());
    else if (a == "--tokens") o.tokens = std::stoi(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else if (a == "--runs") o.runs = std::max(1, std::stoi(next())) | 1;  // odd: the median is a run
    else return false;
    return true;
  });
  return o;
}

/// One serving run: `n` clients against a fresh node; returns aggregate generated tok/s.
double serve_once(const topology::topology& t, const std::vector<std::vector<int32_t>>& prompts, const tokenizer& tok,
                  int32_t n, const options& o) {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, topology::node_compute_threads(t, t.nodes[0].name));
  caf::actor_system sys{cfg};
  topology::launch_options options;  // detached executors
  options.seed_base = 1;
  auto node = topology::launch_node(sys, t, t.nodes[0].name, options);
  TROUPE_ASSERT_MSG(node.has_value(), "the benchmark topology launches");
  {
    // Warm-up: the executor packs its weights and allocates its KV pool when spawned; one short
    // request makes sure that is done before the clock starts.
    msg::completion_request warm;
    warm.max_tokens = 2;
    TROUPE_ASSERT_MSG(actors::complete(sys, node->load_balancer, warm).has_value(), "warm-up request");
  }
  const msg::engine_report before = *actors::query_engine(sys, node->engines[0]);
  std::mutex mutex;
  std::condition_variable all_ended;
  std::vector<msg::completion_end> ends;
  int32_t num_failed = 0;
  std::mt19937_64 rng(7);
  std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
  const double start = now_seconds();
  for (int32_t i = 0; i < n; i++) {
    msg::completion_request r;
    r.prompt = tok.decode(prompts[i]);
    r.max_tokens = o.tokens;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    actors::spawn_client(sys, node->load_balancer, r, {}, [&](const expected<actors::completion>& c) {
      std::lock_guard<std::mutex> lock(mutex);
      if (c) ends.push_back(c->end); else num_failed++;
      if (static_cast<int32_t>(ends.size()) + num_failed == n) all_ended.notify_one();
    });
    if (o.rate > 0) std::this_thread::sleep_for(std::chrono::duration<double>(gap(rng)));
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    all_ended.wait(lock, [&] { return static_cast<int32_t>(ends.size()) + num_failed == n; });
  }
  const double seconds = now_seconds() - start;
  const msg::engine_report after = *actors::query_engine(sys, node->engines[0]);
  topology::shutdown_node(sys, *node);

  std::vector<double> ttft, tpot, itl, e2e;
  int64_t num_tokens = 0;
  for (const msg::completion_end& e : ends) {
    ttft.push_back(e.ttft_ns / 1e6);
    e2e.push_back(e.e2e_ns / 1e6);
    if (e.num_generated_tokens > 1) tpot.push_back((e.e2e_ns - e.ttft_ns) / 1e6 / (e.num_generated_tokens - 1));
    for (int64_t g : e.itl_ns) itl.push_back(g / 1e6);
    num_tokens += e.num_generated_tokens;
  }
  const double busy = static_cast<double>(after.executor_busy_ns - before.executor_busy_ns) / (seconds * 1e9);
  std::printf("\n%d client(s)%s: %d ok, %d failed, %.3f s\n", n, o.rate > 0 ? " (Poisson arrivals)" : " (all at once)",
              static_cast<int>(ends.size()), num_failed, seconds);
  print_metric("TTFT", ttft);
  print_metric("TPOT", tpot);
  print_metric("ITL", itl);
  print_metric("E2E", e2e);
  std::printf("  throughput %.2f req/s, %.0f tok/s; executor busy %.1f%%\n", ends.size() / seconds,
              num_tokens / seconds, 100.0 * busy);
  return num_tokens / seconds;
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const options o = parse(argc, argv);
  const std::string dir = TROUPE_MODELS_DIR;
  std::string model_path = dir + "/stories260K.bin";
  if (o.synthetic) {
    model_path = "/tmp/troupe_bench_synthetic.bin";
    write_synthetic_checkpoint(model_path, synthetic_shape{}, 1);
  }
  auto ck = model::checkpoint::load(model_path);
  auto tok = tokenizer::load(dir + "/tok512.bin", 512);
  TROUPE_ASSERT_MSG(ck && tok, "bundled files load");
  std::printf("model %s, %d-token prompts, %d new tokens, greedy, ignore_eos, executor threads %d\n",
              model_path.c_str(), prompt_tokens, o.tokens, o.threads);

  // Prompts: windows of one greedy story from the real model (decodable text for the clients).
  auto real_ck = model::checkpoint::load(dir + "/stories260K.bin");
  model::transformer story_model(*real_ck);
  generate::generate_params sp;
  sp.prompt = {tokenizer::bos};
  sp.max_new_tokens = 64 + prompt_tokens;
  sp.sampling.temperature = 0.0f;
  sp.ignore_eos = true;
  const auto story = generate::generate(story_model, *tok, sp);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 64; i++) {
    std::vector<int32_t> p{tokenizer::bos};
    p.insert(p.end(), story->tokens.begin() + i, story->tokens.begin() + i + prompt_tokens - 1);
    prompts.push_back(p);
  }

  model::transformer t(*ck);
  std::vector<double> ref;
  for (int i = 0; i < 3; i++) ref.push_back(reference_tokens_per_second(t, *tok, prompts[0], o.tokens));
  const double reference = summarize(ref).median;
  std::printf("reference generator, single stream: %.0f tok/s (median of 3)\n", reference);

  topology::topology top = topology::single_node(model_path, dir + "/tok512.bin");
  top.engines[0].executor_threads = o.threads;
  top.engines[0].config.num_kv_blocks = 64 * ((prompt_tokens + o.tokens + 15) / 16);
  for (int32_t n : o.clients) {
    std::vector<double> ratios;
    for (int32_t run = 0; run < o.runs; run++) {
      const double side_by_side = run == 0 ? reference : reference_tokens_per_second(t, *tok, prompts[0], o.tokens);
      const double rate = serve_once(top, prompts, *tok, std::min<int32_t>(n, 64), o);
      ratios.push_back(rate / side_by_side);
      std::printf("  => %.2fx the reference's single-stream tok/s (%.0f, measured just before)\n", ratios.back(),
                  side_by_side);
    }
    if (o.runs > 1) {
      const summary r = summarize(ratios);
      std::printf("%d client(s), %d runs: median %.2fx the reference (min %.2f, max %.2f)\n", n, o.runs, r.median,
                  r.min, r.max);
    }
  }
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
