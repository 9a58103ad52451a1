#include "sim/report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_set>

#include "runtime/common/stats.hpp"
#include "runtime/kv/chain_hash.hpp"

namespace troupe::sim {
namespace {

namespace fs = std::filesystem;

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

/// Latencies in the summary: numpy's percentiles (runtime/common/stats.hpp), as `bench serve`.
std::string stats_json(const stats::summary& s) {
  return "{\"mean\": " + num(s.mean) + ", \"p50\": " + num(s.median) + ", \"p90\": " + num(s.p90) +
         ", \"p99\": " + num(s.p99) + "}";
}

double tpot_ms(const request_record& r) {
  return r.output_tokens > 1 ? ms(r.finish_ns - r.first_token_ns) / (r.output_tokens - 1) : 0.0;
}

bool ok(const request_record& r) { return r.finish == "length" || r.finish == "stop"; }

struct latencies {
  std::vector<double> ttft, tpot, itl, e2e;
};

latencies collect(const sim_result& r) {
  latencies l;
  for (const request_record& q : r.requests) {
    if (!ok(q)) continue;
    l.ttft.push_back(ms(q.first_token_ns - q.arrival_ns));
    l.e2e.push_back(ms(q.finish_ns - q.arrival_ns));
    if (q.output_tokens > 1) l.tpot.push_back(tpot_ms(q));
    for (int64_t g : q.itl_ns) l.itl.push_back(ms(g));
  }
  return l;
}

std::string batch_histogram_json(const std::vector<step_record>& steps) {
  std::map<int64_t, int64_t> bins;  // power-of-two upper bounds
  for (const step_record& s : steps) {
    int64_t bound = 1;
    while (bound < s.num_rows) bound *= 2;
    bins[bound]++;
  }
  std::string out = "{";
  for (const auto& [bound, count] : bins)
    out += (out.size() > 1 ? ", " : "") + std::string("\"<=") + std::to_string(bound) + "\": " + std::to_string(count);
  return out + "}";
}

expected<void> write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return fail(errc::io_error, "cannot write " + path.string());
  return {};
}

std::string requests_csv(const sim_result& r) {
  std::string out = "index,arrival_ns,scheduled_ns,first_token_ns,finish_ns,prompt_tokens,output_tokens,"
                    "cached_tokens,preemptions,recomputed_tokens,finish\n";
  for (const request_record& q : r.requests)
    out += std::to_string(q.index) + "," + std::to_string(q.arrival_ns) + "," + std::to_string(q.scheduled_ns) + "," +
           std::to_string(q.first_token_ns) + "," + std::to_string(q.finish_ns) + "," +
           std::to_string(q.prompt_tokens) + "," + std::to_string(q.output_tokens) + "," +
           std::to_string(q.cached_tokens) + "," + std::to_string(q.preemptions) + "," +
           std::to_string(q.recomputed_tokens) + "," + q.finish + "\n";
  return out;
}

/// CDF data ("value fraction" per line) of a sorted copy of `values`.
/// Generated tokens per second of virtual time, each token placed at its own emission time.
std::string throughput_data(const sim_result& r) {
  std::map<int64_t, int64_t> per_second;
  for (const request_record& q : r.requests) {
    if (!ok(q)) continue;
    int64_t t = q.first_token_ns;
    per_second[t / 1000000000]++;
    for (int64_t g : q.itl_ns) per_second[(t += g) / 1000000000]++;
  }
  std::string out;
  for (const auto& [second, tokens] : per_second) out += std::to_string(second) + " " + std::to_string(tokens) + "\n";
  return out;
}

/// timeseries.csv, and tier_hits.csv: its tier columns summed over the replicas, one line per
/// interval with a sample (time_s, pool, host and disk hit tokens per second).
struct timeseries_files {
  std::string csv, tier_hits;
};

/// One row per replica and sampling interval: what its steps did in the interval, and its
/// counters when it started the interval's first step (blank where it ran no step).
timeseries_files timeseries_csv(const sim_result& r) {
  struct interval {
    int64_t steps = 0, rows = 0, decode_rows = 0, prefill_tokens = 0, samples = 0;
    const replica_sample* sample = nullptr;
  };
  const int64_t every = r.sample_every_ns;
  std::map<std::pair<int64_t, int32_t>, interval> rows;  // (interval, replica)
  for (const step_record& s : r.steps) {
    interval& i = rows[{s.start_ns / every, s.replica}];
    i.steps++;
    i.rows += s.num_rows;
    i.decode_rows += s.num_decode_rows;
    i.prefill_tokens += s.num_prefill_tokens;
    i.samples += s.num_samples;
  }
  for (const replica_sample& s : r.samples) rows[{s.time_ns / every, s.replica}].sample = &s;
  std::string out = "time_s,replica,steps,mean_rows,decode_rows,prefill_tokens,tokens_per_s,waiting,running,"
                    "kv_blocks_in_use,preemptions,pool_hits_per_s,host_hits_per_s,disk_hits_per_s\n";
  // Each replica's previous sample (the counters are cumulative): the run's start before its first.
  std::vector<replica_sample> before(static_cast<size_t>(std::max(r.num_replicas, 1)));
  std::map<int64_t, std::array<double, 3>> tiers;  // interval -> pool, host, disk per second
  const double seconds = static_cast<double>(every) / 1e9;
  for (const auto& [key, i] : rows) {
    out += num(static_cast<double>(key.first) * seconds) + "," + std::to_string(key.second) + "," +
           std::to_string(i.steps) + "," + num(i.steps ? static_cast<double>(i.rows) / i.steps : 0.0) + "," +
           std::to_string(i.decode_rows) + "," + std::to_string(i.prefill_tokens) + "," + num(i.samples / seconds) + ",";
    if (i.sample) {
      const replica_sample& s = *i.sample;
      replica_sample& b = before.at(static_cast<size_t>(key.second));
      // Prompt tokens each tier served since the previous sample, per second of virtual time.
      const double since = static_cast<double>(s.time_ns - b.time_ns) / 1e9;
      const auto per_s = [&](int64_t tokens) { return since > 0 ? static_cast<double>(tokens) / since : 0.0; };
      const int64_t host = s.num_host_hit_tokens - b.num_host_hit_tokens;
      const int64_t disk = s.num_disk_hit_tokens - b.num_disk_hit_tokens;
      const std::array<double, 3> rates = {per_s(s.num_prefix_hit_tokens - b.num_prefix_hit_tokens - host),
                                           per_s(host - disk), per_s(disk)};
      out += std::to_string(s.num_waiting) + "," + std::to_string(s.num_running) + "," +
             std::to_string(s.num_blocks_in_use) + "," + std::to_string(s.num_preemptions - b.num_preemptions);
      std::array<double, 3>& sum = tiers[key.first];
      for (size_t k = 0; k < 3; k++) {
        out += "," + num(rates[k]);
        sum[k] += rates[k];
      }
      b = s;
    } else {
      out += ",,,,,,";
    }
    out += "\n";
  }
  std::string tier_hits;
  for (const auto& [interval, sum] : tiers)
    tier_hits += num(static_cast<double>(interval) * seconds) + "," + num(sum[0]) + "," + num(sum[1]) + "," +
                 num(sum[2]) + "\n";
  return {out, tier_hits};
}

constexpr const char* plot_script = R"(set terminal svg size 900,500 dynamic
set output 'latency_cdf.svg'
set title 'Latency CDFs'
set xlabel 'milliseconds'
set ylabel 'fraction of requests'
set logscale x
set key bottom right
plot 'ttft_cdf.dat' using 1:2 with lines title 'TTFT', 'e2e_cdf.dat' using 1:2 with lines title 'E2E'
set output 'throughput.svg'
set title 'Generated tokens per second (virtual time)'
unset logscale x
set xlabel 'seconds'
set ylabel 'tokens/s'
plot 'throughput.dat' using 1:2 with steps notitle
)";

