// bench_sampler: microseconds per sample of the sampler (issue 20, point 4), the pre-issue-20
// full-sort sampler and the current one side by side, at a 512 and a 32,000-token vocabulary.
//
// Logits: 64 rows of N(0, 3^2) values from a fixed std::mt19937 seed (a spread like a trained
// model's: at temperature 0.8 top-p 0.9 keeps tens to hundreds of tokens). Each configuration
// samples the rows round-robin with seeds 0, 1, ... at one position; one run = `samples` calls,
// timed as a whole; µs/sample = wall time / samples. Runs alternate between the two samplers
// after a warm-up each, so a drift in machine load hits both alike; the figures are medians of
// `runs` runs of wall time, and for the current sampler also of this thread's CPU time (what a
// sample costs when the core is not shared). The run also counts how many draws the two samplers
// agree on (both weigh by glibc's expf bits; they differ only where top-p's exact integer mass
// and the old double sum fall on different sides of the cut: rarely).
//
//   build/bench/bench_sampler [--runs 5] [--samples 2000]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/figures.hpp"
#include "runtime/sampling/random_stream.hpp"
#include "runtime/sampling/sampler.hpp"

namespace troupe::bench {
namespace {

using sampling::sampling_params;

/// The sampler before issue 20 (runtime/sampling/sampler.cpp at ec9e51f), reduced to what the
/// bench's parameters use (no bias, penalties or top logprobs): glibc's expf, a full sort of the
/// top-k survivors for top-p with a double mass, a CDF over the whole vocabulary, the logprob
/// normalizer by glibc's double exp. Kept here as the baseline only.
class full_sort_sampler {
 public:
  sampling::sample_result sample(const float* logits, int32_t vocab, const sampling_params& params, uint64_t seed,
                                 int64_t position) {
    sampling::random_stream stream(seed, position, sampling::stream_sample);
    const float temperature = std::max(params.temperature, sampling::temperature_min);
    const float logit_max = *std::max_element(logits, logits + vocab);
    exps_.resize(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) exps_[i] = std::exp((logits[i] - logit_max) / temperature);
    const int32_t token = draw(select_top(logits, vocab, params), vocab, params.min_p, stream);
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - logit_max);
    return {token, static_cast<float>(logits[token] - (logit_max + std::log(sum))), {}};
  }

