#include "runtime/openai/metrics.hpp"

#include <algorithm>
#include <charconv>

#include "runtime/common/error.hpp"

namespace troupe::openai {
namespace {

// vLLM's buckets, with finer ones at the low end for inter-token gaps: a small model on a CPU
// answers in milliseconds.
const std::vector<double> ttft_bounds{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> itl_bounds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                     0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
const std::vector<double> e2e_bounds{0.01, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,   10.0, 15.0,
                                     20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

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
  explicit page(const std::string& model_name) : label_("model_name=\"" + escaped_label(model_name) + "\"") {}

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

request_metrics::request_metrics()
    : ttft_seconds(ttft_bounds), inter_token_latency_seconds(itl_bounds), e2e_latency_seconds(e2e_bounds) {}

void request_metrics::record(const serve::completion_end& end) {
  if (end.num_generated_tokens > 0) ttft_seconds.observe(seconds(end.ttft_ns));
  for (const int64_t gap : end.itl_ns) inter_token_latency_seconds.observe(seconds(gap));
  e2e_latency_seconds.observe(seconds(end.e2e_ns));
  num_prompt_tokens += end.num_prompt_tokens;
  num_generation_tokens += end.num_generated_tokens;
  num_prefix_cache_hit_tokens += end.num_cached_tokens;
  num_failovers += end.num_failovers;
  num_success_by_reason[engine::to_string(end.finish_reason)]++;
}

engine_gauges sum_reports(const std::vector<engine::engine_report>& reports, int64_t num_kv_blocks_total) {
  engine_gauges g;
  g.num_kv_blocks_total = num_kv_blocks_total;
  for (const engine::engine_report& r : reports) {
    g.num_running += r.num_requests - r.num_waiting;
    g.num_waiting += r.num_waiting;
    g.num_kv_blocks_in_use += r.num_blocks_in_use;
    g.num_preemptions += r.num_preemptions;
    g.num_pool_hit_tokens += r.num_prefix_hit_tokens - r.num_host_hit_tokens;
    g.num_host_hit_tokens += r.num_host_hit_tokens - r.num_disk_hit_tokens;
    g.num_disk_hit_tokens += r.num_disk_hit_tokens;
    g.num_demoted_bytes += r.num_demoted_bytes;
    g.num_promoted_bytes += r.num_promoted_bytes;
    g.num_host_expired_blocks = std::max(g.num_host_expired_blocks, r.host_tier_expired_blocks);
    g.num_disk_expired_blocks = std::max(g.num_disk_expired_blocks, r.disk_tier_expired_blocks);
    g.num_swap_in_tokens += r.num_swap_in_tokens;
    g.moe_lb = std::max(g.moe_lb, r.moe_lb_last_window);
    g.num_moe_windows += r.num_moe_windows;
    g.num_expert_moves += r.num_expert_moves;
  }
  return g;
}

std::string render_metrics(const request_metrics& requests, const engine_gauges& engines, const std::string& model_name) {
  page p(model_name);
  p.gauge("troupe:num_requests_running", "Number of requests in model execution batches.", engines.num_running);
  p.gauge("troupe:num_requests_waiting", "Number of requests waiting to be processed.", engines.num_waiting);
  p.gauge("troupe:http_requests_in_flight", "Completions the HTTP gateway is serving (a stream until its last byte).",
          requests.num_in_flight);
  const double usage = engines.num_kv_blocks_total == 0 ? 0.0
                           : static_cast<double>(engines.num_kv_blocks_in_use) / static_cast<double>(engines.num_kv_blocks_total);
  p.scalar("troupe:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", number(usage));
  p.gauge("troupe:num_kv_blocks_in_use", "KV-cache blocks held by unfinished requests.", engines.num_kv_blocks_in_use);
  p.gauge("troupe:num_kv_blocks", "KV-cache blocks in the engines' pools.", engines.num_kv_blocks_total);
  p.counter("troupe:num_preemptions_total", "Cumulative number of preemptions from the engine.", engines.num_preemptions);
  p.counter("troupe:prompt_tokens_total", "Number of prefill tokens processed.", requests.num_prompt_tokens);
  p.counter("troupe:generation_tokens_total", "Number of generation tokens processed.", requests.num_generation_tokens);
  p.counter("troupe:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", requests.num_prefix_cache_hit_tokens);
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
  p.family("troupe:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& [reason, n] : requests.num_success_by_reason)
    p.sample("troupe:request_success_total", number(static_cast<double>(n)), "finished_reason=\"" + reason + "\"");
  p.histogram_family("troupe:time_to_first_token_seconds", "Histogram of time to first token in seconds.", requests.ttft_seconds);
  p.histogram_family("troupe:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                     requests.inter_token_latency_seconds);
  p.histogram_family("troupe:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                     requests.e2e_latency_seconds);
  return p.text();
}

}  // namespace troupe::openai