/// Per-replica time series: one line per replica (column 2) in each panel.
std::string timeseries_plot_script(int32_t num_replicas) {
  return "set terminal svg size 1200,800 dynamic\n"
         "set output 'timeseries.svg'\n"
         "set datafile separator ','\n"
         "set multiplot layout 2,3 title 'Per replica (virtual time)'\n"
         "set xlabel 'seconds'\n"
         "n = " + std::to_string(num_replicas) + "\n"
         "set title 'waiting requests'\n"
         "set ylabel 'requests'\n"
         "plot for [r=0:n-1] 'timeseries.csv' using 1:($2==r ? $8 : 1/0) with steps title sprintf('replica %d', r)\n"
         "set title 'running requests'\n"
         "plot for [r=0:n-1] 'timeseries.csv' using 1:($2==r ? $9 : 1/0) with steps title sprintf('replica %d', r)\n"
         "set title 'KV blocks in use'\n"
         "set ylabel 'blocks'\n"
         "plot for [r=0:n-1] 'timeseries.csv' using 1:($2==r ? $10 : 1/0) with steps title sprintf('replica %d', r)\n"
         "set title 'generated tokens/s'\n"
         "set ylabel 'tokens/s'\n"
         "plot for [r=0:n-1] 'timeseries.csv' using 1:($2==r ? $7 : 1/0) with steps title sprintf('replica %d', r)\n"
         "set title 'prompt tokens/s served from the prefix cache, by tier (all replicas)'\n"
         "set ylabel 'prompt tokens/s'\n"
         "plot 'tier_hits.csv' using 1:2 with steps title 'pool', '' using 1:3 with steps title 'host tier', "
         "'' using 1:4 with steps title 'disk tier'\n"
         "unset multiplot\n";
}

}  // namespace

