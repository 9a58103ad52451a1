#include "sim/trace_stats.hpp"

#include <algorithm>
#include <cstdio>

#include "runtime/common/stats.hpp"

namespace troupe::sim {
namespace {

constexpr int64_t ns_per_s = 1'000'000'000;
constexpr int64_t auto_buckets = 20;

length_stats lengths_of(std::vector<double> values) {
  TROUPE_ASSERT(!values.empty());
  std::sort(values.begin(), values.end());
  length_stats s;
  s.min = values.front();
  s.max = values.back();
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.p50 = stats::percentile_of_sorted(values, 50);
  s.p90 = stats::percentile_of_sorted(values, 90);
  s.p99 = stats::percentile_of_sorted(values, 99);
  return s;
}

template <class... Args>
std::string printf_string(const char* format, Args... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), format, args...);
  return buffer;
}

std::string length_line(const char* what, const length_stats& s) {
  return printf_string("%-14s min %.0f  mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f  max %.0f\n", what, s.min, s.mean,
                       s.p50, s.p90, s.p99, s.max);
}

}  // namespace

trace_stats compute_trace_stats(const trace_file& file, int64_t bucket_ns) {
  TROUPE_ASSERT(!file.requests.empty());
  TROUPE_ASSERT(bucket_ns >= 0);
  trace_stats s;
  s.format = file.format;
  s.num_requests = static_cast<int64_t>(file.requests.size());
  s.num_skipped = file.num_skipped;
  s.timed = has_arrival_times(file.format);
  s.duration_ns = file.requests.back().arrival_ns - file.requests.front().arrival_ns;
  std::vector<double> input, output;
  bool any_hash_ids = false;
  for (const trace_request& r : file.requests) {
    input.push_back(r.input_tokens);
    output.push_back(r.output_tokens);
    any_hash_ids = any_hash_ids || !r.hash_ids.empty();
  }
  s.input = lengths_of(std::move(input));
  s.output = lengths_of(std::move(output));
  if (any_hash_ids) s.reuse = prefix_reuse_bound(file.requests, mooncake_block_tokens);
  if (!s.timed) return s;
  const int64_t seconds = (s.duration_ns / auto_buckets + ns_per_s - 1) / ns_per_s;
  s.bucket_ns = bucket_ns > 0 ? bucket_ns : std::max<int64_t>(seconds, 1) * ns_per_s;
  s.arrivals_per_bucket.assign(static_cast<size_t>(s.duration_ns / s.bucket_ns + 1), 0);
  for (const trace_request& r : file.requests)
    s.arrivals_per_bucket[static_cast<size_t>((r.arrival_ns - file.requests.front().arrival_ns) / s.bucket_ns)]++;
  return s;
}

std::string format_trace_stats(const trace_stats& s, const std::string& name) {
  std::string text = name + " (" + trace_format_name(s.format) + "): " + std::to_string(s.num_requests) + " requests";
  if (s.num_skipped > 0) text += ", " + std::to_string(s.num_skipped) + " failed rows skipped";
  text += "\n";
  if (s.timed) {
    const double duration_s = static_cast<double>(s.duration_ns) / ns_per_s;
    text += printf_string("arrivals over %.3f s: %.4g requests/s on average\n", duration_s,
                          duration_s > 0 ? static_cast<double>(s.num_requests - 1) / duration_s : 0.0);
    const double bucket_s = static_cast<double>(s.bucket_ns) / ns_per_s;
    text += printf_string("request rate over time (buckets of %g s):\n%12s %10s %12s\n", bucket_s, "start_s",
                          "requests", "requests/s");
    for (size_t i = 0; i < s.arrivals_per_bucket.size(); ++i)
      text += printf_string("%12g %10lld %12.4g\n", static_cast<double>(i) * bucket_s,
                            static_cast<long long>(s.arrivals_per_bucket[i]),
                            static_cast<double>(s.arrivals_per_bucket[i]) / bucket_s);
  } else {
    text += "no arrival times (a length-only dataset: `troupe sim` draws them, --synthetic-rate/--synthetic-cv)\n";
  }
  text += length_line("prompt tokens", s.input);
  text += length_line("output tokens", s.output);
  if (s.reuse)
    text += printf_string("prefix reuse bound (hash_ids, %d-token blocks, infinite cache): %.4f of prompt tokens "
                          "(%lld of %lld)\n",
                          mooncake_block_tokens, s.reuse->rate(), static_cast<long long>(s.reuse->num_reusable_tokens),
                          static_cast<long long>(s.reuse->num_prompt_tokens));
  return text;
}

}  // namespace troupe::sim
