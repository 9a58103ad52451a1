#include "apps/loadgen/dataset.hpp"

#include <charconv>
#include <cmath>

#include "sim/random.hpp"
#include "sim/workload.hpp"

namespace troupe::loadgen {
namespace {

/// Short words, most of them one token in common vocabularies (tok512's included).
constexpr std::string_view prompt_words[] = {"the", "a", "cat", "dog", "sun", "tree", "day", "big",
                                             "little", "girl", "boy", "ran", "saw", "happy", "park", "ball"};

constexpr uint64_t prompt_stream = 0x70726f6d7074ULL;     // "prompt"
constexpr uint64_t arrival_stream = 0x617272697661ULL;    // "arriva"

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool parse_count(std::string_view field, int32_t& out) {
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), out);
  return ec == std::errc() && end == field.data() + field.size() && out >= 1;
}

/// The trace a dataset name or path stands for.
expected<std::vector<sim::trace_request>> read_dataset(const dataset_options& o) {
  std::string path = o.name;
  if (o.name == "sharegpt") path = o.data_dir + "/traces/length_stats/sharegpt_8k_filtered_stats_llama2_tokenizer.csv";
  if (o.name == "azure") path = o.data_dir + "/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv";
  if (ends_with(path, ".jsonl")) return sim::read_trace(path, sim::trace_format::mooncake);
  if (!ends_with(path, ".csv"))
    return fail(errc::invalid_argument, "--dataset is random, sharegpt, azure or a .csv/.jsonl path, got '" + o.name + "'");
  auto text = sim::read_trace_text(path);
  if (!text) return tl::unexpected(text.error());
  if (text->rfind("num_prefill_tokens,num_decode_tokens", 0) == 0) return parse_sharegpt_lengths(*text, path);
  return sim::parse_trace(*text, sim::trace_format::azure, path);
}

/// Lengths of every request: fixed for `random`, else the dataset's first rows, clipped.
expected<std::vector<sim::trace_request>> lengths(const dataset_options& o) {
  if (o.name == "random") {
    if (o.random_input_len < 1 || o.random_output_len < 1)
      return fail(errc::invalid_argument, "--random-input-len and --random-output-len must be >= 1");
    sim::trace_request r;
    r.input_tokens = o.random_input_len;
    r.output_tokens = o.random_output_len;
    return std::vector<sim::trace_request>(static_cast<size_t>(o.num_prompts), r);
  }
  auto rows = read_dataset(o);
  if (!rows) return rows;
  if (rows->size() < static_cast<size_t>(o.num_prompts))
    return fail(errc::invalid_argument, "--num-prompts " + std::to_string(o.num_prompts) + " but dataset '" + o.name +
                                            "' has " + std::to_string(rows->size()) + " requests");
  sim::workload_options shape;
  shape.max_context = o.max_model_len;
  shape.max_requests = o.num_prompts;
  if (auto ok = sim::validate(shape); !ok) return fail(errc::invalid_argument, "--max-model-len must be 0 or >= 2");
  return sim::shape_workload(std::move(*rows), shape);
}

/// Arrival times: a burst at 0, or the simulator's Poisson arrivals.
expected<std::vector<int64_t>> arrivals(const dataset_options& o) {
  std::vector<int64_t> at(static_cast<size_t>(o.num_prompts), 0);
  if (std::isinf(o.request_rate) && o.request_rate > 0) return at;
  sim::synthetic_options poisson;
  poisson.num_requests = o.num_prompts;
  poisson.rate_per_s = o.request_rate;
  poisson.cv = 1.0;
  poisson.seed = sim::derive_seed(o.seed, arrival_stream);
  if (auto ok = sim::validate(poisson); !ok)
    return fail(errc::invalid_argument, "--request-rate must be inf or in [0.001, 1e9], got " + std::to_string(o.request_rate));
  const std::vector<sim::trace_request> drawn = sim::synthetic_workload(poisson);
  for (size_t i = 0; i < at.size(); i++) at[i] = drawn[i].arrival_ns;
  return at;
}

}  // namespace

std::string prompt_text(int32_t words, uint64_t seed, int32_t index) {
  TROUPE_ASSERT(words >= 1);
  sim::random_source rng(sim::derive_seed(sim::derive_seed(seed, prompt_stream), static_cast<uint64_t>(index)));
  std::string text;
  for (int32_t i = 0; i < words; i++) {
    if (i > 0) text += ' ';
    text += prompt_words[rng.uniform_below(std::size(prompt_words))];
  }
  return text;
}

expected<std::vector<sim::trace_request>> parse_sharegpt_lengths(std::string_view text, const std::string& path) {
  std::vector<sim::trace_request> out;
  int64_t line_number = 0;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (++line_number == 1 || line.empty()) continue;  // the header was checked by the caller
    const size_t comma = line.find(',');
    const size_t next = line.find(',', comma == std::string_view::npos ? line.size() : comma + 1);
    sim::trace_request r;
    if (comma == std::string_view::npos || !parse_count(line.substr(0, comma), r.input_tokens) ||
        !parse_count(line.substr(comma + 1, next - comma - 1), r.output_tokens))
      return fail(errc::malformed_file, path + ":" + std::to_string(line_number) +
                                            ": expected two token counts >= 1 (num_prefill_tokens,num_decode_tokens)");
    out.push_back(r);
  }
  if (out.empty()) return fail(errc::malformed_file, path + ": no requests");
  return out;
}

expected<std::vector<bench_request>> make_requests(const dataset_options& o) {
  if (o.num_prompts < 1) return fail(errc::invalid_argument, "--num-prompts must be >= 1");
  auto rows = lengths(o);
  if (!rows) return tl::unexpected(rows.error());
  auto at = arrivals(o);
  if (!at) return tl::unexpected(at.error());
  std::vector<bench_request> out;
  for (int32_t i = 0; i < o.num_prompts; i++) {
    const sim::trace_request& r = (*rows)[static_cast<size_t>(i)];
    out.push_back({i, prompt_text(r.input_tokens, o.seed, i), r.input_tokens, r.output_tokens, (*at)[static_cast<size_t>(i)]});
  }
  return out;
}

}  // namespace troupe::loadgen