std::pair<double, double> prefix_hit_bounds(const sim_result& r) {
  const size_t n = r.requests.size();
  if (r.block_size <= 0 || n == 0) return {0, 0};
  const auto bs = static_cast<size_t>(r.block_size);
  std::vector<std::vector<uint64_t>> chains(n);
  std::vector<size_t> by_arrival, by_finish;
  for (size_t i = 0; i < n; i++) {
    chains[i] = kv::chain_hashes(r.requests[i].prompt, r.block_size);
    by_arrival.push_back(i);
    if (r.requests[i].finish_ns >= 0) by_finish.push_back(i);
  }
  const auto at = [&](auto key) {
    return [&r, key](size_t a, size_t b) {
      return std::pair(r.requests[a].*key, a) < std::pair(r.requests[b].*key, b);
    };
  };
  std::sort(by_arrival.begin(), by_arrival.end(), at(&request_record::arrival_ns));
  std::sort(by_finish.begin(), by_finish.end(), at(&request_record::finish_ns));
  // Only looked up, never iterated: the order of the sets decides nothing.
  std::unordered_set<uint64_t> arrived, finished;
  const auto held = [&](const std::unordered_set<uint64_t>& set, size_t i) {
    const std::vector<int32_t>& prompt = r.requests[i].prompt;
    const size_t cap = std::min(chains[i].size(), prompt.empty() ? 0 : (prompt.size() - 1) / bs);
    size_t k = 0;
    while (k < cap && set.count(chains[i][k]) != 0) k++;
    return static_cast<int64_t>(k * bs);
  };
  int64_t prompt = 0, hit_arrived = 0, hit_causal = 0;
  size_t f = 0;
  for (const size_t i : by_arrival) {
    for (; f < by_finish.size() && r.requests[by_finish[f]].finish_ns <= r.requests[i].arrival_ns; f++)
      finished.insert(chains[by_finish[f]].begin(), chains[by_finish[f]].end());
    hit_arrived += held(arrived, i);
    hit_causal += held(finished, i);
    prompt += static_cast<int64_t>(r.requests[i].prompt.size());
    arrived.insert(chains[i].begin(), chains[i].end());
  }
  if (prompt == 0) return {0, 0};
  return {static_cast<double>(hit_arrived) / static_cast<double>(prompt),
          static_cast<double>(hit_causal) / static_cast<double>(prompt)};
}

summary_metrics summarize(const sim_result& r, const slo& slos) {
  const latencies l = collect(r);
  summary_metrics m;
  int64_t num_good = 0, tokens = 0, prompt = 0, cached = 0;
  for (const request_record& q : r.requests) {
    prompt += q.prompt_tokens;
    cached += q.cached_tokens;
    m.preemptions += q.preemptions;
    m.recomputed_tokens += q.recomputed_tokens;
    if (!ok(q)) continue;
    m.num_completed++;
    tokens += q.output_tokens;
    const bool ttft_ok = slos.ttft_ms <= 0 || ms(q.first_token_ns - q.arrival_ns) <= slos.ttft_ms;
    const bool tpot_ok = slos.tpot_ms <= 0 || tpot_ms(q) <= slos.tpot_ms;
    num_good += ttft_ok && tpot_ok;
  }
  m.num_requests = static_cast<int64_t>(r.requests.size());
  m.seconds = std::max(1e-9, static_cast<double>(r.simulated_ns) / 1e9);
  m.ttft_ms = stats::summarize(l.ttft);
  m.tpot_ms = stats::summarize(l.tpot);
  m.itl_ms = stats::summarize(l.itl);
  m.e2e_ms = stats::summarize(l.e2e);
  m.request_throughput_per_s = static_cast<double>(m.num_completed) / m.seconds;
  m.output_token_throughput_per_s = static_cast<double>(tokens) / m.seconds;
  m.goodput_requests_per_s = static_cast<double>(num_good) / m.seconds;
  m.prefix_hit_rate = prompt ? static_cast<double>(cached) / static_cast<double>(prompt) : 0.0;
  std::tie(m.prefix_hit_bound_arrived, m.prefix_hit_bound_causal) = prefix_hit_bounds(r);
  m.preempted_ms = static_cast<double>(r.preempted_ns) / 1e6;
  m.num_steps = static_cast<int64_t>(r.steps.size());
  return m;
}