 private:
  int32_t select_top(const float* logits, int32_t vocab, const sampling_params& params) {
    order_.resize(static_cast<size_t>(vocab));
    std::iota(order_.begin(), order_.end(), 0);
    const auto ranks = [logits](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    int32_t num = vocab;
    if (params.top_k > 0 && params.top_k < vocab) {
      std::nth_element(order_.begin(), order_.begin() + params.top_k, order_.end(), ranks);
      num = params.top_k;
    }
    if (params.top_p >= 1.0f) return num;
    std::sort(order_.begin(), order_.begin() + num, ranks);
    double mass = 0.0;
    for (int32_t i = 0; i < num; ++i) mass += exps_[order_[i]];
    const double target = static_cast<double>(params.top_p) * mass;
    double cumulative = 0.0;
    int32_t kept = 0;
    while (kept < num) {
      cumulative += exps_[order_[kept++]];
      if (cumulative >= target) break;
    }
    return kept;
  }

  int32_t draw(int32_t num, int32_t vocab, float min_p, sampling::random_stream& stream) {
    chosen_.assign(static_cast<size_t>(vocab), 0);
    for (int32_t i = 0; i < num; ++i) chosen_[order_[i]] = 1;
    const auto weight = [&](int32_t id) -> uint64_t {
      if (chosen_[id] == 0 || exps_[id] < min_p) return 0;
      return static_cast<uint64_t>(static_cast<double>(exps_[id]) * 4294967296.0);
    };
    uint64_t total = 0;
    for (int32_t id = 0; id < vocab; ++id) total += weight(id);
    const uint64_t target = stream.uniform_below(total);
    uint64_t cumulative = 0;
    for (int32_t id = 0; id < vocab; ++id) {
      cumulative += weight(id);
      if (target < cumulative) return id;
    }
    return -1;
  }

  std::vector<float> exps_;
  std::vector<int32_t> order_;
  std::vector<uint8_t> chosen_;
};

struct configuration {
  const char* name;
  int32_t vocab;
  sampling_params params;
  double target_us;  // issue 20's target for the current sampler
};

std::vector<std::vector<float>> make_rows(int32_t vocab) {
  std::mt19937 rng(20);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<std::vector<float>> rows(64, std::vector<float>(static_cast<size_t>(vocab)));
  for (auto& row : rows)
    for (float& l : row) l = logit(rng);
  return rows;
}

/// Seconds of CPU time this thread has used: on a shared machine, wall time also counts the
/// time other processes held the core.
double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct timing {
  double wall_us;  // per sample
  double cpu_us;   // per sample
};

/// Wall and CPU µs per sample of `samples` calls of `sample_one(row, seed)`.
template <class F>
timing time_per_sample(int samples, F&& sample_one) {
  const double start = now_seconds(), cpu_start = thread_cpu_seconds();
  for (int s = 0; s < samples; ++s) sample_one(s % 64, static_cast<uint64_t>(s));
  return {(now_seconds() - start) * 1e6 / samples, (thread_cpu_seconds() - cpu_start) * 1e6 / samples};
}

void run_configuration(const configuration& c, int runs, int samples) {
  const auto rows = make_rows(c.vocab);
  full_sort_sampler old_sampler;
  sampling::sampler new_sampler;
  std::vector<int32_t> old_tokens(static_cast<size_t>(samples)), new_tokens(static_cast<size_t>(samples));
  const auto run_old = [&](int row, uint64_t seed) {
    old_tokens[seed] = old_sampler.sample(rows[row].data(), c.vocab, c.params, seed, 7).token;
  };
  const auto run_new = [&](int row, uint64_t seed) {
    new_tokens[seed] = new_sampler.sample(rows[row].data(), c.vocab, c.params, seed, 7).token;
  };
  (void)time_per_sample(samples, run_old);
  (void)time_per_sample(samples, run_new);
  std::vector<double> old_us, new_us, new_cpu_us;
  for (int r = 0; r < runs; ++r) {
    old_us.push_back(time_per_sample(samples, run_old).wall_us);
    const timing t = time_per_sample(samples, run_new);
    new_us.push_back(t.wall_us);
    new_cpu_us.push_back(t.cpu_us);
  }
  int agree = 0;
  for (int s = 0; s < samples; ++s) agree += old_tokens[s] == new_tokens[s] ? 1 : 0;
  const summary o = summarize(old_us), n = summarize(new_us), cpu = summarize(new_cpu_us);
  std::printf("%-26s %6d %10.2f %10.2f %7.1fx %8.0f  %-4s %10.2f  %d/%d\n", c.name, c.vocab, o.median, n.median,
              o.median / n.median, c.target_us, n.median <= c.target_us ? "met" : "MISS", cpu.median, agree, samples);
}

int run(int argc, char** argv) {
  int runs = 5, samples = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (arg == "--samples" && i + 1 < argc) {
      samples = std::atoi(argv[++i]);
    } else {
      return std::fprintf(stderr, "usage: bench_sampler [--runs N (odd)] [--samples N]\n"), 2;
    }
  }
  if (runs < 1 || runs % 2 == 0 || samples < 64)
    return std::fprintf(stderr, "--runs must be odd and >= 1, --samples >= 64\n"), 2;
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  std::printf("µs per sample, medians of %d runs of %d samples; logits N(0, 3^2); no logprobs requested\n\n", runs,
              samples);
  std::printf("%-26s %6s %10s %10s %8s %8s  %-4s %10s  %s\n", "parameters", "vocab", "full sort", "current",
              "speedup", "target", "", "cpu µs", "same token");
  sampling_params plain;
  sampling_params top_p;
  top_p.temperature = 0.8f;
  top_p.top_p = 0.9f;
  sampling_params top_k_p;
  top_k_p.temperature = 0.8f;
  top_k_p.top_k = 40;
  top_k_p.top_p = 0.95f;
  for (int32_t vocab : {512, 32000}) {
    const double target = vocab == 512 ? 10.0 : 100.0;
    run_configuration({"T 0.8, top-p 0.9", vocab, top_p, target}, runs, samples);
    run_configuration({"T 0.8, top-k 40, top-p .95", vocab, top_k_p, target}, runs, samples);
    run_configuration({"T 1 (no filter)", vocab, plain, target}, runs, samples);
  }
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
