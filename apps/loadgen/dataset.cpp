#include "apps/loadgen/dataset.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <nlohmann/json.hpp>

#include "sim/random.hpp"
#include "sim/workload.hpp"

namespace troupe::loadgen {
namespace {

/// Short words, most of them one token in common vocabularies (tok512's included).
constexpr std::string_view prompt_words[] = {"the", "a", "cat", "dog", "sun", "tree", "day", "big",
                                             "little", "girl", "boy", "ran", "saw", "happy", "park", "ball"};

constexpr uint64_t prompt_stream = 0x70726f6d7074ULL;     // "prompt"
constexpr uint64_t arrival_stream = 0x617272697661ULL;    // "arriva"
constexpr uint64_t length_stream = 0x6c656e677468ULL;     // "length"

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_text_dataset(const dataset_options& o) {
  return o.name == "custom" || (o.name == "sharegpt" && ends_with(o.path, ".json"));
}

int32_t count_words(const std::string& text) {
  int32_t words = 0;
  bool in_word = false;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    words += !space && !in_word;
    in_word = !space;
  }
  return words;
}

/// A dataset's prompt: a non-empty string (JSON's parser has checked its UTF-8), or why not.
expected<std::string> prompt_string(const nlohmann::json& value, const std::string& where) {
  if (!value.is_string() || value.get_ref<const std::string&>().empty())
    return fail(errc::malformed_file, where + ": expected a non-empty string");
  return value.get<std::string>();
}

bool parse_count(std::string_view field, int32_t& out) {
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), out);
  return ec == std::errc() && end == field.data() + field.size() && out >= 1;
}

/// The trace file of a length-only dataset: --dataset-path, else the shared data's.
expected<std::string> trace_path(const dataset_options& o) {
  if (!o.path.empty()) return o.path;
  if (o.name == "sharegpt") return o.data_dir + "/traces/length_stats/sharegpt_8k_filtered_stats_llama2_tokenizer.csv";
  if (o.name == "azure") return o.data_dir + "/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv";
  return fail(errc::invalid_argument, "--dataset-name " + o.name + " needs --dataset-path");
}

/// The rows of a length-only dataset (sharegpt statistics, azure, mooncake).
expected<std::vector<sim::trace_request>> read_trace_dataset(const dataset_options& o) {
  auto path = trace_path(o);
  if (!path) return tl::unexpected(path.error());
  if (o.name == "mooncake") return sim::read_trace(*path, sim::trace_format::mooncake);
  auto text = sim::read_trace_text(*path);
  if (!text) return tl::unexpected(text.error());
  if (o.name == "sharegpt") {
    if (text->rfind("num_prefill_tokens,num_decode_tokens", 0) != 0)
      return fail(errc::malformed_file, *path + ": ShareGPT length statistics start with num_prefill_tokens,num_decode_tokens");
    return parse_sharegpt_lengths(*text, *path);
  }
  return sim::parse_trace(*text, sim::trace_format::azure, *path);
}

/// random's lengths: X drawn from [floor(X (1 - r)), floor(X (1 + r))], output at least 1.
expected<std::vector<sim::trace_request>> random_lengths(const dataset_options& o) {
  if (o.random_input_len < 1 || o.random_output_len < 1)
    return fail(errc::invalid_argument, "--random-input-len and --random-output-len must be >= 1");
  if (!(o.random_range_ratio >= 0 && o.random_range_ratio < 1))
    return fail(errc::invalid_argument, "--random-range-ratio must be in [0, 1)");
  sim::random_source rng(sim::derive_seed(o.seed, length_stream));
  const auto draw = [&](int32_t x) {
    const auto low = static_cast<int64_t>(x * (1 - o.random_range_ratio));
    const auto high = static_cast<int64_t>(x * (1 + o.random_range_ratio));
    const int64_t v = low + static_cast<int64_t>(rng.uniform_below(static_cast<uint64_t>(high - low + 1)));
    return static_cast<int32_t>(std::max<int64_t>(v, 1));
  };
  std::vector<sim::trace_request> out(static_cast<size_t>(o.num_prompts));
  for (sim::trace_request& r : out) {
    r.input_tokens = draw(o.random_input_len);
    r.output_tokens = draw(o.random_output_len);
  }
  return out;
}

