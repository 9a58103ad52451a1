#include "runtime/openai/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <utility>

#include "runtime/common/error.hpp"

namespace troupe::openai {
namespace {

// vLLM 0.10's buckets (vllm/v1/metrics/loggers.py).
const std::vector<double> ttft_bounds{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> tpot_bounds{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> request_latency_bounds{0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                                 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> prefill_token_bounds{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0};
const std::vector<double> n_bounds{1, 2, 5, 10, 20};

/// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value`.
std::vector<double> bounds_1_2_5(int32_t max_value) {
  std::vector<double> out;
  for (int64_t scale = 1;; scale *= 10)
    for (const int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return out;
      out.push_back(static_cast<double>(m * scale));
    }
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

/// The shortest text that reads back as `v` (Prometheus accepts any Go float syntax).
std::string number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  TROUPE_ASSERT(r.ec == std::errc());
  return std::string(buf, r.ptr);
}

std::string escaped_label(const std::string& value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

/// Writes one metric family: HELP, TYPE and its samples.
class page {
 public:
  /// Every sample's labels: model_name, and engine="0" for vLLM's families.
  page(const std::string& model_name, bool vllm)
      : label_("model_name=\"" + escaped_label(model_name) + "\"" + (vllm ? ",engine=\"0\"" : "")) {}

  void family(const std::string& name, const char* type, const char* help) {
    text_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, const std::string& value, const std::string& extra_label = "") {
    text_ += name + "{" + label_ + (extra_label.empty() ? "" : "," + extra_label) + "} " + value + "\n";
  }
  void gauge(const std::string& name, const char* help, int64_t value) { scalar(name, "gauge", help, number(static_cast<double>(value))); }
  void counter(const std::string& name, const char* help, int64_t value) { scalar(name, "counter", help, number(static_cast<double>(value))); }
  void scalar(const std::string& name, const char* type, const char* help, const std::string& value) {
    family(name, type, help);
    sample(name, value);
  }
  void histogram_family(const std::string& name, const char* help, const histogram& h) {
    family(name, "histogram", help);
    int64_t cumulative = 0;
    for (size_t i = 0; i < h.upper_bounds.size(); i++) {
      cumulative += h.bucket_counts[i];
      sample(name + "_bucket", number(static_cast<double>(cumulative)), "le=\"" + number(h.upper_bounds[i]) + "\"");
    }
    sample(name + "_bucket", number(static_cast<double>(h.count)), "le=\"+Inf\"");
    sample(name + "_sum", number(h.sum));
    sample(name + "_count", number(static_cast<double>(h.count)));
  }
  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  std::string label_;
  std::string text_;
};

}  // namespace

histogram::histogram(std::vector<double> bounds) : upper_bounds(std::move(bounds)), bucket_counts(upper_bounds.size() + 1, 0) {
  TROUPE_ASSERT(std::is_sorted(upper_bounds.begin(), upper_bounds.end()));
  TROUPE_ASSERT(std::adjacent_find(upper_bounds.begin(), upper_bounds.end()) == upper_bounds.end());
}

void histogram::observe(double value) {
  const auto at = std::lower_bound(upper_bounds.begin(), upper_bounds.end(), value);  // first bound >= value
  bucket_counts[static_cast<size_t>(at - upper_bounds.begin())]++;
  sum += value;
  count++;
}

request_metrics::request_metrics(int32_t max_model_len)
    : max_model_len(max_model_len),
      ttft_seconds(ttft_bounds),
      time_per_output_token_seconds(tpot_bounds),
      e2e_latency_seconds(request_latency_bounds),
      queue_time_seconds(request_latency_bounds),
      inference_time_seconds(request_latency_bounds),
      prefill_time_seconds(request_latency_bounds),
      decode_time_seconds(request_latency_bounds),
      time_per_prefill_token_seconds(prefill_token_bounds),
      prompt_tokens(bounds_1_2_5(max_model_len)),
      generation_tokens(bounds_1_2_5(max_model_len)),
      params_max_tokens(bounds_1_2_5(max_model_len)),
      params_n(n_bounds),
      max_num_generation_tokens(bounds_1_2_5(max_model_len)) {}

void request_metrics::record(const serve::completion_end& end, int32_t max_tokens) {
  // A request that generated nothing had no first token: its prefill lasts to its end.
  const int64_t first_token_ns = end.num_generated_tokens > 0 ? end.ttft_ns : end.e2e_ns;
  if (end.num_generated_tokens > 0) ttft_seconds.observe(seconds(end.ttft_ns));
  for (const int64_t gap : end.itl_ns) time_per_output_token_seconds.observe(seconds(gap));
  e2e_latency_seconds.observe(seconds(end.e2e_ns));
  queue_time_seconds.observe(seconds(end.queue_ns));
  inference_time_seconds.observe(seconds(end.e2e_ns - end.queue_ns));
  prefill_time_seconds.observe(seconds(first_token_ns - end.queue_ns));
  decode_time_seconds.observe(seconds(end.e2e_ns - first_token_ns));
  if (end.num_prompt_tokens > 0)
    time_per_prefill_token_seconds.observe(seconds(first_token_ns - end.queue_ns) / end.num_prompt_tokens);
  prompt_tokens.observe(end.num_prompt_tokens);
  generation_tokens.observe(end.num_generated_tokens);
  if (max_tokens != serve::max_tokens_to_context)
    params_max_tokens.observe(max_tokens);
  else if (max_model_len > 0)
    params_max_tokens.observe(std::max(0, max_model_len - end.num_prompt_tokens));
  num_prompt_tokens += end.num_prompt_tokens;
  num_generation_tokens += end.num_generated_tokens;
  num_failovers += end.num_failovers;
  num_success_by_reason[engine::to_string(end.finish_reason)]++;
}

void request_metrics::record_parallel(int32_t n, int32_t max_num_generated_tokens) {
  params_n.observe(n);
  max_num_generation_tokens.observe(max_num_generated_tokens);
}

engine_gauges sum_reports(const std::vector<engine::engine_report>& reports, const cache_config& cache) {
  engine_gauges g;
  g.cache = cache;
  for (const engine::engine_report& r : reports) {
    g.num_running += r.num_requests - r.num_waiting;
    g.num_waiting += r.num_waiting;
    g.num_kv_blocks_in_use += r.num_blocks_in_use;
    g.num_preemptions += r.num_preemptions;
    g.num_prefix_query_tokens += r.num_prefix_query_tokens;
    g.num_prefix_hit_tokens += r.num_prefix_hit_tokens;
    g.num_steps += r.num_steps;
    g.num_scheduled_tokens += r.num_scheduled_tokens;
    for (size_t i = 0; i < g.num_steps_by_tokens.size() && i < r.num_steps_by_tokens.size(); i++)
      g.num_steps_by_tokens[i] += r.num_steps_by_tokens[i];
    g.num_drafts += r.num_speculative_rows;
    g.num_draft_tokens += r.num_draft_slots;
    g.num_accepted_tokens += r.num_accepted_drafts;
    g.num_pool_hit_tokens += r.num_prefix_hit_tokens - r.num_host_hit_tokens;
    g.num_host_hit_tokens += r.num_host_hit_tokens - r.num_disk_hit_tokens;
    g.num_disk_hit_tokens += r.num_disk_hit_tokens;
    g.num_demoted_bytes += r.num_demoted_bytes;
    g.num_promoted_bytes += r.num_promoted_bytes;
    g.num_host_expired_blocks = std::max(g.num_host_expired_blocks, r.host_tier_expired_blocks);
    g.num_disk_expired_blocks = std::max(g.num_disk_expired_blocks, r.disk_tier_expired_blocks);
    g.num_swap_in_tokens += r.num_swap_in_tokens;
    g.num_tier_fetches += r.num_tier_fetches;
    g.num_tier_fetches_declined += r.num_tier_fetches_declined;
    g.moe_lb = std::max(g.moe_lb, r.moe_lb_last_window);
    g.num_moe_windows += r.num_moe_windows;
    g.num_expert_moves += r.num_expert_moves;
    g.num_handoffs += r.num_handoffs_timed;
    g.handoff_ns += r.handoff_ns;
    g.handoff_bytes += r.handoff_bytes;
  }
  return g;
}

namespace {

/// vLLM's engine-side families: the scheduler's gauges and counters, the prefix cache, the
/// steps' tokens, speculative decoding (once an engine drafted) and the cache's configuration.
void render_vllm_engines(page& p, const engine_gauges& engines) {
  p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", engines.num_running);
  p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", engines.num_waiting);
  const double usage = engines.cache.num_blocks == 0 ? 0.0
                           : static_cast<double>(engines.num_kv_blocks_in_use) / static_cast<double>(engines.cache.num_blocks);
  p.scalar("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", number(usage));
  p.scalar("vllm:gpu_cache_usage_perc", "gauge",
           "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.", number(usage));
  p.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            engines.num_prefix_query_tokens);
  p.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            engines.num_prefix_hit_tokens);
  p.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", engines.num_preemptions);
  histogram steps({engine::iteration_token_bounds.begin(), engine::iteration_token_bounds.end()});
  steps.bucket_counts = engines.num_steps_by_tokens;
  steps.sum = static_cast<double>(engines.num_scheduled_tokens);
  steps.count = engines.num_steps;
  p.histogram_family("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", steps);
  if (engines.num_drafts > 0) {  // only once an engine drafted, as vLLM's only with a speculative config
    p.counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", engines.num_drafts);
    p.counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", engines.num_draft_tokens);
    p.counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", engines.num_accepted_tokens);
  }
  p.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  p.sample("vllm:cache_config_info", "1",
           "block_size=\"" + std::to_string(engines.cache.block_size) + "\",num_gpu_blocks=\"" +
               std::to_string(engines.cache.num_blocks) + "\"");
}

/// vLLM's request-side families: tokens, outcomes, request parameters and latencies.
void render_vllm_requests(page& p, const request_metrics& r) {
  p.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", r.num_prompt_tokens);
  p.counter("vllm:generation_tokens_total", "Number of generation tokens processed.", r.num_generation_tokens);
  p.family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  std::map<std::string, int64_t> by_reason{{"stop", 0}, {"length", 0}, {"abort", 0}};  // vLLM's, each from 0
  for (const auto& [reason, n] : r.num_success_by_reason) by_reason[reason] += n;
  for (const auto& [reason, n] : by_reason)
    p.sample("vllm:request_success_total", number(static_cast<double>(n)), "finished_reason=\"" + reason + "\"");
  const std::pair<const char*, const char*> names[] = {
      {"vllm:request_prompt_tokens", "Number of prefill tokens processed."},
      {"vllm:request_generation_tokens", "Number of generation tokens processed."},
      {"vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."},
      {"vllm:request_params_n", "Histogram of the n request parameter."},
      {"vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."},
      {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."},
      {"vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."},
      {"vllm:time_per_prefill_token_request_seconds", "Time spent per token during prefill phase in seconds"},
      {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."},
      {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."},
      {"vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."},
      {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."},
      {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."}};
  const histogram* values[] = {&r.prompt_tokens,
                               &r.generation_tokens,
                               &r.max_num_generation_tokens,
                               &r.params_n,
                               &r.params_max_tokens,
                               &r.ttft_seconds,
                               &r.time_per_output_token_seconds,
                               &r.time_per_prefill_token_seconds,
                               &r.e2e_latency_seconds,
                               &r.queue_time_seconds,
                               &r.inference_time_seconds,
                               &r.prefill_time_seconds,
                               &r.decode_time_seconds};
  static_assert(std::size(names) == std::size(values));
  for (size_t i = 0; i < std::size(names); i++) p.histogram_family(names[i].first, names[i].second, *values[i]);
}

/// troupe's own families: the gateway's, the KV pool's blocks, fail-overs, the KV tiers and MoE.
void render_troupe(page& p, const request_metrics& requests, const engine_gauges& engines) {
  p.gauge("troupe:http_requests_in_flight", "Completions the HTTP gateway is serving (a stream until its last byte).",
          requests.num_in_flight);
  p.gauge("troupe:num_kv_blocks_in_use", "KV-cache blocks held by unfinished requests.", engines.num_kv_blocks_in_use);
  p.gauge("troupe:num_kv_blocks", "KV-cache blocks in the engines' pools.", engines.cache.num_blocks);
  p.counter("troupe:request_failovers_total", "Times a request was placed again after losing its engine.",
            requests.num_failovers);
  p.family("troupe:kv_tier_hit_tokens_total", "counter", "Prompt tokens served from a KV cache tier at admission.");
  p.sample("troupe:kv_tier_hit_tokens_total", number(static_cast<double>(engines.num_pool_hit_tokens)), "tier=\"pool\"");
  p.sample("troupe:kv_tier_hit_tokens_total", number(static_cast<double>(engines.num_host_hit_tokens)), "tier=\"host\"");
  p.sample("troupe:kv_tier_hit_tokens_total", number(static_cast<double>(engines.num_disk_hit_tokens)), "tier=\"disk\"");
  p.family("troupe:kv_tier_moved_bytes_total", "counter", "KV bytes moved between the pool and the host tier.");
  p.sample("troupe:kv_tier_moved_bytes_total", number(static_cast<double>(engines.num_demoted_bytes)),
           "from=\"pool\",to=\"host\"");
  p.sample("troupe:kv_tier_moved_bytes_total", number(static_cast<double>(engines.num_promoted_bytes)),
           "from=\"host\",to=\"pool\"");
  p.counter("troupe:kv_swap_in_tokens_total", "Tokens readmitted victims of preemption took back from the host tier.",
            engines.num_swap_in_tokens);
  p.family("troupe:kv_tier_fetches_total", "counter",
           "Requests whose prefix beyond the pool's a tier may hold: asked of the tier, or recomputed because "
           "the fetch was predicted not to pay.");
  p.sample("troupe:kv_tier_fetches_total", number(static_cast<double>(engines.num_tier_fetches)), "decision=\"fetch\"");
  p.sample("troupe:kv_tier_fetches_total", number(static_cast<double>(engines.num_tier_fetches_declined)),
           "decision=\"recompute\"");
  p.counter("troupe:kv_handoffs_total",
            "KV hand-offs (prefill to decode, a drained engine's forwards) whose KV arrived intact.",
            engines.num_handoffs);
  p.scalar("troupe:kv_handoff_seconds_total", "counter",
           "Time from sending those hand-offs to decoding their KV, summed (the nodes' clocks must agree).",
           number(static_cast<double>(engines.handoff_ns) / 1e9));
  p.counter("troupe:kv_handoff_bytes_total", "KV payload bytes of those hand-offs.", engines.handoff_bytes);
  p.family("troupe:kv_tier_expired_blocks_total", "counter", "KV blocks a cache tier dropped when their TTL passed.");
  p.sample("troupe:kv_tier_expired_blocks_total", number(static_cast<double>(engines.num_host_expired_blocks)),
           "tier=\"host\"");
  p.sample("troupe:kv_tier_expired_blocks_total", number(static_cast<double>(engines.num_disk_expired_blocks)),
           "tier=\"disk\"");
  if (engines.num_moe_windows > 0) {  // only once an MoE engine measured its expert placement
    p.scalar("troupe:moe_lb", "gauge",
             "MoE load imbalance of the latest window of steps (busiest expert shard / mean; 1 is balanced), the "
             "largest over the engines.",
             number(engines.moe_lb));
    p.counter("troupe:moe_windows_total", "Windows of steps whose expert load the MoE engines measured.",
              engines.num_moe_windows);
    p.counter("troupe:expert_moves_total", "Times an MoE engine moved its experts to a new placement.",
              engines.num_expert_moves);
  }
}

}  // namespace

std::string render_metrics(const request_metrics& requests, const engine_gauges& engines, const std::string& model_name) {
  page vllm(model_name, true);
  render_vllm_engines(vllm, engines);
  render_vllm_requests(vllm, requests);
  page own(model_name, false);
  render_troupe(own, requests, engines);
  return vllm.text() + own.text();
}

}  // namespace troupe::openai
