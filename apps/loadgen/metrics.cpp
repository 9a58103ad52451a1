#include "apps/loadgen/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

namespace troupe::loadgen {
namespace {

using json = nlohmann::ordered_json;

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }
double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

/// Output tokens of a successful request: the server's count, else one per chunk.
int32_t output_len(const request_outcome& o) {
  return o.output_tokens >= 0 ? o.output_tokens : static_cast<int32_t>(o.chunk_ns.size());
}

struct latencies {
  std::vector<double> ttft, tpot, all_tpot, itl, e2el;  // ms; all_tpot has 0 for one-token requests
};

latencies collect(const std::vector<request_outcome>& outcomes) {
  latencies l;
  for (const request_outcome& o : outcomes) {
    if (!o.success) continue;
    TROUPE_ASSERT(!o.chunk_ns.empty());
    const double ttft = ms(o.chunk_ns.front() - o.start_ns), e2el = ms(o.chunk_ns.back() - o.start_ns);
    const int32_t n = output_len(o);
    double tpot = 0;
    if (n > 1) l.tpot.push_back(tpot = (e2el - ttft) / (n - 1));
    l.all_tpot.push_back(tpot);
    l.ttft.push_back(ttft);
    l.e2el.push_back(e2el);
    for (size_t i = 1; i < o.chunk_ns.size(); i++) l.itl.push_back(ms(o.chunk_ns[i] - o.chunk_ns[i - 1]));
  }
  return l;
}

int32_t num_good(const latencies& l, const goodput_slos& slos) {
  int32_t good = 0;
  for (size_t i = 0; i < l.ttft.size(); i++)
    good += (!slos.ttft_ms || l.ttft[i] <= *slos.ttft_ms) && (!slos.tpot_ms || l.all_tpot[i] <= *slos.tpot_ms) &&
            (!slos.e2el_ms || l.e2el[i] <= *slos.e2el_ms);
  return good;
}

/// One reported metric: its key name, the table's name and header, its summary and samples.
struct metric_view {
  const char* key;
  const char* name;
  const char* header;
  const stats::summary& summary;
  const std::vector<double>& samples;
};

std::vector<metric_view> metric_views(const bench_metrics& m) {
  return {{"ttft", "TTFT", "Time to First Token", m.ttft_ms, m.ttfts_ms},
          {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", m.tpot_ms, m.tpots_ms},
          {"itl", "ITL", "Inter-token Latency", m.itl_ms, m.itls_ms},
          {"e2el", "E2EL", "End-to-end Latency", m.e2el_ms, m.e2els_ms}};
}

bool reported(const report_options& report, const char* key) {
  return std::find(report.metrics.begin(), report.metrics.end(), key) != report.metrics.end();
}

/// A percentile as vLLM names it: "99" for a whole number, else Python's str of the float.
std::string percentile_word(double p) {
  return p == std::floor(p) ? std::to_string(static_cast<int64_t>(p)) : json(p).dump();
}

void add_summary(json& j, const metric_view& v, const report_options& report) {
  const std::string n(v.key);
  j["mean_" + n + "_ms"] = v.summary.mean;
  j["median_" + n + "_ms"] = v.summary.median;
  j["std_" + n + "_ms"] = v.summary.std;
  for (const double p : report.percentiles) j["p" + percentile_word(p) + "_" + n + "_ms"] = stats::percentile(v.samples, p);
}

/// The most chunks within one second from the earliest successful start.
double peak_tokens_per_s(const std::vector<request_outcome>& outcomes) {
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const request_outcome& o : outcomes)
    if (o.success) first = std::min(first, o.start_ns);
  std::map<int64_t, int64_t> per_second;
  int64_t peak = 0;
  for (const request_outcome& o : outcomes)
    if (o.success)
      for (const int64_t t : o.chunk_ns) peak = std::max(peak, ++per_second[(t - first) / 1000000000]);
  return static_cast<double>(peak);
}

/// The most successful requests in flight at once over [start, last chunk).
int32_t peak_concurrency(const std::vector<request_outcome>& outcomes) {
  std::vector<std::pair<int64_t, int32_t>> events;  // (time, +1 start | -1 end): an end sorts first
  for (const request_outcome& o : outcomes)
    if (o.success) {
      events.emplace_back(o.start_ns, 1);
      events.emplace_back(o.chunk_ns.back(), -1);
    }
  std::sort(events.begin(), events.end());
  int32_t now = 0, peak = 0;
  for (const auto& [t, delta] : events) peak = std::max(peak, now += delta);
  return peak;
}

/// The per-request lists of the result file.
void add_per_request(json& j, const std::vector<request_outcome>& outcomes, const bench_metrics& m) {
  json input_lens = json::array(), ttfts = json::array(), itls = json::array(), latencies = json::array(),
       starts = json::array(), texts = json::array(), errors = json::array();
  for (const request_outcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    ttfts.push_back(o.success ? seconds(o.chunk_ns.front() - o.start_ns) : 0.0);
    json gaps = json::array();
    for (size_t i = 1; i < o.chunk_ns.size(); i++) gaps.push_back(seconds(o.chunk_ns[i] - o.chunk_ns[i - 1]));
    itls.push_back(std::move(gaps));
    latencies.push_back(o.success ? seconds(o.chunk_ns.back() - o.start_ns) : 0.0);
    starts.push_back(seconds(o.start_ns));
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["latencies"] = std::move(latencies);
  j["start_times"] = std::move(starts);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
}

std::string row(const std::string& label, const std::string& value) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", label.c_str(), value.c_str());
  return buf;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

/// `title` centred in a line of 50 `fill` characters, as Python's "{:c^50}".
std::string banner(const std::string& title, char fill) {
  const size_t left = (50 - title.size()) / 2;
  return std::string(left, fill) + title + std::string(50 - left - title.size(), fill) + "\n";
}

std::string metric_rows(const metric_view& v, const report_options& report) {
  const std::string n(v.name);
  std::string rows = banner(v.header, '-') + row("Mean " + n + " (ms):", fixed2(v.summary.mean)) +
                     row("Median " + n + " (ms):", fixed2(v.summary.median));
  for (const double p : report.percentiles)
    rows += row("P" + percentile_word(p) + " " + n + " (ms):", fixed2(stats::percentile(v.samples, p)));
  return rows;
}

/// The comma-separated fields of `list`, or nothing if one is empty.
std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  for (size_t at = 0;;) {
    const size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, comma - at));
    if (out.back().empty()) return {};
    if (comma == list.size()) return out;
    at = comma + 1;
  }
}

}  // namespace

