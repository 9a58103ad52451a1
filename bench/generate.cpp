// bench_generate: single-stream throughput of the reference generator on stories260K, with the
// fast and the reference kernel paths side by side.
//
// One run = one call of generate::generate() with prompt [BOS], max_new_tokens 511, greedy
// (temperature 0: the full sampler pipeline, no argmax shortcut), ignore_eos: 511 forward passes
// of one token each (positions 0..510; the 512-token context is then full), 511 samples and
// the streaming detokenizer. tok/s = 511 / wall time of the call (it includes allocating the
// 32-block KV cache, which is negligible). Runs alternate between the paths after one warm-up
// each, so a drift in machine load hits both alike.

#include <cstdio>
#include <vector>

#include "bench/figures.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

constexpr int32_t num_new_tokens = 511;
constexpr int num_runs = 5;

double run_once(model::transformer& t, const tokenizer& tok) {
  return reference_tokens_per_second(t, tok, {tokenizer::bos}, num_new_tokens);
}

void print_row(const char* name, const summary& s) {
  std::printf("%-10s %5d %14.0f %10.0f %10.0f\n", name, num_runs, s.median, s.min, s.max);
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const std::string dir = TROUPE_MODELS_DIR;
  auto ck = model::checkpoint::load(dir + "/stories260K.bin");
  if (!ck) return std::fprintf(stderr, "%s\n", ck.error().message.c_str()), 1;
  auto tok = tokenizer::load(dir + "/tok512.bin", ck->config().vocab_size);
  if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;

  model::transformer fast(*ck, model::kernel_path::fast);
  model::transformer reference(*ck, model::kernel_path::reference);
  (void)run_once(fast, *tok);
  (void)run_once(reference, *tok);
  std::vector<double> fast_rates, reference_rates;
  for (int i = 0; i < num_runs; i++) {
    fast_rates.push_back(run_once(fast, *tok));
    reference_rates.push_back(run_once(reference, *tok));
  }
  const summary f = summarize(fast_rates);
  const summary r = summarize(reference_rates);

  std::printf("reference generator, single stream, stories260K: prompt [BOS], %d new tokens,\n", num_new_tokens);
  std::printf("greedy (temperature 0), ignore_eos; tok/s = %d / wall time of generate()\n\n", num_new_tokens);
  std::printf("%-10s %5s %14s %10s %10s\n", "kernels", "runs", "median tok/s", "min", "max");
  print_row("fast", f);
  print_row("reference", r);
  std::printf("\nfast / reference (medians): %.2fx\n", f.median / r.median);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
