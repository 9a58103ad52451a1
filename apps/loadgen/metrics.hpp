#pragma once

/// The figures of vLLM's `bench serve` (vllm/benchmarks/serve.py, `calculate_metrics` and its
/// result JSON), computed from measured outcomes alone: no clock, no socket.
///
/// Definitions, per successful request (times in ms in the summaries):
/// - TTFT: first chunk - start. E2EL: last chunk - start.
/// - TPOT: (E2EL - TTFT) / (output tokens - 1), only for requests with more than one output
///   token (the first token excluded); for goodput a request with one token has TPOT 0.
/// - ITL: every gap between consecutive chunks, pooled over all requests.
/// - output tokens: usage.completion_tokens when the server reports it, else the number of
///   chunks (vLLM tokenizes the text instead; troupe's client has no tokenizer of the server).
/// - throughputs: completed requests, output tokens, input + output tokens per second of the
///   benchmark's duration; a failed request counts 0 output tokens and no input tokens.
/// - goodput: requests/s meeting every given SLO (metric <= bound), null without SLOs.
/// Each metric is summarized by mean, median, std (population), p90, p99 with numpy's
/// definitions (runtime/common/stats.hpp); no values summarize as [0], as vLLM's `x or 0`.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/loadgen/stream.hpp"
#include "runtime/common/error.hpp"
#include "runtime/common/stats.hpp"

namespace troupe::loadgen {

/// SLO bounds in ms for goodput (`--goodput ttft:500 tpot:50 e2el:2000`).
struct goodput_slos {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  [[nodiscard]] bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

/// Parses `KEY:MS` pairs, KEY in ttft, tpot, e2el and MS a number >= 0; anything else is an
/// invalid_argument naming the pair.
[[nodiscard]] expected<goodput_slos> parse_goodput(const std::vector<std::string>& pairs);

struct bench_metrics {
  int32_t completed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double duration_s = 0;
  double request_throughput = 0;
  std::optional<double> request_goodput;  ///< only with SLOs
  double output_throughput = 0;
  double total_token_throughput = 0;
  stats::summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::vector<int32_t> output_lens;  ///< per request; 0 for a failed one
};

/// The metrics of `outcomes` over a benchmark of `duration_ns` (> 0).
[[nodiscard]] bench_metrics compute_metrics(const std::vector<request_outcome>& outcomes, int64_t duration_ns,
                                            const goodput_slos& slos);

/// What the run was, for the result file's header keys.
struct run_description {
  std::string date;        ///< YYYYMMDD-HHMMSS, as vLLM's file names
  std::string backend = "openai";
  std::string model_id;
  std::string dataset;
  int32_t num_prompts = 0;
  double request_rate = 0;  ///< infinity = "inf"
  std::optional<int32_t> max_concurrency;
};

/// The `--save-result` JSON: vLLM's keys (date, backend, model_id, tokenizer_id, num_prompts,
/// request_rate, burstiness, max_concurrency, duration, completed, total_input_tokens,
/// total_output_tokens, request_throughput, request_goodput, output_throughput,
/// total_token_throughput, input_lens, output_lens, ttfts (s), itls (s), generated_texts, errors,
/// then mean_/median_/std_/p90_/p99_ of ttft, tpot, itl, e2el in ms), one per line, numbers as
/// JSON doubles (shortest round trip).
[[nodiscard]] std::string result_json(const run_description& run, const std::vector<request_outcome>& outcomes,
                                      const bench_metrics& m);

/// The summary table vLLM prints ("============ Serving Benchmark Result ============" ...).
[[nodiscard]] std::string result_table(const bench_metrics& m);

}  // namespace troupe::loadgen