expected<goodput_slos> parse_goodput(const std::vector<std::string>& pairs) {
  goodput_slos slos;
  for (const std::string& pair : pairs) {
    const size_t colon = pair.find(':');
    const std::string key = pair.substr(0, colon), value = colon == std::string::npos ? "" : pair.substr(colon + 1);
    char* end = nullptr;
    const double bound = std::strtod(value.c_str(), &end);
    const bool number = !value.empty() && end == value.c_str() + value.size() && std::isfinite(bound) && bound >= 0;
    std::optional<double>* slot = key == "ttft" ? &slos.ttft_ms : key == "tpot" ? &slos.tpot_ms : key == "e2el" ? &slos.e2el_ms : nullptr;
    if (slot == nullptr || !number)
      return fail(errc::invalid_argument, "--goodput takes KEY:MS pairs with KEY ttft, tpot or e2el and MS >= 0, got '" + pair + "'");
    *slot = bound;
  }
  return slos;
}

expected<report_options> parse_report_options(const std::string& metrics, const std::string& percentiles) {
  report_options r;
  r.metrics = split_commas(metrics);
  static const std::vector<std::string> known{"ttft", "tpot", "itl", "e2el"};
  for (size_t i = 0; i < r.metrics.size(); i++)
    if (std::find(known.begin(), known.end(), r.metrics[i]) == known.end() ||
        std::find(r.metrics.begin(), r.metrics.begin() + static_cast<std::ptrdiff_t>(i), r.metrics[i]) != r.metrics.begin() + static_cast<std::ptrdiff_t>(i))
      r.metrics.clear();
  if (r.metrics.empty())
    return fail(errc::invalid_argument, "--percentile-metrics is a comma-separated list of ttft, tpot, itl, e2el, got '" + metrics + "'");
  const std::string bad = "--metric-percentiles is a comma-separated list of numbers in [0, 100], got '" + percentiles + "'";
  r.percentiles.clear();
  for (const std::string& field : split_commas(percentiles)) {
    char* end = nullptr;
    const double p = std::strtod(field.c_str(), &end);
    if (end != field.c_str() + field.size() || !(p >= 0 && p <= 100)) return fail(errc::invalid_argument, bad);
    r.percentiles.push_back(p);
  }
  if (r.percentiles.empty()) return fail(errc::invalid_argument, bad);
  return r;
}

