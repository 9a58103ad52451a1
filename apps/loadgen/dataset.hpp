#pragma once

/// What `troupe bench serve` sends: one prompt per request, its lengths and when it is sent.
///
/// Datasets (`--dataset-name`, vLLM's names where vLLM has them):
/// - `random`: random_input_len prompt words and random_output_len max_tokens per request, each
///   drawn uniformly from [floor(X (1 - r)), floor(X (1 + r))] with r = random_range_ratio
///   (vLLM's rule; r = 0: every request the same), output at least 1.
/// - `sharegpt`: the ShareGPT length statistics (`--dataset-path` a .csv, default
///   DATA/traces/length_stats/...), or vLLM's ShareGPT JSON (`--dataset-path` a .json: a list of
///   {"conversations": [{"value": prompt}, {"value": reply}, ...]}; the prompt is the first
///   turn's text, max_tokens the reply's words or sharegpt_output_len).
/// - `custom`: vLLM's custom dataset, a JSONL file (`--dataset-path`) with {"prompt": TEXT} per
///   line; max_tokens custom_output_len.
/// - `azure`: the Azure 2023 conversation trace (default DATA/traces/azure_llm_2023/...).
/// - `mooncake`: a Mooncake trace (`--dataset-path`, JSONL).
/// A trace's rows are taken in order, the first num_prompts of them, clipped to max_model_len as
/// the simulator clips them (sim::shape_workload). Its timestamps are not used: like vLLM's
/// `bench serve`, arrivals come from request_rate and burstiness alone.
///
/// Prompt text of the length-only datasets (random, ShareGPT statistics, azure, mooncake): input
/// words drawn from a fixed list of short English words, by (seed, request index); fit_prompt
/// makes them exactly input tokens of the server's tokenizer. Arrivals: with a finite rate, gaps
/// Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) (vLLM's; burstiness 1 = Poisson),
/// the simulator's arrival process seeded from the run seed; with an infinite one, every request
/// at 0 (a burst).

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "sim/trace.hpp"

namespace troupe::loadgen {

struct bench_request {
  int32_t index = 0;
  std::string prompt;      ///< prompt_len words, or the dataset's text
  int32_t prompt_len = 0;  ///< the dataset's input length (words here; fit_prompt makes them tokens)
  int32_t output_len = 0;  ///< max_tokens of the request
  int64_t arrival_ns = 0;  ///< when to send it, after the benchmark's start
  bool words = true;       ///< the prompt is prompt_text(prompt_len, ...) (fit_prompt may refit it)
};

struct dataset_options {
  std::string name = "random";  ///< random | sharegpt | custom | azure | mooncake
  std::string path;             ///< --dataset-path: the file (for sharegpt and azure, instead of data_dir's)
  std::string data_dir;         ///< the shared data directory, holding traces/
  int32_t num_prompts = 1000;   ///< >= 1
  int32_t random_input_len = 1024;
  int32_t random_output_len = 128;
  double random_range_ratio = 0;  ///< [0, 1)
  int32_t custom_output_len = 256;
  int32_t sharegpt_output_len = 0;  ///< 0 = the reply's words
  int32_t max_model_len = 0;    ///< clip input + output of trace requests to this; 0 = no clip
  double request_rate = std::numeric_limits<double>::infinity();  ///< arrivals per second; infinity = a burst
  double burstiness = 1.0;      ///< the gaps' gamma shape, [0.01, 10000]
  uint64_t seed = 0;
};

/// The requests of a run, in order of arrival. Bad options (invalid_argument, naming the flag),
/// a missing file (io_error) or a malformed one (malformed_file, "PATH:LINE: what") are errors;
/// so is a dataset with fewer than num_prompts rows.
[[nodiscard]] expected<std::vector<bench_request>> make_requests(const dataset_options& options);

/// `words` words (>= 1) separated by single spaces, a pure function of (words, seed, index);
/// prompt_text(n, s, i) is a prefix of prompt_text(n + 1, s, i).
[[nodiscard]] std::string prompt_text(int32_t words, uint64_t seed, int32_t index);

/// The ShareGPT length statistics (a header starting `num_prefill_tokens,num_decode_tokens`,
/// then one row per conversation turn) as trace requests arriving at 0; `path` names the
/// source in error messages ("PATH:LINE: what is wrong").
[[nodiscard]] expected<std::vector<sim::trace_request>> parse_sharegpt_lengths(std::string_view text,
                                                                                const std::string& path);

/// One prompt of a text dataset and its max_tokens.
struct text_prompt {
  std::string prompt;
  int32_t output_len = 0;
};

/// vLLM's custom dataset: one JSON object per non-empty line with a string "prompt" (valid
/// UTF-8, non-empty); every request's max_tokens is `output_len`. A line that is not such an
/// object is malformed_file "PATH:LINE: ...".
[[nodiscard]] expected<std::vector<text_prompt>> parse_custom(std::string_view text, const std::string& path,
                                                              int32_t output_len);

/// vLLM's ShareGPT JSON: conversations with at least two turns; the prompt is the first turn's
/// "value", max_tokens `output_len` or (0) the second turn's words. Shorter conversations are
/// skipped, as vLLM skips them; anything else not of that shape is malformed_file.
[[nodiscard]] expected<std::vector<text_prompt>> parse_sharegpt_json(std::string_view text, const std::string& path,
                                                                     int32_t output_len);

/// How many tokens the server makes of a prompt (its /tokenize), or why it cannot say.
using token_counter = std::function<expected<int32_t>(const std::string& prompt)>;

/// A words prompt of exactly `tokens` of the server's tokens, if one is found: the number of
/// words w of prompt_text(w) is moved by the difference, within the bounds seen, until the count
/// is `tokens` (at most 12 counts); else the longest prompt found below `tokens` padded with " a"
/// words if that makes it exact; else that prompt (or one word if none is below). Returns the
/// prompt and its count; an error of `count` is returned as is.
struct fitted_prompt {
  std::string prompt;
  int32_t tokens = 0;
};
[[nodiscard]] expected<fitted_prompt> fit_prompt(int32_t tokens, uint64_t seed, int32_t index, const token_counter& count);

/// fit_prompt of every words request (bench_request::words) to its prompt_len; prompt_len
/// becomes the fitted count. The first error of `count` is returned with the requests unchanged.
[[nodiscard]] expected<void> fit_prompts(std::vector<bench_request>& requests, uint64_t seed, const token_counter& count);

}  // namespace troupe::loadgen