std::optional<moe_metrics> summarize_moe(const sim_result& r) {
  if (!r.moe) return std::nullopt;
  int64_t step_ns = 0;
  for (const step_record& s : r.steps) step_ns += s.duration_ns;
  const double steps = std::max<double>(1.0, static_cast<double>(step_ns));
  moe_metrics m;
  m.num_windows = static_cast<int64_t>(r.moe->window_moe_lb.size());
  m.moe_lb = stats::summarize(r.moe->window_moe_lb);
  m.num_reassignments = r.moe->num_reassignments;
  m.migration_ms = ms(r.moe->migration_ns);
  m.step_share = static_cast<double>(r.moe->compute_ns + r.moe->communication_ns) / steps;
  m.communication_share = static_cast<double>(r.moe->communication_ns) / steps;
  return m;
}

std::string moe_report_line(const sim_result& r) {
  const std::optional<moe_metrics> m = summarize_moe(r);
  if (!m) return "";
  return "moe: " + std::to_string(m->num_windows) + " windows, moe_lb mean " + num(m->moe_lb.mean) + " p99 " +
         num(m->moe_lb.p99) + ", " + std::to_string(m->num_reassignments) + " reassignments (migration " +
         num(m->migration_ms) + " ms), MoE " + num(100 * m->step_share) + "% of step time (communication " +
         num(100 * m->communication_share) + "%)";
}

std::string summary_json(const sim_result& r, const slo& slos, uint64_t seed) {
  const summary_metrics m = summarize(r, slos);
  std::string j = "{\n";
  j += "  \"seed\": " + std::to_string(seed) + ",\n";
  j += "  \"num_requests\": " + std::to_string(m.num_requests) + ",\n";
  j += "  \"num_completed\": " + std::to_string(m.num_completed) + ",\n";
  j += "  \"simulated_seconds\": " + num(m.seconds) + ",\n";
  j += "  \"ttft_ms\": " + stats_json(m.ttft_ms) + ",\n";
  j += "  \"tpot_ms\": " + stats_json(m.tpot_ms) + ",\n";
  j += "  \"itl_ms\": " + stats_json(m.itl_ms) + ",\n";
  j += "  \"e2e_ms\": " + stats_json(m.e2e_ms) + ",\n";
  j += "  \"request_throughput_per_s\": " + num(m.request_throughput_per_s) + ",\n";
  j += "  \"output_token_throughput_per_s\": " + num(m.output_token_throughput_per_s) + ",\n";
  j += "  \"slo\": {\"ttft_ms\": " + num(slos.ttft_ms) + ", \"tpot_ms\": " + num(slos.tpot_ms) + "},\n";
  j += "  \"goodput_requests_per_s\": " + num(m.goodput_requests_per_s) + ",\n";
  j += "  \"prefix_hit_rate\": " + num(m.prefix_hit_rate) + ",\n";
  j += "  \"prefix_hit_bound\": {\"arrived\": " + num(m.prefix_hit_bound_arrived) +
       ", \"causal\": " + num(m.prefix_hit_bound_causal) + "},\n";
  j += "  \"preemptions\": " + std::to_string(m.preemptions) + ",\n";
  j += "  \"recomputed_tokens\": " + std::to_string(m.recomputed_tokens) + ",\n";
  j += "  \"preempted_ms\": " + num(m.preempted_ms) + ",\n";
  j += "  \"host_tier\": {\"hit_tokens\": " + std::to_string(r.host_hit_tokens) +
       ", \"demoted_blocks\": " + std::to_string(r.demoted_blocks) +
       ", \"promoted_blocks\": " + std::to_string(r.promoted_blocks) +
       ", \"fetches\": " + std::to_string(r.tier_fetches) +
       ", \"fetches_declined\": " + std::to_string(r.tier_fetches_declined) + "},\n";
  j += "  \"disk_tier\": {\"written_blocks\": " + std::to_string(r.disk_written_blocks) +
       ", \"refused_blocks\": " + std::to_string(r.disk_refused_blocks) +
       ", \"hit_blocks\": " + std::to_string(r.disk_hit_blocks) +
       ", \"hit_tokens\": " + std::to_string(r.disk_hit_tokens) + "},\n";
  j += "  \"speculation\": {\"draft_rows\": " + std::to_string(r.draft_rows) +
       ", \"accepted_drafts\": " + std::to_string(r.accepted_drafts) + "},\n";
  if (const std::optional<moe_metrics> moe = summarize_moe(r))
    j += "  \"moe\": {\"windows\": " + std::to_string(moe->num_windows) + ", \"moe_lb\": {\"mean\": " +
         num(moe->moe_lb.mean) + ", \"p99\": " + num(moe->moe_lb.p99) + "}, \"reassignments\": " +
         std::to_string(moe->num_reassignments) + ", \"migration_ms\": " + num(moe->migration_ms) +
         ", \"step_share\": " + num(moe->step_share) + ", \"communication_share\": " +
         num(moe->communication_share) + "},\n";
  j += "  \"num_steps\": " + std::to_string(m.num_steps) + ",\n";
  j += "  \"batch_size_histogram\": " + batch_histogram_json(r.steps) + ",\n";
  j += "  \"event_log_sha256\": \"" + r.event_log_sha256 + "\"\n}\n";
  return j;
}