/// Lengths of every request: random's, else the trace's first rows, clipped.
expected<std::vector<sim::trace_request>> lengths(const dataset_options& o) {
  if (o.name == "random") return random_lengths(o);
  auto rows = read_trace_dataset(o);
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

/// Arrival times: a burst at 0, or the simulator's gamma arrivals (shape = burstiness: its
/// coefficient of variation is 1 / sqrt(burstiness)).
expected<std::vector<int64_t>> arrivals(const dataset_options& o) {
  std::vector<int64_t> at(static_cast<size_t>(o.num_prompts), 0);
  if (!(o.burstiness >= 0.01 && o.burstiness <= 10000))
    return fail(errc::invalid_argument, "--burstiness must be in [0.01, 10000], got " + std::to_string(o.burstiness));
  if (std::isinf(o.request_rate) && o.request_rate > 0) return at;
  sim::synthetic_options poisson;
  poisson.num_requests = o.num_prompts;
  poisson.rate_per_s = o.request_rate;
  poisson.cv = o.burstiness == 1 ? 1.0 : 1 / std::sqrt(o.burstiness);
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

expected<std::vector<text_prompt>> parse_custom(std::string_view text, const std::string& path, int32_t output_len) {
  std::vector<text_prompt> out;
  int64_t line_number = 0;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const std::string where = path + ":" + std::to_string(++line_number);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains("prompt"))
      return fail(errc::malformed_file, where + ": expected a JSON object with a \"prompt\"");
    auto prompt = prompt_string(row["prompt"], where + ": \"prompt\"");
    if (!prompt) return tl::unexpected(prompt.error());
    out.push_back({std::move(*prompt), output_len});
  }
  if (out.empty()) return fail(errc::malformed_file, path + ": no prompts");
  return out;
}

expected<std::vector<text_prompt>> parse_sharegpt_json(std::string_view text, const std::string& path, int32_t output_len) {
  const nlohmann::json all = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!all.is_array()) return fail(errc::malformed_file, path + ": expected a JSON array of conversations");
  std::vector<text_prompt> out;
  for (size_t i = 0; i < all.size(); i++) {
    const std::string where = path + ": conversation " + std::to_string(i);
    const nlohmann::json& c = all[i];
    if (!c.is_object() || !c.contains("conversations") || !c["conversations"].is_array())
      return fail(errc::malformed_file, where + ": expected an object with a \"conversations\" array");
    const nlohmann::json& turns = c["conversations"];
    if (turns.size() < 2) continue;  // vLLM skips these
    for (size_t t = 0; t < 2; t++)
      if (!turns[t].is_object() || !turns[t].contains("value"))
        return fail(errc::malformed_file, where + ", turn " + std::to_string(t) + ": expected an object with a \"value\"");
    auto prompt = prompt_string(turns[0]["value"], where + ", turn 0");
    auto reply = prompt_string(turns[1]["value"], where + ", turn 1");
    if (!prompt) return tl::unexpected(prompt.error());
    if (!reply) return tl::unexpected(reply.error());
    out.push_back({std::move(*prompt), output_len > 0 ? output_len : std::max(count_words(*reply), 1)});
  }
  if (out.empty()) return fail(errc::malformed_file, path + ": no conversation with two turns");
  return out;
}

expected<fitted_prompt> fit_prompt(int32_t tokens, uint64_t seed, int32_t index, const token_counter& count) {
  TROUPE_ASSERT(tokens >= 1);
  fitted_prompt best;  // the longest with fewer than `tokens`
  int32_t lo = 0, hi = std::numeric_limits<int32_t>::max();  // words known to give fewer / more
  for (int32_t words = tokens, round = 0; round < 12 && hi - lo > 1; round++) {
    std::string prompt = prompt_text(words, seed, index);
    auto n = count(prompt);
    if (!n) return tl::unexpected(n.error());
    if (*n == tokens) return fitted_prompt{std::move(prompt), *n};
    if (*n < tokens) lo = words, best = {std::move(prompt), *n};
    if (*n > tokens) hi = words;
    words = std::clamp(words + tokens - *n, lo + 1, std::max(lo + 1, hi - 1));
  }
  // The prefixes skip `tokens` (a word of several tokens): pad with "a", one token almost anywhere.
  std::string padded = best.prompt;
  for (int32_t i = best.tokens; i < tokens; i++) padded += padded.empty() ? "a" : " a";
  auto n = count(padded);
  if (!n) return tl::unexpected(n.error());
  if (*n == tokens) return fitted_prompt{std::move(padded), *n};
  if (!best.prompt.empty()) return best;
  std::string one = prompt_text(1, seed, index);  // nothing fits: one word
  n = count(one);
  if (!n) return tl::unexpected(n.error());
  return fitted_prompt{std::move(one), *n};
}

