// bench_engine: aggregate throughput of the batched engine at 1, 8, 64 and 256 concurrent
// requests, each as a ratio to the single-stream reference generator measured in the same run.
//
// Workload. Every request has a 32-token prompt and generates exactly 200 tokens (ignore_eos),
// greedy (temperature 0: the full sampler pipeline, no argmax shortcut), fast kernels. The
// prompts are windows of one greedy story: prompt i = [BOS] + story[i, i + 31), where the story
// is the reference generator's 511 greedy tokens from BOS. Distinct prompts keep the prefix
// cache from skipping prefill work the reference generator has to do (the table reports the
// hits anyway). The reference generator runs prompt 0.
//
// Figure. Generated tokens / wall time, from the first add_request (engine) or the call of
// generate() (reference) until the last token, prefill included; the engine is created (and
// its KV pool allocated) before the clock starts. Median of 3 runs per point, each on a fresh
// engine.

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

constexpr int32_t prompt_tokens = 32;
int32_t new_tokens = 200;         // 64 for the synthetic model
int32_t max_concurrency = 256;   // 64 for the synthetic model
constexpr int num_runs = 3;
constexpr int32_t concurrency_max = 256;
const int32_t concurrencies[] = {1, 8, 64, 256};

engine::engine_config bench_config() {
  engine::engine_config c;
  c.block_size = 16;
  const int32_t blocks_per_seq = (prompt_tokens + new_tokens + c.block_size - 1) / c.block_size;
  c.num_kv_blocks = concurrency_max * blocks_per_seq;  // all 256 sequences at full length
  c.scheduler.max_num_seqs = concurrency_max;
  c.scheduler.max_num_batched_tokens = 2048;
  c.kernels = model::kernel_path::fast;
  return c;
}

struct engine_run {
  double tokens_per_second = 0;
  engine::engine_stats stats;
};

engine_run engine_once(const model::checkpoint& ck, const tokenizer& tok,
                       const std::vector<std::vector<int32_t>>& prompts, int32_t concurrency,
                       kernels::cpu::thread_pool* pool) {
  auto e = engine::engine::create(ck, tok, bench_config(), pool);
  TROUPE_ASSERT_MSG(e.has_value(), "the benchmark engine config is valid");
  const double start = now_seconds();
  for (int32_t i = 0; i < concurrency; i++) {
    engine::request r;
    r.id = i;
    r.prompt = prompts[i];
    r.max_tokens = new_tokens;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    auto ok = (*e)->add_request(std::move(r));
    TROUPE_ASSERT_MSG(ok.has_value(), "the benchmark request is valid");
  }
  int64_t num_tokens = 0;
  while ((*e)->has_unfinished()) num_tokens += static_cast<int64_t>((*e)->step().size());
  const double seconds = now_seconds() - start;
  TROUPE_ASSERT(num_tokens == static_cast<int64_t>(concurrency) * new_tokens);
  return {static_cast<double>(num_tokens) / seconds, (*e)->stats()};
}

void print_header() {
  const engine::engine_config c = bench_config();
  std::printf("fast kernels, greedy (temperature 0), ignore_eos; %d-token prompts, %d new tokens\n",
              prompt_tokens, new_tokens);
  std::printf("engine_config: num_kv_blocks %d, block_size %d, max_num_seqs %d, max_num_batched_tokens %d\n",
              c.num_kv_blocks, c.block_size, c.scheduler.max_num_seqs, c.scheduler.max_num_batched_tokens);
  std::printf("tok/s = generated tokens / wall time incl. prefill; median of %d runs\n\n", num_runs);
  std::printf("%-12s %7s %12s %10s %10s %8s %7s %11s %11s\n", "concurrent", "threads", "median tok/s", "min",
              "max", "x ref", "steps", "preemptions", "prefix hits");
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const std::string dir = TROUPE_MODELS_DIR;
  std::string model_path = dir + "/stories260K.bin";
  if (argc > 1 && std::string(argv[1]) == "--synthetic") {
    // A memory-bound shape: 25 M parameters (100 MB of float32 weights) with tok512's vocabulary.
    model_path = "/tmp/troupe_bench_synthetic.bin";
    write_synthetic_checkpoint(model_path, synthetic_shape{}, 1);
    new_tokens = 64;
    max_concurrency = 64;
    std::printf("synthetic model: dim 512, hidden 1376, 8 layers, 8 heads, 4 KV heads, random weights\n");
  }
  auto ck = model::checkpoint::load(model_path);
  if (!ck) return std::fprintf(stderr, "%s\n", ck.error().message.c_str()), 1;
  auto tok = tokenizer::load(dir + "/tok512.bin", ck->config().vocab_size);
  if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;
  model::transformer t(*ck, model::kernel_path::fast);
  const std::vector<std::vector<int32_t>> prompts = story_prompts(t, *tok, concurrency_max, prompt_tokens);
  print_header();

  (void)reference_tokens_per_second(t, *tok, prompts[0], new_tokens);
  std::vector<double> reference_rates;
  for (int i = 0; i < num_runs; i++) reference_rates.push_back(reference_tokens_per_second(t, *tok, prompts[0], new_tokens));
  const summary ref = summarize(reference_rates);
  std::printf("%-12s %7d %12.0f %10.0f %10.0f %8.2f %7s %11s %11s\n", "reference", 1, ref.median, ref.min,
              ref.max, 1.0, "-", "-", "-");

  // The engine on one thread, then with a kernel thread pool of every core (the reference
  // generator is single-stream by definition and stays on one thread).
  const int32_t cores = std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
  double ratio_1 = 0, ratio_64 = 0;
  for (int32_t threads : {1, cores}) {
    if (threads == 1 && cores == 1) continue;
    kernels::cpu::thread_pool pool(threads);
    for (int32_t concurrency : concurrencies) {
      if (concurrency > max_concurrency) continue;
    std::vector<double> rates;
    engine::engine_stats stats;
    int64_t num_preemptions = 0;
    for (int i = 0; i < num_runs; i++) {
      const engine_run r = engine_once(*ck, *tok, prompts, concurrency, threads > 1 ? &pool : nullptr);
      rates.push_back(r.tokens_per_second);
      stats = r.stats;
      num_preemptions += r.stats.num_preemptions;
    }
    const summary s = summarize(rates);
    const double ratio = s.median / ref.median;
    if (concurrency == 1 && threads == 1) ratio_1 = ratio;
    if (concurrency == 64) ratio_64 = std::max(ratio_64, ratio);
    std::printf("%-12d %7d %12.0f %10.0f %10.0f %8.2f %7lld %11lld %11lld\n", concurrency, threads, s.median,
                s.min, s.max, ratio, static_cast<long long>(stats.num_steps),
                static_cast<long long>(num_preemptions), static_cast<long long>(stats.num_prefix_hit_tokens));
    }
  }
  std::printf("\n(steps and prefix hits: last run; preemptions: all %d runs)\n", num_runs);
  std::printf("target 64 concurrent >= 4.00x reference: %.2fx %s\n", ratio_64, ratio_64 >= 4.0 ? "met" : "NOT met");
  std::printf("target  1 concurrent >= 0.90x reference: %.2fx %s\n", ratio_1, ratio_1 >= 0.9 ? "met" : "NOT met");
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