std::string sweep_csv_header(const std::vector<std::string>& keys) {
  std::string out = "point";
  for (const std::string& k : keys) out += "," + k;
  return out + ",num_requests,num_completed,simulated_seconds,request_throughput_per_s,"
               "output_token_throughput_per_s,goodput_requests_per_s,ttft_mean_ms,ttft_p50_ms,ttft_p99_ms,"
               "tpot_mean_ms,tpot_p50_ms,tpot_p99_ms,itl_p99_ms,e2e_p50_ms,e2e_p99_ms,prefix_hit_rate,preemptions,"
               "recomputed_tokens,preempted_ms,num_steps,event_log_sha256\n";
}

std::string sweep_csv_row(size_t point, const std::vector<std::string>& values, const sim_result& r,
                          const slo& slos) {
  const summary_metrics m = summarize(r, slos);
  std::string out = std::to_string(point);
  for (const std::string& v : values) out += "," + v;
  for (const std::string& field :
       {std::to_string(m.num_requests), std::to_string(m.num_completed), num(m.seconds),
        num(m.request_throughput_per_s), num(m.output_token_throughput_per_s), num(m.goodput_requests_per_s),
        num(m.ttft_ms.mean), num(m.ttft_ms.median), num(m.ttft_ms.p99), num(m.tpot_ms.mean), num(m.tpot_ms.median),
        num(m.tpot_ms.p99), num(m.itl_ms.p99), num(m.e2e_ms.median), num(m.e2e_ms.p99), num(m.prefix_hit_rate),
        std::to_string(m.preemptions), std::to_string(m.recomputed_tokens), num(m.preempted_ms), std::to_string(m.num_steps),
        r.event_log_sha256})
    out += "," + field;
  return out + "\n";
}

std::string cdf_data(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::string out;
  for (size_t i = 0; i < values.size(); i++) out += num(values[i]) + " " + num((i + 1.0) / values.size()) + "\n";
  return out;
}

expected<void> write_plot_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files,
                                const std::string& script) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(errc::io_error, "cannot create output directory " + dir + ": " + ec.message());
  const fs::path d(dir);
  for (const auto& [name, text] : files)
    if (auto ok = write_file(d / name, text); !ok) return ok;
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    const std::string cmd = "cd '" + d.string() + "' && gnuplot " + script;
    if (std::system(cmd.c_str()) != 0) return fail(errc::internal, "gnuplot failed on " + (d / script).string());
  }
  return {};
}

expected<void> write_report(const std::string& dir, const sim_result& r, const slo& slos, uint64_t seed) {
  const latencies l = collect(r);
  std::string script = plot_script;
  std::vector<std::pair<std::string, std::string>> files = {
      {"requests.csv", requests_csv(r)}, {"summary.json", summary_json(r, slos, seed)},
      {"ttft_cdf.dat", cdf_data(l.ttft)}, {"e2e_cdf.dat", cdf_data(l.e2e)}, {"throughput.dat", throughput_data(r)}};
  if (r.sample_every_ns > 0) {
    timeseries_files t = timeseries_csv(r);
    files.emplace_back("timeseries.csv", std::move(t.csv));
    files.emplace_back("tier_hits.csv", std::move(t.tier_hits));
    script += timeseries_plot_script(r.num_replicas);
  }
  files.emplace_back("plots.gp", script);
  return write_plot_files(dir, files, "plots.gp");
}

}  // namespace troupe::sim
