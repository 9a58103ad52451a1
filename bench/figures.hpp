#pragma once

// Shared by the bench_* programs: the wall clock (benchmarks are the one place it is read
// outside apps/), a median/min/max summary and the echoed command line.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/common/stats.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {

/// Seconds since an arbitrary fixed point of the steady clock.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Reads a bench's command line: calls `take(argument, next)` for each argument, where `next()`
/// consumes and returns the argument after it ("0" when there is none). An argument `take` does
/// not know (it returns false) ends the program with exit code 2, naming it.
template <class Take>
void parse_arguments(int argc, char** argv, Take take) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (!take(a, next)) {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
}

/// `count` distinct prompts of `length` tokens: [BOS] + a window of the model's greedy story from
/// BOS, window i at offset i.
inline std::vector<std::vector<int32_t>> story_prompts(model::transformer& t, const tokenizer& tok, int32_t count,
                                                       int32_t length) {
  generate::generate_params p;
  p.prompt = {tokenizer::bos};
  p.max_new_tokens = count + length - 1;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  auto story = generate::generate(t, tok, p);
  TROUPE_ASSERT_MSG(story.has_value(), "the story request is valid");
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < count; i++) {
    std::vector<int32_t> prompt{tokenizer::bos};
    prompt.insert(prompt.end(), story->tokens.begin() + i, story->tokens.begin() + i + length - 1);
    TROUPE_ASSERT(static_cast<int32_t>(prompt.size()) == length);
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

/// Median, min and max of a handful of samples.
struct summary {
  double median = 0;
  double min = 0;
  double max = 0;
};

/// Summarizes an odd, non-empty number of samples (so the median is one of them).
inline summary summarize(std::vector<double> samples) {
  TROUPE_ASSERT(!samples.empty());
  TROUPE_ASSERT(samples.size() % 2 == 1);
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), samples.back()};
}

/// Generated tokens per second of one greedy reference-generator call of `new_tokens` tokens
/// after `prompt` (EOS ignored, so every call does the same work).
inline double reference_tokens_per_second(model::transformer& t, const tokenizer& tok,
                                          const std::vector<int32_t>& prompt, int32_t new_tokens) {
  generate::generate_params p;
  p.prompt = prompt;
  p.max_new_tokens = new_tokens;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  const double start = now_seconds();
  auto out = generate::generate(t, tok, p);
  const double seconds = now_seconds() - start;
  TROUPE_ASSERT_MSG(out.has_value(), "the benchmark request is valid");
  TROUPE_ASSERT(static_cast<int32_t>(out->tokens.size()) == new_tokens);
  return new_tokens / seconds;
}

using stats::percentile;  // numpy's definition, shared with the simulator and `bench serve`

inline double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

/// One line: mean, p50, p90, p99 of latencies in ms.
inline void print_metric(const char* name, const std::vector<double>& ms) {
  std::printf("  %-5s mean %8.2f  p50 %8.2f  p90 %8.2f  p99 %8.2f  ms\n", name, mean(ms), percentile(ms, 50),
              percentile(ms, 90), percentile(ms, 99));
}

/// argv joined by spaces, to print at the top of the output.
inline std::string command_line(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; i++) line += (i ? " " : "") + std::string(argv[i]);
  return line;
}

}  // namespace troupe::bench
