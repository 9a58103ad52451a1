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
/// - max_output_tokens_per_s: the most chunks of successful requests that arrived within one
///   whole second counted from the earliest successful start (vLLM's one-second buckets).
/// - max_concurrent_requests: the most successful requests in flight at once, each over
///   [start, last chunk) (vLLM's sweep; an end and a start at the same time do not overlap).
/// Each metric is summarized by mean, median, std (population) and percentiles with numpy's
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

/// Which metrics the result reports percentiles of, and which percentiles
/// (--percentile-metrics, --metric-percentiles).
struct report_options {
  std::vector<std::string> metrics{"ttft", "tpot", "itl", "e2el"};  ///< of ttft, tpot, itl, e2el
  std::vector<double> percentiles{99};                              ///< each in [0, 100]
};

/// "ttft,tpot,itl,e2el" (any non-empty subset, comma-separated, no repeats) and "50,90,99"
/// (numbers in [0, 100]); anything else is invalid_argument naming the flag.
[[nodiscard]] expected<report_options> parse_report_options(const std::string& metrics, const std::string& percentiles);

struct bench_metrics {
  int32_t completed = 0;
  int32_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double duration_s = 0;
  double request_throughput = 0;
  std::optional<double> request_goodput;  ///< only with SLOs
  double output_throughput = 0;
  double total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  int32_t max_concurrent_requests = 0;
  stats::summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::vector<double> ttfts_ms, tpots_ms, itls_ms, e2els_ms;  ///< the samples summarized
  std::vector<int32_t> output_lens;  ///< per request; 0 for a failed one
};

/// The metrics of `outcomes` over a benchmark of `duration_ns` (> 0).
[[nodiscard]] bench_metrics compute_metrics(const std::vector<request_outcome>& outcomes, int64_t duration_ns,
                                            const goodput_slos& slos);

/// What the run was, for the result file's header keys.
struct run_description {
  std::string date;        ///< YYYYMMDD-HHMMSS, as vLLM's file names
  std::string backend = "openai";
  std::string label;       ///< "" = null
  std::string model_id;
  std::string dataset;
  int32_t num_prompts = 0;
  double request_rate = 0;  ///< infinity = "inf"
  double burstiness = 1.0;
  std::optional<int32_t> max_concurrency;
};

/// The `--save-result` JSON: vLLM's keys (date, endpoint_type, backend, label, model_id,
/// tokenizer_id, num_prompts, request_rate, burstiness, max_concurrency, duration, completed,
/// failed, total_input_tokens, total_output_tokens, request_throughput, request_goodput,
/// output_throughput, total_token_throughput, input_lens, output_lens, ttfts (s), itls (s),
/// latencies (s), start_times (s after the run's start), generated_texts, errors,
/// max_output_tokens_per_s, max_concurrent_requests, then mean_/median_/std_ and p<P>_ (P as
/// vLLM writes it: "99", "99.9") of each reported metric in ms) plus troupe's `dataset`, one
/// per line, numbers as JSON doubles (shortest round trip).
[[nodiscard]] std::string result_json(const run_description& run, const std::vector<request_outcome>& outcomes,
                                      const bench_metrics& m, const report_options& report);

/// vLLM's default result file name: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json, LABEL the
/// label or the backend, RATE as Python prints a float ("inf", "20.0"), MODEL the model id's last
/// '/' part.
[[nodiscard]] std::string result_file_name(const run_description& run);

/// The summary table vLLM prints ("============ Serving Benchmark Result ============" ...).
[[nodiscard]] std::string result_table(const run_description& run, const bench_metrics& m, const report_options& report);

}  // namespace troupe::loadgen
