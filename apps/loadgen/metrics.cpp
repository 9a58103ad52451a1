#include "apps/loadgen/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

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

void add_summary(json& j, const char* name, const stats::summary& s) {
  const std::string n(name);
  j["mean_" + n + "_ms"] = s.mean;
  j["median_" + n + "_ms"] = s.median;
  j["std_" + n + "_ms"] = s.std;
  j["p90_" + n + "_ms"] = s.p90;
  j["p99_" + n + "_ms"] = s.p99;
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

std::string metric_rows(const char* header, const char* name, const stats::summary& s) {
  const std::string n(name);
  return banner(header, '-') + row("Mean " + n + " (ms):", fixed2(s.mean)) + row("Median " + n + " (ms):", fixed2(s.median)) +
         row("P90 " + n + " (ms):", fixed2(s.p90)) + row("P99 " + n + " (ms):", fixed2(s.p99));
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

bench_metrics compute_metrics(const std::vector<request_outcome>& outcomes, int64_t duration_ns, const goodput_slos& slos) {
  TROUPE_ASSERT(duration_ns > 0);
  bench_metrics m;
  m.duration_s = seconds(duration_ns);
  for (const request_outcome& o : outcomes) {
    m.output_lens.push_back(o.success ? output_len(o) : 0);
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
  m.ttft_ms = stats::summarize(l.ttft);
  m.tpot_ms = stats::summarize(l.tpot);
  m.itl_ms = stats::summarize(l.itl);
  m.e2el_ms = stats::summarize(l.e2el);
  return m;
}

std::string result_json(const run_description& run, const std::vector<request_outcome>& outcomes, const bench_metrics& m) {
  json j;
  j["date"] = run.date;
  j["backend"] = run.backend;
  j["model_id"] = run.model_id;
  j["tokenizer_id"] = run.model_id;
  j["dataset"] = run.dataset;
  j["num_prompts"] = run.num_prompts;
  j["request_rate"] = std::isinf(run.request_rate) ? json("inf") : json(run.request_rate);
  j["burstiness"] = 1.0;
  j["max_concurrency"] = run.max_concurrency ? json(*run.max_concurrency) : json(nullptr);
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = m.request_goodput ? json(*m.request_goodput) : json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  json input_lens = json::array(), ttfts = json::array(), itls = json::array(), texts = json::array(), errors = json::array();
  for (const request_outcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    ttfts.push_back(o.success ? seconds(o.chunk_ns.front() - o.start_ns) : 0.0);
    json gaps = json::array();
    for (size_t i = 1; i < o.chunk_ns.size(); i++) gaps.push_back(seconds(o.chunk_ns[i] - o.chunk_ns[i - 1]));
    itls.push_back(std::move(gaps));
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  add_summary(j, "ttft", m.ttft_ms);
  add_summary(j, "tpot", m.tpot_ms);
  add_summary(j, "itl", m.itl_ms);
  add_summary(j, "e2el", m.e2el_ms);
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string result_table(const bench_metrics& m) {
  std::string t = banner(" Serving Benchmark Result ", '=');
  t += row("Successful requests:", std::to_string(m.completed));
  t += row("Benchmark duration (s):", fixed2(m.duration_s));
  t += row("Total input tokens:", std::to_string(m.total_input));
  t += row("Total generated tokens:", std::to_string(m.total_output));
  t += row("Request throughput (req/s):", fixed2(m.request_throughput));
  if (m.request_goodput) t += row("Request goodput (req/s):", fixed2(*m.request_goodput));
  t += row("Output token throughput (tok/s):", fixed2(m.output_throughput));
  t += row("Total Token throughput (tok/s):", fixed2(m.total_token_throughput));
  t += metric_rows("Time to First Token", "TTFT", m.ttft_ms);
  t += metric_rows("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  t += metric_rows("Inter-token Latency", "ITL", m.itl_ms);
  t += metric_rows("End-to-end Latency", "E2EL", m.e2el_ms);
  return t + std::string(50, '=') + "\n";
}

}  // namespace troupe::loadgen
