#pragma once

/// What `troupe bench serve` sends: one prompt per request, its lengths and when it is sent.
///
/// A dataset gives lengths only (no text): `random` (every request random_input_len words in,
/// random_output_len tokens out, vLLM's random dataset with range ratio 0), `sharegpt` (the
/// ShareGPT length statistics in DATA/traces/length_stats), `azure` (DATA/traces/azure_llm_2023,
/// the conversation trace), or a path (`.jsonl`: Mooncake; `.csv`: the ShareGPT statistics if its
/// header starts with num_prefill_tokens, else Azure 2023). A trace's rows are taken in order, the
/// first num_prompts of them, clipped to max_model_len as the simulator clips them
/// (sim::shape_workload). Its timestamps are not used: like vLLM's `bench serve`, arrivals come
/// from request_rate alone.
///
/// Prompt text: the server counts tokens with its own tokenizer, so a prompt is `input` words
/// drawn from a fixed list of short English words, by (seed, request index). Arrivals: with a
/// finite rate, Poisson (the simulator's synthetic arrivals, cv 1, seeded from the run seed);
/// with an infinite one, every request at 0 (a burst).

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "sim/trace.hpp"

namespace troupe::loadgen {

struct bench_request {
  int32_t index = 0;
  std::string prompt;      ///< prompt_len words
  int32_t prompt_len = 0;  ///< the dataset's input length (words here; the server may count other tokens)
  int32_t output_len = 0;  ///< max_tokens of the request
  int64_t arrival_ns = 0;  ///< when to send it, after the benchmark's start
};

struct dataset_options {
  std::string name = "random";  ///< random | sharegpt | azure | a path
  std::string data_dir;         ///< the shared data directory, holding traces/
  int32_t num_prompts = 1000;   ///< >= 1
  int32_t random_input_len = 1024;
  int32_t random_output_len = 128;
  int32_t max_model_len = 0;    ///< clip input + output of trace requests to this; 0 = no clip
  double request_rate = std::numeric_limits<double>::infinity();  ///< arrivals per second; infinity = a burst
  uint64_t seed = 0;
};

/// The requests of a run, in order of arrival. Bad options (invalid_argument, naming the flag),
/// a missing file (io_error) or a malformed one (malformed_file) are errors; so is a trace with
/// fewer than num_prompts rows.
[[nodiscard]] expected<std::vector<bench_request>> make_requests(const dataset_options& options);

/// `words` words (>= 1) separated by single spaces, a pure function of (words, seed, index).
[[nodiscard]] std::string prompt_text(int32_t words, uint64_t seed, int32_t index);

/// The ShareGPT length statistics (a header starting `num_prefill_tokens,num_decode_tokens`,
/// then one row per conversation turn) as trace requests arriving at 0; `path` names the
/// source in error messages ("PATH:LINE: what is wrong").
[[nodiscard]] expected<std::vector<sim::trace_request>> parse_sharegpt_lengths(std::string_view text,
                                                                                const std::string& path);

}  // namespace troupe::loadgen