bench_metrics compute_metrics(const std::vector<request_outcome>& outcomes, int64_t duration_ns, const goodput_slos& slos) {
  TROUPE_ASSERT(duration_ns > 0);
  bench_metrics m;
  m.duration_s = seconds(duration_ns);
  for (const request_outcome& o : outcomes) {
    m.output_lens.push_back(o.success ? output_len(o) : 0);
    m.failed += !o.success;
    if (!o.success) continue;
    m.completed++;
    m.total_input += o.prompt_len;
    m.total_output += m.output_lens.back();
  }
  const latencies l = collect(outcomes);
  m.request_throughput = m.completed / m.duration_s;
  if (slos.any()) m.request_goodput = num_good(l, slos) / m.duration_s;
  m.output_throughput = static_cast<double>(m.total_output) / m.duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / m.duration_s;
  m.max_output_tokens_per_s = peak_tokens_per_s(outcomes);
  m.max_concurrent_requests = peak_concurrency(outcomes);
  m.ttft_ms = stats::summarize(l.ttft);
  m.tpot_ms = stats::summarize(l.tpot);
  m.itl_ms = stats::summarize(l.itl);
  m.e2el_ms = stats::summarize(l.e2el);
  m.ttfts_ms = l.ttft;
  m.tpots_ms = l.tpot;
  m.itls_ms = l.itl;
  m.e2els_ms = l.e2el;
  return m;
}

std::string result_json(const run_description& run, const std::vector<request_outcome>& outcomes, const bench_metrics& m,
                        const report_options& report) {
  json j;
  j["date"] = run.date;
  j["endpoint_type"] = run.backend;
  j["backend"] = run.backend;
  j["label"] = run.label.empty() ? json(nullptr) : json(run.label);
  j["model_id"] = run.model_id;
  j["tokenizer_id"] = run.model_id;
  j["dataset"] = run.dataset;
  j["num_prompts"] = run.num_prompts;
  j["request_rate"] = std::isinf(run.request_rate) ? json("inf") : json(run.request_rate);
  j["burstiness"] = run.burstiness;
  j["max_concurrency"] = run.max_concurrency ? json(*run.max_concurrency) : json(nullptr);
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = m.request_goodput ? json(*m.request_goodput) : json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  add_per_request(j, outcomes, m);
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const metric_view& v : metric_views(m))
    if (reported(report, v.key)) add_summary(j, v, report);
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string result_file_name(const run_description& run) {
  const std::string rate = std::isinf(run.request_rate) ? "inf" : json(run.request_rate).dump();
  const std::string concurrency = run.max_concurrency ? "-concurrency" + std::to_string(*run.max_concurrency) : "";
  const std::string model = run.model_id.substr(run.model_id.rfind('/') == std::string::npos ? 0 : run.model_id.rfind('/') + 1);
  return (run.label.empty() ? run.backend : run.label) + "-" + rate + "qps" + concurrency + "-" + model + "-" + run.date + ".json";
}

std::string result_table(const run_description& run, const bench_metrics& m, const report_options& report) {
  std::string t = banner(" Serving Benchmark Result ", '=');
  t += row("Successful requests:", std::to_string(m.completed));
  t += row("Failed requests:", std::to_string(m.failed));
  if (run.max_concurrency) t += row("Maximum request concurrency:", std::to_string(*run.max_concurrency));
  if (!std::isinf(run.request_rate)) t += row("Request rate configured (RPS):", fixed2(run.request_rate));
  t += row("Benchmark duration (s):", fixed2(m.duration_s));
  t += row("Total input tokens:", std::to_string(m.total_input));
  t += row("Total generated tokens:", std::to_string(m.total_output));
  t += row("Request throughput (req/s):", fixed2(m.request_throughput));
  if (m.request_goodput) t += row("Request goodput (req/s):", fixed2(*m.request_goodput));
  t += row("Output token throughput (tok/s):", fixed2(m.output_throughput));
  t += row("Peak output token throughput (tok/s):", fixed2(m.max_output_tokens_per_s));
  t += row("Peak concurrent requests:", fixed2(m.max_concurrent_requests));
  t += row("Total Token throughput (tok/s):", fixed2(m.total_token_throughput));
  for (const metric_view& v : metric_views(m))
    if (reported(report, v.key)) t += metric_rows(v, report);
  return t + std::string(50, '=') + "\n";
}

}  // namespace troupe::loadgen