expected<void> fit_prompts(std::vector<bench_request>& requests, uint64_t seed, const token_counter& count) {
  std::vector<fitted_prompt> fitted;
  for (const bench_request& r : requests) {
    if (!r.words) continue;
    auto f = fit_prompt(r.prompt_len, seed, r.index, count);
    if (!f) return tl::unexpected(f.error());
    fitted.push_back(std::move(*f));
  }
  size_t next = 0;
  for (bench_request& r : requests)
    if (r.words) {
      r.prompt = std::move(fitted[next].prompt);
      r.prompt_len = fitted[next++].tokens;
    }
  return {};
}

/// The prompts of a text dataset (custom, or ShareGPT JSON), the first num_prompts.
expected<std::vector<text_prompt>> read_text_dataset(const dataset_options& o) {
  if (o.path.empty()) return fail(errc::invalid_argument, "--dataset-name " + o.name + " needs --dataset-path");
  if (o.custom_output_len < 1) return fail(errc::invalid_argument, "--custom-output-len must be >= 1");
  auto text = sim::read_trace_text(o.path);
  if (!text) return tl::unexpected(text.error());
  auto prompts = o.name == "custom" ? parse_custom(*text, o.path, o.custom_output_len)
                                    : parse_sharegpt_json(*text, o.path, o.sharegpt_output_len);
  if (prompts && prompts->size() < static_cast<size_t>(o.num_prompts))
    return fail(errc::invalid_argument, "--num-prompts " + std::to_string(o.num_prompts) + " but dataset '" + o.path +
                                            "' has " + std::to_string(prompts->size()) + " prompts");
  return prompts;
}

/// The requests of a text dataset: its prompts, their words as the input length.
expected<std::vector<bench_request>> text_requests(const dataset_options& o, const std::vector<int64_t>& at) {
  auto prompts = read_text_dataset(o);
  if (!prompts) return tl::unexpected(prompts.error());
  std::vector<bench_request> out;
  for (int32_t i = 0; i < o.num_prompts; i++) {
    text_prompt& p = (*prompts)[static_cast<size_t>(i)];
    const int32_t words = count_words(p.prompt);
    out.push_back({i, std::move(p.prompt), words, p.output_len, at[static_cast<size_t>(i)], false});
  }
  return out;
}

expected<std::vector<bench_request>> make_requests(const dataset_options& o) {
  static const std::vector<std::string> names{"random", "sharegpt", "custom", "azure", "mooncake"};
  if (std::find(names.begin(), names.end(), o.name) == names.end())
    return fail(errc::invalid_argument, "--dataset-name is random, sharegpt, custom, azure or mooncake, got '" + o.name + "'");
  if (o.name == "random" && !o.path.empty())
    return fail(errc::invalid_argument, "--dataset-name random takes no --dataset-path");
  if (o.num_prompts < 1) return fail(errc::invalid_argument, "--num-prompts must be >= 1");
  auto at = arrivals(o);
  if (!at) return tl::unexpected(at.error());
  if (is_text_dataset(o)) return text_requests(o, *at);
  auto rows = lengths(o);
  if (!rows) return tl::unexpected(rows.error());
  std::vector<bench_request> out;
  for (int32_t i = 0; i < o.num_prompts; i++) {
    const sim::trace_request& r = (*rows)[static_cast<size_t>(i)];
    out.push_back({i, prompt_text(r.input_tokens, o.seed, i), r.input_tokens, r.output_tokens, (*at)[static_cast<size_t>(i)], true});
  }
  return out;
}

}  // namespace troupe::loadgen
