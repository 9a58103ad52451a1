// The simulator: SHA-256, simulation topologies, bit-identical replay, real-token mode equal to
// the reference generator, and exact virtual times on a hand-computed trace.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/generate/reference_generator.hpp"
#include "sim/cost_executor.hpp"
#include "sim/modelled_tier.hpp"
#include "sim/report.hpp"
#include "sim/sha256.hpp"
#include "sim/sim_topology.hpp"
#include "sim/simulation.hpp"
#include "sim/sweep.hpp"
#include "sim/trace_events.hpp"
#include "sim/workload.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/sim_fixtures.hpp"

namespace troupe::sim {
namespace {

std::string hash_of(const std::string& text) {
  sha256 h;
  h.update(text);
  return h.hex_digest();
}

TEST(Sha256, KnownAnswers) {  // FIPS 180-4 examples
  EXPECT_EQ(hash_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hash_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hash_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  sha256 pieces;  // the same bytes fed in odd pieces
  const std::string million(1000000, 'a');
  for (size_t i = 0; i < million.size(); i += 997) pieces.update(std::string_view(million).substr(i, 997));
  EXPECT_EQ(pieces.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

constexpr const char* tiny_topology = troupe::testing::tiny_sim_topology;

using troupe::testing::sim_run_options;

sim_topology parse_tiny(const std::string& extra = "") {
  auto t = parse_sim_topology(std::string(tiny_topology) + extra, "tiny.toml", TROUPE_SOURCE_DIR);
  EXPECT_TRUE(t) << t.error().message;
  return *t;
}

TEST(SimTopology, DerivesThePoolFromMemory) {
  const sim_topology t = parse_tiny();
  EXPECT_EQ(t.kv_bytes_per_token, 2 * 2 * 32 * 2);  // K and V, 2 layers, kv_dim 32, fp16
  EXPECT_EQ(t.engine.num_kv_blocks, static_cast<int32_t>(0.01 * 1073741824.0 / (16 * 256)));
  EXPECT_EQ(t.tokens, token_mode::synthetic);
  EXPECT_EQ(t.cost.step_ns, 1000);
}

TEST(SimTopology, TheKvCacheTypeSetsTheBytesOfABlock) {
  // tiny: 2 layers, KV rows of 32; q8_0 takes 34 bytes per 32 values, f32 4 per value.
  for (const auto& [dtype, bytes] : {std::pair{"q8_0", 2 * 2 * 34}, std::pair{"f32", 2 * 2 * 32 * 4}}) {
    auto t = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, {{"engine.kv_cache_dtype", dtype}});
    ASSERT_TRUE(t) << t.error().message;
    EXPECT_EQ(t->kv_bytes_per_token, bytes) << dtype;
    EXPECT_EQ(t->engine.num_kv_blocks, static_cast<int32_t>(0.01 * 1073741824.0 / (16.0 * bytes))) << dtype;
  }
  std::string text = tiny_topology;
  text.replace(text.find("max_context = 512\n"), 18, "max_context = 512\nkv_bytes_per_value = 2\n");
  auto both = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR, {{"engine.kv_cache_dtype", "f32"}});
  ASSERT_FALSE(both);
  EXPECT_EQ(both.error().message, "tiny.toml: [model] kv_bytes_per_value = 2.000000 disagrees with [engine] "
                                  "kv_cache_dtype = \"f32\": give one of them");
  EXPECT_TRUE(parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR, {{"engine.kv_cache_dtype", "f16"}}));
}

TEST(SimTopology, ShippedExamplesParse) {
  for (const char* name : {"sim-llama7b.toml", "sim-stories260K-cpu.toml"}) {
    auto t = load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/" + name);
    EXPECT_TRUE(t) << name << ": " << t.error().message;
  }
}

TEST(SimTopology, BadFilesNameTheProblem) {
  const std::pair<std::string, std::string> cases[] = {
      {std::string(tiny_topology) + "bogus = 1\n", "tiny.toml:23: [cost]: unknown key 'bogus'"},
      {std::string(tiny_topology) + "tokens = \"magic\"\n", "tokens must be \"synthetic\" or \"real\""},
      {std::string(tiny_topology) + "calibration = \"x.toml\"\n", "not both"},
      {"[model]\nn_layers = 2\n[hardware]\nkv_memory_gib = 1\n[cost]\nkv_read_token_ns = 1\n",
       "[cost] needs all four of step_ns, token_ns, sampled_row_ns and attention_token_ns (kv_read_token_ns is optional)"},
      {"[model]\nn_layers = 2\n[hardware]\nkv_memory_gib = 1\n[cost]\nstep_ns = 1\ntoken_ns = 1\n"
       "sampled_row_ns = 1\nattention_token_ns = 1\n", "needs either a checkpoint or all of"},
      {"[model]\nn_layers = 0\n", "tiny.toml:2: [model] n_layers = 0.000000 is outside"},
      {"[model\n", "tiny.toml:1:"},
      {std::string(tiny_topology) + "[load_balancer]\nrouter = \"fastest\"\n",
       "tiny.toml:24: [load_balancer] router: unknown router 'fastest'; known: auto, least_loaded, round_robin, power_of_two, prefix_affinity"},
      {std::string(tiny_topology) + "[load_balancer]\npolicy = \"fcfs\"\n", "tiny.toml:24: [load_balancer]: unknown key 'policy'"},
      {std::string(tiny_topology) + "[load_balancer]\nrate_limit_per_s = -1\n",
       "tiny.toml:24: [load_balancer] rate_limit_per_s = -1.000000 is outside [0.000000, 1000000000.000000]"},
      {std::string(tiny_topology) + "[load_balancer]\nrate_limit_burst = 0\n",
       "tiny.toml:24: [load_balancer] rate_limit_burst = 0.000000 is outside [1.000000, 1000000.000000]"},
  };
  for (const auto& [text, message] : cases) {
    auto t = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
    ASSERT_FALSE(t) << message;
    EXPECT_EQ(t.error().code, errc::malformed_file);
    EXPECT_NE(t.error().message.find(message), std::string::npos) << t.error().message;
  }
  std::string small = tiny_topology;
  small.replace(small.find("0.01"), 4, "0.0001");
  auto t = parse_sim_topology(small, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(t);
  EXPECT_NE(t.error().message.find("fewer than one max_context sequence needs"), std::string::npos);
  EXPECT_EQ(load_sim_topology("/nonexistent.toml").error().code, errc::io_error);
}

TEST(Simulation, HandComputedTimes) {
  // One request at t = 0: 16 prompt tokens, 3 new. Cost = 1000 + 10/token + 100/sample +
  // 1/attended token. Step 0 prefills 16 tokens (attention 16*17/2 = 136): 1396 ns. Step 1
  // (planned while 0 runs) decodes position 16 (attention 17): 1127 ns, done at 2523. Step 2,
  // planned when step 0 completes, decodes position 17 (attention 18): 1128 ns, done at 3651.
  const sim_options o = sim_run_options(parse_tiny(), {trace_request{0, 16, 3, {}}}, 7);
  auto r = run_simulation(o);
  ASSERT_TRUE(r) << r.error().message;
  const request_record& q = r->requests.at(0);
  EXPECT_EQ(q.finish, "length");
  EXPECT_EQ(q.output_tokens, 3);
  EXPECT_EQ(q.arrival_ns, 0);
  EXPECT_EQ(q.scheduled_ns, 0);
  EXPECT_EQ(q.first_token_ns, 1396);
  EXPECT_EQ(q.finish_ns, 3651);
  EXPECT_EQ(q.itl_ns, (std::vector<int64_t>{1127, 1128}));
  ASSERT_EQ(r->steps.size(), 3u);
  for (size_t i = 0; i < 3; i++) EXPECT_EQ(r->steps[i].num_rows, 1);
  EXPECT_EQ(r->steps[0].start_ns, 0);
  EXPECT_EQ(r->steps[0].duration_ns, 1396);
  EXPECT_EQ(r->steps[0].num_prefill_tokens, 16);
  EXPECT_EQ(r->steps[1].start_ns, 1396);
  EXPECT_EQ(r->steps[1].duration_ns, 1127);
  EXPECT_EQ(r->steps[1].num_decode_rows, 1);
  EXPECT_EQ(r->steps[2].start_ns, 2523);
}

TEST(Simulation, APlanPaysTheFirstWriteToEachPoolBlockItNamesFirst) {
  // HandComputedTimes with a first-touch price of 500 ns a page (tiny: a block of 16 positions
  // x 256 bytes is one page): step 0 writes the first block, step 1 the second (position 16),
  // step 2 the second again, already in.
  sim_topology t = parse_tiny();
  t.cost.first_touch_page_ns = 500;
  auto r = run_simulation(sim_run_options(t, {trace_request{0, 16, 3, {}}}, 7));
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->steps.size(), 3u);
  EXPECT_EQ(r->steps[0].duration_ns, 1396 + 500);
  EXPECT_EQ(r->steps[1].duration_ns, 1127 + 500);
  EXPECT_EQ(r->steps[2].duration_ns, 1128);
  EXPECT_EQ(r->requests.at(0).finish_ns, 3651 + 1000);
}

TEST(Simulation, TraceEventsOfAHandComputedRunAreExact) {
  // The run of HandComputedTimes (steps at 0, 1396 and 2523 ns) as a Chrome/Perfetto trace.
  sim_options o = sim_run_options(parse_tiny(), {trace_request{0, 16, 3, {}}}, 7);
  o.sample_every_ns = 0;
  auto r = run_simulation(o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->samples.empty());
  EXPECT_EQ(trace_events_json(*r),
            R"({"displayTimeUnit":"ms","traceEvents":[
{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"requests"}},
{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"engine0"}},
{"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"executor"}},
{"name":"step","cat":"step","ph":"X","pid":1,"tid":1,"ts":0.000,"dur":1.396,"args":{"step":0,"rows":1,"decode_rows":0,"prefill_tokens":16,"samples":1}},
{"name":"step","cat":"step","ph":"X","pid":1,"tid":1,"ts":1.396,"dur":1.127,"args":{"step":1,"rows":1,"decode_rows":1,"prefill_tokens":0,"samples":1}},
{"name":"step","cat":"step","ph":"X","pid":1,"tid":1,"ts":2.523,"dur":1.128,"args":{"step":2,"rows":1,"decode_rows":1,"prefill_tokens":0,"samples":1}},
{"name":"request 0","cat":"request","ph":"b","pid":0,"tid":0,"id":0,"ts":0.000,"args":{"prompt_tokens":16,"output_tokens":3,"cached_tokens":0,"preemptions":0,"finish":"length"}},
{"name":"queued","cat":"request","ph":"b","pid":0,"tid":0,"id":0,"ts":0.000},
{"name":"queued","cat":"request","ph":"e","pid":0,"tid":0,"id":0,"ts":0.000},
{"name":"prefill","cat":"request","ph":"b","pid":0,"tid":0,"id":0,"ts":0.000},
{"name":"prefill","cat":"request","ph":"e","pid":0,"tid":0,"id":0,"ts":1.396},
{"name":"decode","cat":"request","ph":"b","pid":0,"tid":0,"id":0,"ts":1.396},
{"name":"decode","cat":"request","ph":"e","pid":0,"tid":0,"id":0,"ts":3.651},
{"name":"request 0","cat":"request","ph":"e","pid":0,"tid":0,"id":0,"ts":3.651}
]}
)");
}

/// A loaded synthetic run on the tiny topology: 2 replicas with half its KV memory, arrivals
/// faster than they serve (a queue forms, KV runs out, requests are preempted).
constexpr int64_t busy_sample_ns = 10'000;
sim_options busy_run(int64_t sample_every_ns) {
  synthetic_options s;
  s.num_requests = 400;
  s.rate_per_s = 1e6;
  s.cv = 3;
  s.input_mean = 200;
  s.output_mean = 60;
  s.seed = 21;
  std::string topology = tiny_topology;
  topology.replace(topology.find("[engine]\n"), 9, "[engine]\nreplicas = 2\n");
  topology.replace(topology.find("0.01"), 4, "0.003");
  auto t = parse_sim_topology(topology, "tiny.toml", TROUPE_SOURCE_DIR);
  EXPECT_TRUE(t) << t.error().message;
  sim_options o = sim_run_options(*t, synthetic_workload(s), 9);
  o.sample_every_ns = sample_every_ns;
  return o;
}

TEST(Simulation, SamplingReplicasChangesNoEventAndSamplesEachStepInterval) {
  auto quiet = run_simulation(busy_run(0));
  auto sampled = run_simulation(busy_run(busy_sample_ns));
  ASSERT_TRUE(quiet && sampled);
  EXPECT_EQ(quiet->event_log_sha256, sampled->event_log_sha256);  // the queries are read-only
  EXPECT_EQ(summary_json(*quiet, {}, 9), summary_json(*sampled, {}, 9));
  // At most one sample per replica and interval, taken when it was sent a plan.
  std::set<std::pair<int64_t, int32_t>> planned;
  for (const step_record& s : sampled->steps) planned.insert({s.start_ns / busy_sample_ns, s.replica});
  std::set<std::pair<int64_t, int32_t>> sampled_at;
  int64_t peak_waiting = 0, last_preemptions[2] = {0, 0};
  for (const replica_sample& s : sampled->samples) {
    EXPECT_TRUE(sampled_at.insert({s.time_ns / busy_sample_ns, s.replica}).second) << s.time_ns;
    peak_waiting = std::max(peak_waiting, s.num_waiting);
    EXPECT_GE(s.num_preemptions, last_preemptions[s.replica]);  // cumulative
    last_preemptions[s.replica] = s.num_preemptions;
    EXPECT_GE(s.num_running, 0);
  }
  EXPECT_GT(peak_waiting, 0);
  EXPECT_GT(last_preemptions[0] + last_preemptions[1], 0);
  EXPECT_GT(sampled_at.size(), planned.size() / 2);
}

TEST(Simulation, TraceEventsHaveOneSlicePerStepAndBalancedRequestSlices) {
  auto r = run_simulation(busy_run(busy_sample_ns));
  ASSERT_TRUE(r);
  const nlohmann::json j = nlohmann::json::parse(trace_events_json(*r));
  ASSERT_TRUE(j.at("traceEvents").is_array());
  const nlohmann::json summary = nlohmann::json::parse(summary_json(*r, {}, 9));
  int64_t slices = 0, counters = 0;
  std::map<std::pair<int64_t, std::string>, int> open;  // (request, slice name) -> b minus e
  for (const nlohmann::json& e : j.at("traceEvents")) {
    const std::string ph = e.at("ph");
    ASSERT_TRUE(e.contains("pid") && e.contains("name")) << e.dump();
    if (ph == "X") {
      slices++;
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
    if (ph == "C") counters++;
    if (ph == "b") open[{e.at("id").get<int64_t>(), e.at("name").get<std::string>()}]++;
    if (ph == "e") open[{e.at("id").get<int64_t>(), e.at("name").get<std::string>()}]--;
  }
  EXPECT_EQ(slices, summary.at("num_steps").get<int64_t>());
  EXPECT_EQ(counters, 2 * static_cast<int64_t>(r->samples.size()));
  EXPECT_EQ(open.size(), 4 * r->requests.size());  // request N, queued, prefill, decode
  for (const auto& [key, n] : open) EXPECT_EQ(n, 0) << "request " << key.first << " " << key.second;
  EXPECT_EQ(trace_events_json(*r), trace_events_json(*run_simulation(busy_run(busy_sample_ns))));
}

TEST(SimulationReport, TimeSeriesHasARowPerReplicaAndIntervalWithSteps) {
  auto r = run_simulation(busy_run(busy_sample_ns));
  ASSERT_TRUE(r);
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "troupe-sim-timeseries";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_report(dir.string(), *r, {}, 9));
  std::ifstream in(dir / "timeseries.csv");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "time_s,replica,steps,mean_rows,decode_rows,prefill_tokens,tokens_per_s,waiting,running,"
                  "kv_blocks_in_use,preemptions,pool_hits_per_s,host_hits_per_s,disk_hits_per_s");
  int64_t rows = 0, steps = 0, preemptions = 0, generated = 0;
  std::set<std::pair<int64_t, int32_t>> keys;
  while (std::getline(in, line)) {
    rows++;
    std::vector<std::string> f;
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) f.push_back(cell);
    ASSERT_GE(f.size(), 7u) << line;
    keys.insert({std::llround(std::stod(f[0]) * 1e9 / busy_sample_ns), std::stoi(f[1])});
    steps += std::stoll(f[2]);
    generated += std::llround(std::stod(f[6]) * busy_sample_ns / 1e9);  // tokens/s over the interval
    if (f.size() == 14) {
      preemptions += std::stoll(f[10]);
      for (size_t k = 11; k < 14; k++) EXPECT_GE(std::stod(f[k]), 0.0) << line;
      EXPECT_EQ(f[12], "0") << "no host tier, no host hits";
    }
  }
  std::set<std::pair<int64_t, int32_t>> intervals;  // with a step or a sample
  for (const step_record& s : r->steps) intervals.insert({s.start_ns / busy_sample_ns, s.replica});
  for (const replica_sample& s : r->samples) intervals.insert({s.time_ns / busy_sample_ns, s.replica});
  EXPECT_EQ(rows, static_cast<int64_t>(intervals.size()));
  EXPECT_EQ(keys, intervals);
  EXPECT_EQ(steps, static_cast<int64_t>(r->steps.size()));
  int64_t sampled = 0;
  for (const step_record& s : r->steps) sampled += s.num_samples;
  EXPECT_EQ(generated, sampled);
  int64_t last[2] = {0, 0};  // preemptions: deltas of the cumulative samples
  for (const replica_sample& s : r->samples) last[s.replica] = s.num_preemptions;
  EXPECT_EQ(preemptions, last[0] + last[1]);
  // tier_hits.csv: one line per interval in which some replica was sampled.
  std::set<int64_t> sampled_intervals;
  for (const replica_sample& s : r->samples) sampled_intervals.insert(s.time_ns / busy_sample_ns);
  std::ifstream tiers(dir / "tier_hits.csv");
  int64_t tier_lines = 0;
  while (std::getline(tiers, line)) tier_lines++;
  EXPECT_EQ(tier_lines, static_cast<int64_t>(sampled_intervals.size()));
  std::filesystem::remove_all(dir);
}

/// Each replica's sampled tokens in a run of four requests 100 ms apart (each done, and reported
/// done to the balancer, long before the next arrives) generating 3, 5, 7 and 9 tokens, on two
/// replicas with `router`.
std::vector<int64_t> samples_per_replica(const std::string& router) {
  std::string topology = tiny_topology;
  topology.replace(topology.find("[engine]\n"), 9, "[engine]\nreplicas = 2\n");
  topology += "[load_balancer]\nrouter = \"" + router + "\"\n";
  auto t = parse_sim_topology(topology, "tiny.toml", TROUPE_SOURCE_DIR);
  EXPECT_TRUE(t) << t.error().message;
  std::vector<trace_request> w;
  for (int32_t i = 0; i < 4; i++) w.push_back(trace_request{i * 100'000'000, 16, 3 + 2 * i, {}});
  auto r = run_simulation(sim_run_options(*t, w, 7));
  EXPECT_TRUE(r) << r.error().message;
  std::vector<int64_t> out(2, 0);
  for (const step_record& s : r->steps) out.at(static_cast<size_t>(s.replica)) += s.num_samples;
  return out;
}

TEST(Simulation, TheTopologysRouterPlacesRequestsOnReplicas) {
  // least_loaded: every request finds both replicas idle and takes the lower index.
  EXPECT_EQ(samples_per_replica("least_loaded"), (std::vector<int64_t>{3 + 5 + 7 + 9, 0}));
  EXPECT_EQ(samples_per_replica("round_robin"), (std::vector<int64_t>{3 + 7, 5 + 9}));
}

/// Tokens generated per replica and the last two requests' cached prompt tokens, under `router`:
/// the scenario of ActorsDeterministic.PrefixAffinitySendsAContinuationToTheEngineHoldingItsPrefix.
/// Prompts X and Y (hash ids 1 and 2: 512 shared tokens each, then 88 of their own) arrive at
/// once and generate 3 and 5 tokens; X's continuation (7 tokens) arrives after both ended, then
/// Y's (9 tokens).
std::pair<std::vector<int64_t>, std::vector<int32_t>> prefix_run(const std::string& router) {
  std::string topology = tiny_topology;
  topology.replace(topology.find("max_context = 512"), 17, "max_context = 1024");
  topology.replace(topology.find("[engine]\n"), 9, "[engine]\nreplicas = 2\n");
  topology += "[load_balancer]\nrouter = \"" + router + "\"\n";
  auto t = parse_sim_topology(topology, "tiny.toml", TROUPE_SOURCE_DIR);
  EXPECT_TRUE(t) << t.error().message;
  const std::vector<trace_request> w = {
      {0, 600, 3, {1}}, {0, 600, 5, {2}}, {100'000'000, 600, 7, {1}}, {200'000'000, 600, 9, {2}}};
  auto r = run_simulation(sim_run_options(*t, w, 7));
  EXPECT_TRUE(r) << r.error().message;
  std::vector<int64_t> tokens(2, 0);
  for (const step_record& s : r->steps) tokens.at(static_cast<size_t>(s.replica)) += s.num_samples;
  return {tokens, {r->requests[2].cached_tokens, r->requests[3].cached_tokens}};
}

TEST(Simulation, PrefixAffinitySendsAContinuationToTheReplicaHoldingItsPrefix) {
  // As on real engines: least_loaded sends both continuations to the idle replica 0, where Y's
  // prefix is not cached; prefix_affinity sends each to the replica holding its 512-token prefix.
  using run = std::pair<std::vector<int64_t>, std::vector<int32_t>>;
  EXPECT_EQ(prefix_run("least_loaded"), (run{{3 + 7 + 9, 5}, {512, 0}}));
  EXPECT_EQ(prefix_run("prefix_affinity"), (run{{3 + 7, 5 + 9}, {512, 512}}));
  auto bad = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, {{"load_balancer.prefix_weight", "-1"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("prefix_weight"), std::string::npos) << bad.error().message;
}

TEST(Simulation, TheBalancersRateLimitRefusesRequestsOverItAsOverloaded) {
  // Ten requests at once, then one 1.5 s later; 2 requests/s with bursts of 4: the first four
  // are admitted, the next six refused, and the late one admitted.
  auto t = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR,
                              {{"load_balancer.rate_limit_per_s", "2"}, {"load_balancer.rate_limit_burst", "4"}});
  ASSERT_TRUE(t) << t.error().message;
  std::vector<trace_request> w(10, trace_request{0, 16, 3, {}});
  w.push_back(trace_request{1'500'000'000, 16, 3, {}});
  auto r = run_simulation(sim_run_options(*t, w, 7));
  ASSERT_TRUE(r) << r.error().message;
  std::vector<std::string> finish;
  for (const request_record& q : r->requests) finish.push_back(q.finish);
  const std::string o = "overloaded";
  EXPECT_EQ(finish, (std::vector<std::string>{"length", "length", "length", "length", o, o, o, o, o, o, "length"}));
  EXPECT_EQ(r->requests[4].output_tokens, 0);
}

/// The order in which requests finish, by index, under `[engine] scheduler` settings `set`:
/// request 0 (56 tokens of work) alone in a one-sequence engine, then three requests arriving
/// while it runs whose work shrinks: 46, 36, 26 tokens.
std::vector<int64_t> finish_order_under(sim::topology_overrides set) {
  set.push_back({"engine.max_num_seqs", "1"});
  auto t = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, set);
  EXPECT_TRUE(t) << t.error().message;
  auto r = run_simulation(sim_run_options(*t, {{0, 16, 40, {}}, {1000, 16, 30, {}}, {2000, 16, 20, {}}, {3000, 16, 10, {}}}, 7));
  EXPECT_TRUE(r) << r.error().message;
  std::vector<request_record> done = r->requests;
  std::stable_sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.finish_ns < b.finish_ns; });
  std::vector<int64_t> order;
  for (const request_record& q : done) order.push_back(q.index);
  return order;
}

TEST(Simulation, TheTopologysSchedulerPolicyOrdersTheQueue) {
  // fcfs and priority (all priorities 0) serve by arrival; sjf with aging 1 serves the shortest
  // predicted work (prompt + max_tokens) first; sjf's default aging (256 tokens per later
  // arrival) outweighs these 10-token differences, so it serves by arrival too.
  EXPECT_EQ(finish_order_under({{"engine.scheduler", "fcfs"}}), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(finish_order_under({}), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(finish_order_under({{"engine.scheduler", "sjf"}, {"engine.sjf_aging_tokens", "1"}}),
            (std::vector<int64_t>{0, 3, 2, 1}));
  EXPECT_EQ(finish_order_under({{"engine.scheduler", "sjf"}}), (std::vector<int64_t>{0, 1, 2, 3}));
  auto bad = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, {{"engine.scheduler", "lifo"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[engine] scheduler: unknown scheduler 'lifo'"), std::string::npos)
      << bad.error().message;
}

TEST(SimTopology, SettingsOverTheFileAreTypedAndValidatedLikeTheFile) {
  auto t = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR,
                              {{"engine.replicas", "3"}, {"load_balancer.router", "round_robin"},
                               {"hardware.kv_memory_gib", "0.02"}});
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->replicas, 3);
  EXPECT_EQ(t->router, "round_robin");
  EXPECT_EQ(t->kv_memory_gib, 0.02);
  const std::pair<sim::topology_overrides, std::string> bad[] = {
      {{{"replicas", "3"}}, "a topology setting is TABLE.KEY=VALUE (e.g. engine.replicas=4), got 'replicas=3'"},
      {{{"engine.", "3"}}, "a topology setting is TABLE.KEY=VALUE"},
      {{{"a.b.c", "3"}}, "a topology setting is TABLE.KEY=VALUE"},
      {{{"engine.replicas", "0"}}, "tiny.toml: (set on the command line) [engine] replicas = 0.000000 is outside [1.000000, 4096.000000]"},
      {{{"engine.replicas", "two"}}, "tiny.toml: (set on the command line) [engine] replicas: expected a number"},
      {{{"engine.replica", "2"}}, "tiny.toml: (set on the command line) [engine]: unknown key 'replica'"},
      {{{"load_balancer.router", "7"}}, "[load_balancer] router: expected a string"},
      {{{"model.name", "x"}, {"model", "y"}}, "a topology setting is TABLE.KEY=VALUE"},
      {{{"cost.step_ns.x", "1"}}, "a topology setting is TABLE.KEY=VALUE"},
  };
  for (const auto& [set, message] : bad) {
    auto r = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, set);
    ASSERT_FALSE(r) << message;
    EXPECT_NE(r.error().message.find(message), std::string::npos) << r.error().message;
  }
}

TEST(Sweep, AxesParseAndTheGridVariesTheFirstAxisSlowest) {
  auto rate = parse_sweep_axis("time_scale=1,2,4");
  auto router = parse_sweep_axis("load_balancer.router=least_loaded,round_robin");
  ASSERT_TRUE(rate && router);
  EXPECT_EQ(rate->key, "time_scale");
  EXPECT_EQ(rate->values, (std::vector<std::string>{"1", "2", "4"}));
  auto grid = sweep_grid({*rate, *router}, 100);
  ASSERT_TRUE(grid);
  using row = std::vector<std::string>;
  EXPECT_EQ(*grid, (std::vector<row>{{"1", "least_loaded"}, {"1", "round_robin"}, {"2", "least_loaded"},
                                     {"2", "round_robin"}, {"4", "least_loaded"}, {"4", "round_robin"}}));
  EXPECT_EQ(*sweep_grid({}, 1), (std::vector<row>{row{}}));
  EXPECT_FALSE(sweep_grid({*rate, *router}, 5));
  EXPECT_EQ(sweep_grid({*rate, *rate}, 100).error().message, "--sweep time_scale is given twice");
  const std::pair<const char*, const char*> bad[] = {
      {"time_scale", "--sweep takes KEY=V1,V2,..."},
      {"=1,2", "--sweep takes KEY=V1,V2,..."},
      {"time_scale=", "--sweep time_scale: an empty value in 'time_scale='"},
      {"time_scale=1,,2", "--sweep time_scale: an empty value"},
      {"time_scale=1,2,", "--sweep time_scale: an empty value"},
      {"time_scale=1,1", "--sweep time_scale: value '1' is given twice"},
      {"x=a'b", "quotes, backslashes and newlines are not allowed"},
  };
  for (const auto& [spec, message] : bad) {
    auto a = parse_sweep_axis(spec);
    ASSERT_FALSE(a) << spec;
    EXPECT_EQ(a.error().code, errc::invalid_argument);
    EXPECT_NE(a.error().message.find(message), std::string::npos) << a.error().message;
  }
}

TEST(Sweep, ThePlotHasALinePerCombinationOfTheOtherAxesReadingTheirColumns) {
  const std::vector<sweep_axis> axes = {{"time_scale", {"1", "2"}},
                                        {"load_balancer.router", {"a", "b"}},
                                        {"engine.replicas", {"1", "2", "4"}}};
  const std::string script = sweep_plot_script(axes);
  EXPECT_NE(script.find("G = 6\n"), std::string::npos);
  EXPECT_NE(script.find("title 'load_balancer.router=b engine.replicas=4'"), std::string::npos);
  // goodput is column 3 keys + 7 = 10; p99 TTFT 13; p99 TPOT 16; prefix hit rate 20.
  EXPECT_NE(script.find("(int($1) % G == 5 ? $10 : 1/0):xtic(2)"), std::string::npos);
  EXPECT_NE(script.find("? $13 :"), std::string::npos);
  EXPECT_NE(script.find("? $16 :"), std::string::npos);
  EXPECT_NE(script.find("? $20 :"), std::string::npos);
  const std::string header = sweep_csv_header({"time_scale", "load_balancer.router", "engine.replicas"});
  std::vector<std::string> columns;
  std::stringstream in(header.substr(0, header.size() - 1));
  for (std::string c; std::getline(in, c, ',');) columns.push_back(c);
  EXPECT_EQ(columns.at(10 - 1), "goodput_requests_per_s");
  EXPECT_EQ(columns.at(13 - 1), "ttft_p99_ms");
  EXPECT_EQ(columns.at(16 - 1), "tpot_p99_ms");
  EXPECT_EQ(columns.at(20 - 1), "prefix_hit_rate");
}

TEST(Simulation, HandComputedTimesWithKvReads) {
  // As above plus 2 ns per KV position a chunk reads: step 0 reads 16 (+32 ns: 1428), step 1
  // reads 17 (+34: 1161, done at 2589), step 2 reads 18 (+36: 1164, done at 3753).
  const sim_options o = sim_run_options(parse_tiny("kv_read_token_ns = 2\n"), {trace_request{0, 16, 3, {}}}, 7);
  auto r = run_simulation(o);
  ASSERT_TRUE(r) << r.error().message;
  const request_record& q = r->requests.at(0);
  EXPECT_EQ(q.first_token_ns, 1428);
  EXPECT_EQ(q.finish_ns, 3753);
  EXPECT_EQ(q.itl_ns, (std::vector<int64_t>{1161, 1164}));
}

TEST(Simulation, SameSeedReplaysBitForBitAndAnotherSeedDiffers) {
  synthetic_options s;
  s.num_requests = 300;
  s.rate_per_s = 400;
  s.cv = 2;
  s.input_mean = 120;
  s.output_mean = 40;
  s.seed = 11;
  const sim_topology t = parse_tiny();
  const sim_options o = sim_run_options(t, synthetic_workload(s), 5);
  auto a = run_simulation(o);
  auto b = run_simulation(o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);
  EXPECT_EQ(summary_json(*a, {}, 5), summary_json(*b, {}, 5));
  EXPECT_GT(a->num_events, 600);
  s.seed = 12;  // a different run seed draws a different workload
  const sim_options other = sim_run_options(t, synthetic_workload(s), 6);
  auto c = run_simulation(other);
  ASSERT_TRUE(c);
  EXPECT_NE(a->event_log_sha256, c->event_log_sha256);
  for (const request_record& q : a->requests) {  // nothing lost, each ends by its length
    EXPECT_EQ(q.finish, "length");
    EXPECT_EQ(q.output_tokens, s.output_mean ? static_cast<int32_t>(q.tokens.size()) : 0);
  }
}

TEST(PrefixReuseBound, FollowsHashIdChainsExactly) {
  const std::vector<trace_request> w = {
      trace_request{0, 1000, 1, {1, 2}},     // nothing before it
      trace_request{1, 1100, 1, {1, 2, 3}},  // chain 1 -> 2 seen: 2 blocks
      trace_request{2, 600, 1, {2, 3}},      // id 2 seen, but not as a first block: none
      trace_request{3, 700, 1, {1, 2}},      // 2 blocks = 1024 tokens, capped at its 700
  };
  const prefix_reuse b = prefix_reuse_bound(w, 512);
  EXPECT_EQ(b.num_prompt_tokens, 3400);
  EXPECT_EQ(b.num_reusable_tokens, 1024 + 700);
}

TEST(Simulation, PrefixHitBoundsCountEarlierPromptsAndForTheCausalOneOnlyFinishedRequests) {
  // Blocks of 4 tokens. Request 1 shares request 0's two full blocks while 0 still runs; 2
  // shares them after 0 finished (1 still runs); 3 would share one but a hit leaves a token to
  // compute; 4 arrives before anything finished that it shares.
  sim_result r;
  r.block_size = 4;
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b = {1, 2, 3, 4, 5, 6, 7, 8, 10, 11};
  const auto request = [](int64_t arrival, int64_t finish, std::vector<int32_t> prompt) {
    request_record q;
    q.arrival_ns = arrival;
    q.finish_ns = finish;
    q.prompt_tokens = static_cast<int32_t>(prompt.size());
    q.prompt = std::move(prompt);
    return q;
  };
  r.requests = {request(0, 100, a), request(50, 300, b), request(200, -1, b), request(200, 250, {1, 2, 3, 4}),
                request(20, 60, {5, 6, 7, 8, 9})};
  // Arrived: 1 holds 8 (0's), 2 holds 8, 3 none (capped), 4 none; causal: only 2's 8 (0 done).
  const auto [arrived, causal] = prefix_hit_bounds(r);
  EXPECT_DOUBLE_EQ(arrived, 16.0 / 38);
  EXPECT_DOUBLE_EQ(causal, 8.0 / 38);
  r.block_size = 0;
  EXPECT_EQ(prefix_hit_bounds(r), std::make_pair(0.0, 0.0));
}

/// Runs `workload` (shaped to the topology's context) on the 7B simulation topology with the
/// settings `set`; returns the simulated prefix hit rate after checking each request's share,
/// and the workload's bound.
std::pair<double, prefix_reuse> hit_rate_and_bound(std::vector<trace_request> workload, int32_t check_every,
                                                   const topology_overrides& set = {}) {
  auto t = load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/sim-llama7b.toml", set);
  EXPECT_TRUE(t) << t.error().message;
  workload_options shape;
  shape.max_context = t->model.seq_len;
  sim_options o = sim_run_options(*t, shape_workload(std::move(workload), shape), 3);
  o.check_invariants_every = check_every;
  auto r = run_simulation(o);
  EXPECT_TRUE(r) << r.error().message;
  int64_t cached = 0, prompt = 0;
  for (const request_record& q : r->requests) {
    EXPECT_LE(q.cached_tokens, q.prompt_tokens) << "request " << q.index;
    cached += q.cached_tokens;
    prompt += q.prompt_tokens;
  }
  const prefix_reuse bound = prefix_reuse_bound(o.workload, mooncake_block_tokens);
  EXPECT_EQ(prompt, bound.num_prompt_tokens);
  const double rate = static_cast<double>(cached) / static_cast<double>(prompt);
  // The engine's own bounds (its block size, the run's arrival and finish times).
  const summary_metrics m = summarize(*r, {});
  EXPECT_EQ(m.prefix_hit_rate, rate);
  EXPECT_LE(rate, m.prefix_hit_bound_arrived);
  EXPECT_LE(m.prefix_hit_bound_causal, m.prefix_hit_bound_arrived);
  std::printf("infinite cache, %d-token blocks: %.4f (every earlier prompt), %.4f (causal: finished before each arrival)\n",
              t->engine.block_size, m.prefix_hit_bound_arrived, m.prefix_hit_bound_causal);
  return {rate, bound};
}

TEST(Simulation, PrefixHitRateStaysUnderTheInfiniteCacheBound) {
  auto trace = read_trace(testing::test_data("traces/mooncake/conversation_trace_head300.jsonl"), trace_format::mooncake);
  ASSERT_TRUE(trace) << trace.error().message;
  const auto [rate, bound] = hit_rate_and_bound(std::move(*trace), 1);
  std::printf("prefix hit rate %.4f, infinite-cache bound %.4f\n", rate, bound.rate());
  EXPECT_EQ(bound.num_prompt_tokens, 1'713'382);
  EXPECT_EQ(bound.num_reusable_tokens, 256'826);  // a bound of 15.0%
  EXPECT_GT(rate, 0.0);
  EXPECT_LE(rate, bound.rate());
}

TEST(Simulation, PrefixHitRateStaysUnderTheBoundOnTheFullMooncakeTrace) {
  TROUPE_SHARED_DATA_OR_SKIP(path, "traces/mooncake/conversation_trace.jsonl");
  auto trace = read_trace(path, trace_format::mooncake);
  ASSERT_TRUE(trace) << trace.error().message;
  const auto [rate, bound] = hit_rate_and_bound(std::move(*trace), 0);
  std::printf("prefix hit rate %.4f, infinite-cache bound %.4f\n", rate, bound.rate());
  EXPECT_GT(rate, 0.0);
  EXPECT_LE(rate, bound.rate());
}

/// The hit rates of least_loaded and prefix_affinity on `trace` at 4 replicas of `kv_gib` GiB.
void expect_prefix_affinity_hits_more(std::vector<trace_request> trace, const std::string& kv_gib) {
  const topology_overrides four = {{"engine.replicas", "4"}, {"hardware.kv_memory_gib", kv_gib}};
  topology_overrides least_loaded = four, affinity = four;
  least_loaded.push_back({"load_balancer.router", "least_loaded"});
  affinity.push_back({"load_balancer.router", "auto"});  // four replicas: prefix_affinity
  const auto [least, bound] = hit_rate_and_bound(trace, 0, least_loaded);
  const double with_affinity = hit_rate_and_bound(std::move(trace), 0, affinity).first;
  std::printf("prefix hit rate: least_loaded %.4f, prefix_affinity %.4f, bound %.4f\n", least, with_affinity,
              bound.rate());
  EXPECT_GT(with_affinity, least);
  EXPECT_LE(with_affinity, bound.rate());
}

TEST(Simulation, PrefixAffinityHitsTheCacheMoreOnTheMooncakeHead) {
  auto trace = read_trace(testing::test_data("traces/mooncake/conversation_trace_head300.jsonl"), trace_format::mooncake);
  ASSERT_TRUE(trace) << trace.error().message;
  expect_prefix_affinity_hits_more(std::move(*trace), "400");
}

TEST(Simulation, PrefixAffinityHitsTheCacheMoreOnTheFullMooncakeTrace) {
  TROUPE_SHARED_DATA_OR_SKIP(path, "traces/mooncake/conversation_trace.jsonl");
  auto trace = read_trace(path, trace_format::mooncake);
  ASSERT_TRUE(trace) << trace.error().message;
  expect_prefix_affinity_hits_more(std::move(*trace), "400");  // docs/simulation.md's study
}

TEST(SimTopology, ATimeBudgetIsPricedByTheSimulatedCostModel) {
  const sim_topology t = parse_tiny("");
  EXPECT_EQ(t.engine.scheduler.step_time_budget_ms, 0);
  std::string text = tiny_topology;
  text.insert(text.find("[cost]"), "step_time_budget_ms = 0.5\n\n");
  auto budgeted = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_TRUE(budgeted) << budgeted.error().message;
  EXPECT_EQ(budgeted->engine.scheduler.step_time_budget_ms, 0.5);
  EXPECT_EQ(budgeted->engine.scheduler.step_cost.step_ns, 1000);  // the executor's own model
  EXPECT_EQ(budgeted->engine.scheduler.step_cost.attention_token_ns, 1);
  text.replace(text.find("0.5"), 3, "1e-9");
  auto tiny = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(tiny);
  EXPECT_NE(tiny.error().message.find("step_time_budget_ms must be 0 (off) or at least 0.000001"), std::string::npos);
}

TEST(SimTopology, AKvWatermarkIsReadAndBounded) {
  EXPECT_EQ(parse_tiny("").engine.scheduler.kv_watermark, 0);
  std::string text = tiny_topology;
  text.insert(text.find("[cost]"), "kv_watermark = 0.02\n\n");
  auto t = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->engine.scheduler.kv_watermark, 0.02);
  text.replace(text.find("0.02"), 4, "0.75");
  auto bad = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[engine] kv_watermark = 0.750000 is outside [0.000000, 0.500000]"),
            std::string::npos) << bad.error().message;
}

TEST(SimTopology, PreemptionSwapsToTheHostTier) {
  EXPECT_EQ(parse_tiny("").engine.preemption, engine::preemption_mode::recompute);
  std::string text = tiny_topology;
  text.insert(text.find("[cost]"), "[host_tier]\nblocks = 64\n\n");
  const std::string seqs = "max_num_seqs = 64\n";
  std::string engine = text;
  engine.insert(engine.find(seqs) + seqs.size(), "preemption = \"swap\"\nswap_bandwidth_gb_s = 4\n");
  auto t = parse_sim_topology(engine, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->engine.preemption, engine::preemption_mode::swap);
  EXPECT_EQ(t->engine.swap_bandwidth_gb_s, 4);
  std::string unknown = text;
  unknown.insert(unknown.find(seqs) + seqs.size(), "preemption = \"drop\"\n");
  auto bad = parse_sim_topology(unknown, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[engine] preemption must be recompute, swap or cost; got 'drop'"),
            std::string::npos) << bad.error().message;
  std::string no_tier = tiny_topology;
  no_tier.insert(no_tier.find(seqs) + seqs.size(), "preemption = \"swap\"\n");
  auto untiered = parse_sim_topology(no_tier, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(untiered);
  EXPECT_NE(untiered.error().message.find("swaps to the host tier: it needs [host_tier] blocks > 0"), std::string::npos)
      << untiered.error().message;
}

TEST(SimTopology, TheHitRulesSlackAndTheCorrectionWindowAreRead) {
  const sim_topology defaults = parse_tiny("");
  EXPECT_EQ(defaults.engine.scheduler.prefix_cache_slack_tokens, 0);
  EXPECT_EQ(defaults.engine.scheduler.step_time_correction_window, 64);
  std::string text = tiny_topology;
  text.insert(text.find("[cost]"), "prefix_cache_slack_tokens = 6\nstep_time_correction_window = 0\n\n");
  auto t = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->engine.scheduler.prefix_cache_slack_tokens, 6);
  EXPECT_EQ(t->engine.scheduler.step_time_correction_window, 0);
  const std::string slack = "prefix_cache_slack_tokens = 6";
  text.replace(text.find(slack), slack.size(), "prefix_cache_slack_tokens = -1");
  auto bad = parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[engine] prefix_cache_slack_tokens = -1.000000 is outside"), std::string::npos)
      << bad.error().message;
}

TEST(Simulation, RealTokensEqualTheReferenceGeneratorWithAndWithoutATimeBudget) {
  // 1.5 µs steps priced at 1 µs + 10 ns/token + 1 ns/attended position: prompts of up to 82
  // tokens are cut into chunks of at most 31 (10q + q(q+1)/2 <= 500), fewer later on.
  std::vector<trace_request> workload;
  for (int i = 0; i < 12; i++) workload.push_back(trace_request{i * 500, 5 + 7 * i, 20 + i, {}});
  auto ck = model::checkpoint::load(testing::bundled_model());
  auto tok = tokenizer::load(testing::bundled_tokenizer(), 512);
  model::transformer reference(*ck);
  std::vector<std::string> hashes;
  std::vector<int64_t> num_steps;
  for (const char* engine : {"", "[engine]\nstep_time_budget_ms = 0.0015\n"}) {
    SCOPED_TRACE(engine);
    auto t = parse_sim_topology(
        "[model]\ncheckpoint = \"models/stories260K.bin\"\n[hardware]\nkv_memory_gib = 0.01\n" + std::string(engine) +
            "[cost]\ntokens = \"real\"\nstep_ns = 1000\ntoken_ns = 10\nsampled_row_ns = 100\nattention_token_ns = 1\n",
        "real.toml", TROUPE_SOURCE_DIR);
    ASSERT_TRUE(t) << t.error().message;
    auto r = run_simulation(sim_run_options(*t, workload, 3));
    ASSERT_TRUE(r) << r.error().message;
    hashes.push_back(r->event_log_sha256);
    num_steps.push_back(static_cast<int64_t>(r->steps.size()));
    for (const request_record& q : r->requests) {
      generate::generate_params p;
      p.prompt = q.prompt;
      p.max_new_tokens = workload[q.index].output_tokens;
      p.sampling.temperature = 0.0f;
      p.ignore_eos = true;
      auto want = generate::generate(reference, *tok, p);
      ASSERT_TRUE(want);
      EXPECT_EQ(q.tokens, want->tokens) << "request " << q.index;
    }
  }
  EXPECT_NE(hashes[0], hashes[1]);  // the budget changed the plans ...
  EXPECT_GT(num_steps[1], num_steps[0]);  // ... into more, smaller steps; the tokens stayed
}

TEST(SimTopology, AHostTierIsReadAndBounded) {
  const sim_topology t = parse_tiny("\n[host_tier]\nblocks = 1000\nbandwidth_gb_s = 10\nlatency_us = 5\n");
  EXPECT_EQ(t.host_tier.blocks, 1000);
  EXPECT_EQ(t.host_tier.bandwidth_gb_s, 10);
  EXPECT_EQ(t.host_tier.latency_us, 5);
  EXPECT_EQ(parse_tiny().host_tier.blocks, 0);  // no table: no tier
  const std::pair<std::string, std::string> cases[] = {
      {"\n[host_tier]\nblocks = -1\n", "tiny.toml:25: [host_tier] blocks = -1.000000 is outside"},
      {"\n[host_tier]\nbandwidth_gb_s = 0\n", "tiny.toml:25: [host_tier] bandwidth_gb_s = 0.000000 is outside"},
      {"\n[host_tier]\nsize = 3\n", "tiny.toml:25: [host_tier]: unknown key 'size'"},
      {"\n[host_tier]\nblocks = 10\ncopies = \"overlapped\"\n",
       "tiny.toml:26: [host_tier] copies is gone: a step's moves overlap its compute as the engine's copy stream has "
       "them, set by [engine] copy_stream_min_bytes (0: every step's, as \"overlapped\" did; -1: none, as \"step\" did)"},
  };
  for (const auto& [extra, message] : cases) {
    auto bad = parse_sim_topology(std::string(tiny_topology) + extra, "tiny.toml", TROUPE_SOURCE_DIR);
    ASSERT_FALSE(bad) << message;
    EXPECT_NE(bad.error().message.find(message), std::string::npos) << bad.error().message;
  }
}

TEST(SimTopology, DisaggregationAndANetworkAreReadAndBounded) {
  const topology_overrides pd = {{"engine.replicas", "3"}, {"engine.prefill_replicas", "1"}};
  auto t = parse_sim_topology(std::string(tiny_topology) + "\n[network]\nlatency_us = 20\nbandwidth_gb_s = 0.5\n",
                              "tiny.toml", TROUPE_SOURCE_DIR, pd);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->prefill_replicas, 1);
  EXPECT_EQ(t->network.latency_us, 20);
  EXPECT_EQ(t->network.bandwidth_gb_s, 0.5);
  EXPECT_EQ(parse_tiny().prefill_replicas, 0);  // none: every replica mixed, ...
  EXPECT_EQ(parse_tiny().network.latency_us, 0);  // ... and no network
  // Synthetic tokens: every request ends by length, later than without the network.
  std::vector<trace_request> w;
  for (int32_t i = 0; i < 6; i++) w.push_back(trace_request{i * 100'000, 40 + i, 8, {}});
  auto near = run_simulation(sim_run_options(
      *parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, pd), w, 3));
  auto far = run_simulation(sim_run_options(*t, w, 3));
  ASSERT_TRUE(near && far);
  for (const request_record& r : far->requests) EXPECT_EQ(r.finish, "length") << r.index;
  EXPECT_GT(far->requests.back().finish_ns, near->requests.back().finish_ns);
  EXPECT_GT(far->network.messages, 0);
  EXPECT_EQ(near->network.messages, 0);
  const std::pair<topology_overrides, std::string> cases[] = {
      {{{"engine.prefill_replicas", "1"}}, "[engine] prefill_replicas must leave at least one decode replica: 1 of 1"},
      {{{"network.latency_us", "-1"}}, "[network] latency_us = -1.000000 is outside"},
      {{{"network.jitter_us", "3"}}, "[network]: unknown key 'jitter_us'"},
  };
  for (const auto& [set, message] : cases) {
    auto bad = parse_sim_topology(tiny_topology, "tiny.toml", TROUPE_SOURCE_DIR, set);
    ASSERT_FALSE(bad) << message;
    EXPECT_NE(bad.error().message.find(message), std::string::npos) << bad.error().message;
  }
}

TEST(SimNetwork, LostPacketsDelayAMessageByTcpsResendsAndTheLinkKeepsItsOrder) {
  sim_network lossless({20, 0, 0, 0}, {}, 7);
  const caf::actor_addr none;
  EXPECT_EQ(lossless.arrival_ns(none, none, 1 << 20, 1000), 1000 + 20'000);
  EXPECT_EQ(lossless.counts().resent, 0);
  // Half of all packets lost: each message waits 200 ms x (2^k - 1) for k rounds of resends
  // (at most 6), and never overtakes the one before it on its link.
  sim_network lossy({20, 0, 50, 0}, {}, 7);
  int64_t last = 0;
  int64_t num_delayed = 0;
  for (int64_t i = 0; i < 200; i++) {
    const int64_t now = i * 1'000'000;
    const int64_t at = lossy.arrival_ns(none, none, 0, now);
    EXPECT_GE(at, last);
    const int64_t waited = at - now - 20'000;
    if (waited > 0 && at > last) {  // its own resends, not a wait behind an earlier message
      bool resends = false;
      for (int32_t k = 1; k <= tcp_resends_max; k++) resends |= waited == tcp_retransmit_ns * ((int64_t{1} << k) - 1);
      EXPECT_TRUE(resends) << waited;
    }
    num_delayed += waited > 0;
    last = at;
  }
  EXPECT_GT(lossy.counts().resent, 60);  // one packet each: about half of them
  EXPECT_LT(lossy.counts().resent, 140);
  EXPECT_GE(num_delayed, lossy.counts().resent);
  // A fault's loss stops at until_ns; the link's own does not.
  sim_network_faults faults;
  faults.loss_percent = 50;
  faults.until_ns = 0;
  sim_network after({0, 0, 0, 0}, faults, 7);
  for (int64_t i = 0; i < 50; i++) EXPECT_EQ(after.arrival_ns(none, none, 0, i), i);
  EXPECT_EQ(after.counts().resent, 0);
}

TEST(SimNetwork, AMessageTakesItsLinksTimePlusItsEndsOwn) {
  // 2 ms, 1 Gbit/s; the ends at 0.2 GB/s (the namespace test's hand-off with no link limits:
  // 449,360 bytes in about 2.2 ms). CAF serializes a message whole before it leaves and
  // deserializes it once it has all arrived: the ends' time adds to the link's.
  sim_network net({2000, 0.125, 0, 0.2}, {}, 7);
  const caf::actor_addr none;
  EXPECT_EQ(net.arrival_ns(none, none, 449'360, 0), 2'000'000 + 3'594'880 + 2'246'800);
  EXPECT_EQ(net.arrival_ns(none, none, 100, 10'000'000), 10'000'000 + 2'000'000 + 800 + 500);
  sim_network free({2000, 0.125, 0, 0}, {}, 7);
  EXPECT_EQ(free.arrival_ns(none, none, 449'360, 0), 2'000'000 + 3'594'880);
}

TEST(SimTopology, NetworkLossIsReadAndBounded) {
  auto t = parse_sim_topology(std::string(tiny_topology) + "\n[network]\nloss_percent = 5\nendpoint_gb_s = 0.049\n",
                              "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->network.loss_percent, 5);
  EXPECT_EQ(t->network.endpoint_gb_s, 0.049);
  auto bad = parse_sim_topology(std::string(tiny_topology) + "\n[network]\nloss_percent = 51\n", "tiny.toml",
                                TROUPE_SOURCE_DIR);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[network] loss_percent = 51.000000 is outside"), std::string::npos)
      << bad.error().message;
  // Synthetic tokens: with 5% loss every request still ends by length, the network resent some.
  std::vector<trace_request> w;
  for (int32_t i = 0; i < 6; i++) w.push_back(trace_request{i * 100'000, 40 + i, 8, {}});
  auto lossy = run_simulation(sim_run_options(*t, w, 3));
  ASSERT_TRUE(lossy) << lossy.error().message;
  for (const request_record& r : lossy->requests) EXPECT_EQ(r.finish, "length") << r.index;
  EXPECT_GT(lossy->network.messages, 0);
}

/// Three requests a second apart on a pool of 32 blocks: r0 caches its 400-token prompt (25
/// blocks), r1's different prompt evicts most of them, r2 repeats r0's prompt.
sim_result evicting_run(const std::string& extra, const std::string& copy_stream_min_bytes = "1048576") {
  auto t = parse_sim_topology(std::string(tiny_topology) + extra, "tiny.toml", TROUPE_SOURCE_DIR,
                              {{"hardware.kv_memory_gib", "0.0001220703125"},  // 32 blocks of 16 x 256 bytes
                               {"engine.copy_stream_min_bytes", copy_stream_min_bytes}});
  EXPECT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->engine.num_kv_blocks, 32);
  const int64_t s = 1'000'000'000;
  sim_options o = sim_run_options(*t, {trace_request{0, 400, 1, {1}}, trace_request{s, 400, 1, {2}}, trace_request{2 * s, 400, 1, {1}}}, 5);
  o.check_invariants_every = 1;
  auto r = run_simulation(o);
  EXPECT_TRUE(r) << r.error().message;
  return *r;
}

TEST(Simulation, AHostTierServesThePrefixThePoolEvicted) {
  // Without a tier r2 finds the 7 of r0's blocks that r1 left in the pool.
  const sim_result without = evicting_run("");
  EXPECT_EQ(without.requests[2].cached_tokens, 112);
  EXPECT_EQ(without.host_hit_tokens, 0);
  EXPECT_EQ(without.demoted_blocks, 0);
  // With a tier, r1's evictions (18 of r0's blocks) are demoted and r2 gets its whole prefix
  // back: 24 blocks (the hit rule leaves the last token to compute), 7 from the pool and 17
  // promoted; making room for them demotes 18 of r1's.
  // A fixed fetch bound: every block is fetched (fetch or recompute by cost is pinned below).
  const std::string tier = "\n[host_tier]\nblocks = 1000\nfetch_timeout_ms = 50\nlatency_us = 2\nbandwidth_gb_s = ";
  const sim_result with = evicting_run(tier + "1\n");
  EXPECT_EQ(with.requests[2].cached_tokens, 384);
  EXPECT_EQ(with.host_hit_tokens, 17 * 16);
  EXPECT_EQ(with.demoted_blocks, 36);
  EXPECT_EQ(with.promoted_blocks, 17);
  EXPECT_EQ(with.requests[0].first_token_ns - with.requests[0].arrival_ns, 86300);
  EXPECT_EQ(with.requests[2].first_token_ns - with.requests[2].arrival_ns, 152900);
  // The moves are priced: r2's first step carries 35 blocks of 4096 bytes, so twice the
  // bandwidth brings its first token exactly 35 * 4096 / 2 ns sooner.
  const sim_result faster = evicting_run(tier + "2\n");
  EXPECT_EQ((with.requests[2].first_token_ns - faster.requests[2].first_token_ns), 35 * 4096 / 2);
}

TEST(Simulation, OverlappedCopiesTakeTheLongerOfComputeAndCopiesPlusTheShortersShareOfOneLayer) {
  // 35 blocks of 4,096 bytes at 1 GB/s after 2 us: 145,360 ns of copies.
  const tier_transfer_cost serial{4096, 1, 2000, 2, -1};
  const tier_transfer_cost overlapped{4096, 1, 2000, 2, 0};
  EXPECT_EQ(serial.step_ns(100'000, 35), 245'360);
  EXPECT_EQ(overlapped.step_ns(100'000, 35), 145'360 + 100'000 / 2);
  EXPECT_EQ(overlapped.step_ns(300'000, 35), 300'000 + 145'360 / 2);
  EXPECT_EQ(overlapped.step_ns(100'000, 0), 100'000);  // nothing moved: the compute alone
  // From 35 blocks' bytes (143,360) on, as the engine's copy stream (copy_stream_min_bytes).
  const tier_transfer_cost from_35{4096, 1, 2000, 2, 35 * 4096};
  EXPECT_EQ(from_35.step_ns(100'000, 35), 145'360 + 100'000 / 2);
  EXPECT_EQ(from_35.step_ns(100'000, 34), 100'000 + 2000 + 34 * 4096);
  // The evicting run with the tiny model's 2 layers: every request's tokens and finish as with
  // copies priced into the step, and r2, whose first step promotes 17 blocks, sooner. (Its
  // blocks are small: the default copy_stream_min_bytes, 1 MiB, streams none of its steps.)
  const std::string tier = "\n[host_tier]\nblocks = 1000\nfetch_timeout_ms = 50\nlatency_us = 2\nbandwidth_gb_s = 1\n";
  const sim_result step = evicting_run(tier);
  const sim_result over = evicting_run(tier, "0");
  ASSERT_EQ(over.requests.size(), step.requests.size());
  for (size_t i = 0; i < step.requests.size(); i++) {
    EXPECT_EQ(over.requests[i].cached_tokens, step.requests[i].cached_tokens);
    EXPECT_EQ(over.requests[i].finish, step.requests[i].finish);
  }
  EXPECT_LT(over.requests[2].first_token_ns, step.requests[2].first_token_ns);
  EXPECT_EQ(over.promoted_blocks, step.promoted_blocks);
}

TEST(ModelledTier, EvictsTheLeastRecentlyUsedAndExpiresByClassAsTheDiskTierDoes) {
  modelled_tier tier(2, 2);
  const auto block = [](uint64_t hash) { return kv::kv_block{hash, 0, {1, 2}, 0, 0, {}, {}}; };
  EXPECT_EQ(tier.put(block(1), kv::cache_class::chat, 0).value(), 0);
  EXPECT_EQ(tier.put(block(2), kv::cache_class::agent, 10).value(), 0);
  ASSERT_TRUE(tier.get(1, 20));  // 1 is now the most recent: 2 goes first
  EXPECT_EQ(tier.put(block(3), kv::cache_class::chat, 30).value(), 1);
  tier.check_invariants();
  EXPECT_FALSE(tier.get(2, 40));
  EXPECT_EQ(tier.num_blocks(), 2);
  EXPECT_EQ(tier.num_evictions(), 1);
  // 3 lives 7 days from its put (chat); 1 from its get, with the class of its put (chat): at
  // 3's last moment 1 has expired.
  const int64_t last = 30 + 7 * kv::day_ns - 1;
  EXPECT_TRUE(tier.get(3, last));
  EXPECT_EQ(tier.expire(last), 1);
  EXPECT_EQ(tier.num_expirations(), 1);
  EXPECT_EQ(tier.num_blocks(), 1);
  tier.check_invariants();
}

TEST(Simulation, ADiskTierBelowTheHostTierServesWhatTheHostTierEvicted) {
  // A host tier of 4 blocks over a modelled disk: of r0's 18 blocks r1 evicted, the host tier
  // keeps the last 4 demoted and writes the others down; r2 still gets its whole prefix back,
  // 4 blocks from the host tier and the 13 it lacks read from the disk.
  const auto with_disk = [](const std::string& disk_keys) {
    return evicting_run("\n[host_tier]\nblocks = 4\nfetch_timeout_ms = 50\nlatency_us = 2\nbandwidth_gb_s = 1\n[disk_tier]\n" +
                        disk_keys);
  };
  const sim_result disk = with_disk("blocks = 1000\nlatency_us = 100\nbandwidth_gb_s = 1\n");
  EXPECT_EQ(disk.requests[2].cached_tokens, 384);
  EXPECT_EQ(disk.host_hit_tokens, 17 * 16);  // the engine counts them all as the host tier's
  EXPECT_EQ(disk.promoted_blocks, 17);
  EXPECT_EQ(disk.disk_written_blocks, 32);   // 36 demoted, the last 4 kept in the host tier
  EXPECT_EQ(disk.disk_hit_blocks, 13);
  EXPECT_EQ(disk.disk_hit_tokens, 13 * 16);  // of host_hit_tokens
  EXPECT_EQ(disk.disk_refused_blocks, 0);
  for (const request_record& r : disk.requests) EXPECT_EQ(r.finish, "length");
  // The reads are priced on the fetch's answer: 100 us more latency, or twice the bandwidth
  // (13 blocks of 4096 bytes at 1 byte/ns), move r2's first token by exactly that much.
  const sim_result slower = with_disk("blocks = 1000\nlatency_us = 200\nbandwidth_gb_s = 1\n");
  EXPECT_EQ(slower.requests[2].first_token_ns - disk.requests[2].first_token_ns, 100'000);
  const sim_result faster = with_disk("blocks = 1000\nlatency_us = 100\nbandwidth_gb_s = 2\n");
  EXPECT_EQ(disk.requests[2].first_token_ns - faster.requests[2].first_token_ns, 13 * 4096 / 2);
  // A full disk evicts its least recently used blocks (as the disk tier does) and the tiers
  // serve on: r2 computes what the disk no longer holds.
  const sim_result full = with_disk("blocks = 2\n");
  EXPECT_EQ(full.disk_written_blocks, 32);
  EXPECT_EQ(full.disk_refused_blocks, 0);
  EXPECT_LT(full.requests[2].cached_tokens, 384);
  for (const request_record& r : full.requests) EXPECT_EQ(r.finish, "length");
  // A read slower than the host tier waits for the disk tier (4/5 of the engine's 50 ms), or
  // than the engine waits: the host tier answers with the 4 blocks it holds and r2 computes the
  // 13 the disk had, finding the pool's 7 blocks and those 4.
  const sim_result slow = with_disk("blocks = 1000\nlatency_us = 45000\n");
  EXPECT_EQ(slow.requests[2].cached_tokens, 112 + 4 * 16);
  const sim_result late = with_disk("blocks = 1000\nlatency_us = 60000\n");
  EXPECT_EQ(late.requests[2].cached_tokens, 112 + 4 * 16);
  const nlohmann::json summary = nlohmann::json::parse(summary_json(disk, {}, 5));
  EXPECT_EQ(summary["disk_tier"]["hit_blocks"], 13);
  EXPECT_EQ(summary["disk_tier"]["written_blocks"], 32);
  EXPECT_EQ(summary["disk_tier"]["refused_blocks"], 0);
  EXPECT_EQ(summary["disk_tier"]["hit_tokens"], 13 * 16);
  // A disk tier needs a host tier above it.
  auto bad = parse_sim_topology(std::string(tiny_topology) + "\n[disk_tier]\nblocks = 10\n", "tiny.toml", TROUPE_SOURCE_DIR);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[disk_tier] lies below the host tier: it needs [host_tier] blocks > 0"),
            std::string::npos)
      << bad.error().message;
}

TEST(Simulation, ByCostAFetchReadsFromTheDiskOnlyWhatArrivesWithinItsBudget) {
  // The flow above with fetch or recompute by cost (no fetch_timeout_ms). r2's 17 blocks past
  // the pool's 7 cost 272 x 10 + (272 x 112 + 272 x 273 / 2) x 1 = 70,312 ns to compute; copies
  // at 1 GB/s (4,096 ns a block) have all 17 by 69,632: fetched, with a budget of 70,312 ns.
  const auto by_cost = [](const std::string& host_keys, const std::string& disk_keys) {
    return evicting_run("\n[host_tier]\nblocks = 4\nlatency_us = 2\n" + host_keys + "[disk_tier]\nblocks = 1000\n" +
                        disk_keys);
  };
  const std::string copies_1_gb_s = "bandwidth_gb_s = 1\n";
  // Reads of 4,096 ns a block: the 13 the host tier lacks by 53,248 ns, all in the budget.
  const sim_result quick = by_cost(copies_1_gb_s, "latency_us = 0\nbandwidth_gb_s = 1\n");
  EXPECT_EQ(quick.requests[2].cached_tokens, 384);
  EXPECT_EQ(quick.disk_hit_blocks, 13);
  // r0 and r1 declined: their 24 blocks from position 0 compute in 3,840 + 73,920 = 77,760 ns,
  // sooner than copies (98,304).
  EXPECT_EQ(quick.tier_fetches, 1);
  EXPECT_EQ(quick.tier_fetches_declined, 2);
  // 30 us before the first byte: 30,000 + 4,096 m <= 70,312 reads m = 9 of them; r2 takes the
  // pool's 7 blocks, the host tier's 4 and those 9, and computes the rest.
  const sim_result cut = by_cost(copies_1_gb_s, "latency_us = 30\nbandwidth_gb_s = 1\n");
  EXPECT_EQ(cut.disk_hit_blocks, 9);
  EXPECT_EQ(cut.requests[2].cached_tokens, (7 + 4 + 9) * 16);
  // 100 us before the first byte (the default): nothing from the disk within the budget.
  const sim_result none = by_cost(copies_1_gb_s, "latency_us = 100\nbandwidth_gb_s = 1\n");
  EXPECT_EQ(none.disk_hit_blocks, 0);
  EXPECT_EQ(none.requests[2].cached_tokens, (7 + 4) * 16);
  // Copies at 0.1 GB/s (40,960 ns a block) never beat computing: no tier is asked.
  const sim_result declined = by_cost("bandwidth_gb_s = 0.1\n", "latency_us = 0\nbandwidth_gb_s = 1\n");
  EXPECT_EQ(declined.tier_fetches, 0);
  EXPECT_EQ(declined.tier_fetches_declined, 3);
  EXPECT_EQ(declined.requests[2].cached_tokens, 7 * 16);
  EXPECT_EQ(declined.host_hit_tokens, 0);
  for (const sim_result* r : {&quick, &cut, &none, &declined})
    for (const request_record& q : r->requests) EXPECT_EQ(q.finish, "length");
}

/// What an infinite cache can serve of each request, summed: its prompt tokens an earlier
/// request already covered along the same hash-id chain (prefix_reuse_bound, but where an
/// earlier request covered only part of a trace block, up to that part), less the hit rule (at
/// most L - 1 tokens of an L-token prompt come from cache), in whole blocks of `block_size`.
int64_t bound_after_the_hit_rule(const std::vector<trace_request>& w, int32_t block_size) {
  std::map<std::pair<int64_t, uint64_t>, std::pair<int64_t, int64_t>> chains;  // -> (node, tokens covered)
  int64_t total = 0;
  for (const trace_request& r : w) {
    int64_t node = 0, reusable = 0;
    bool reusing = true;
    for (size_t b = 0; b < r.hash_ids.size(); b++) {
      const int64_t covers = std::min<int64_t>(mooncake_block_tokens, r.input_tokens - static_cast<int64_t>(b) * mooncake_block_tokens);
      auto [it, added] = chains.try_emplace({node, r.hash_ids[b]}, static_cast<int64_t>(chains.size()) + 1, 0);
      if (reusing) reusable += std::min(it->second.second, covers);
      reusing = reusing && it->second.second >= covers;
      it->second.second = std::max(it->second.second, covers);
      node = it->second.first;
    }
    total += std::min<int64_t>(reusable, r.input_tokens - 1) / block_size * block_size;
  }
  return total;
}

TEST(Simulation, UnboundedTiersReachTheInfiniteCacheBoundLessTheHitRule) {
  auto trace = read_trace(testing::test_data("traces/mooncake/conversation_trace_head300.jsonl"), trace_format::mooncake);
  ASSERT_TRUE(trace) << trace.error().message;
  // One replica with a pool of two max-context sequences (it evicts all the time), a host tier
  // that never does, and the requests far enough apart that none overlaps another.
  auto t = load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/sim-llama7b.toml",
                             {{"hardware.kv_memory_gib", "8"}, {"host_tier.blocks", "100000000"}});
  ASSERT_TRUE(t) << t.error().message;
  workload_options shape;
  shape.max_context = t->model.seq_len;
  std::vector<trace_request> w = shape_workload(std::move(*trace), shape);
  for (size_t i = 0; i < w.size(); i++) w[i].arrival_ns = static_cast<int64_t>(i) * 1'000'000'000'000;
  const int64_t expected = bound_after_the_hit_rule(w, t->engine.block_size);
  auto r = run_simulation(sim_run_options(*t, w, 3));
  ASSERT_TRUE(r) << r.error().message;
  int64_t cached = 0;
  for (const request_record& q : r->requests) cached += q.cached_tokens;
  std::printf("cached %lld of the bound's %lld after the hit rule; host tier hits %lld, demoted %lld, promoted %lld\n",
              static_cast<long long>(cached), static_cast<long long>(expected),
              static_cast<long long>(r->host_hit_tokens), static_cast<long long>(r->demoted_blocks),
              static_cast<long long>(r->promoted_blocks));
  EXPECT_GT(r->host_hit_tokens, 0);
  EXPECT_EQ(cached, expected);
}

}  // namespace
}  // namespace troupe::sim

namespace troupe::sim {
namespace {

/// Eight 64-token prompts generating 100 tokens each, all at once, with `extra` topology text.
/// When the last request of `r` finished.
int64_t last_finish_ns(const sim_result& r) {
  int64_t last = 0;
  for (const request_record& q : r.requests) last = std::max(last, q.finish_ns);
  return last;
}

sim_result speculating_run(const std::string& extra, uint64_t seed = 3) {
  std::vector<trace_request> w;
  for (int i = 0; i < 8; i++) w.push_back(trace_request{0, 64, 100, {}});
  sim_options o = sim_run_options(parse_tiny(extra), w, seed);
  o.check_invariants_every = 1;
  auto r = run_simulation(o);
  EXPECT_TRUE(r) << r.error().message;
  for (const request_record& q : r->requests) EXPECT_EQ(q.output_tokens, 100);
  return *r;
}

TEST(Simulation, SpeculationIsModelledByItsAcceptanceAndPricedByItsRows) {
  const sim_result none = speculating_run("");
  EXPECT_EQ(none.draft_rows, 0);
  const std::string spec = "\n[speculation]\ndrafter = \"ngram\"\nnum_speculative_tokens = 4\nacceptance = ";
  // Every draft stands: five tokens a step, after the prompt's step.
  const sim_result sure = speculating_run(spec + "1\n");
  EXPECT_EQ(sure.accepted_drafts, sure.draft_rows);
  // After the prompt's token, 99 per request: 19 steps of 4 drafts + 1, then 3 drafts + 1.
  EXPECT_EQ(sure.accepted_drafts, 8 * (19 * 4 + 3));
  EXPECT_EQ(sure.steps.size() + 79 + 1, none.steps.size());  // 20 decode steps instead of 99
  // Each step carries 5 rows a request (1000 + 40 x 110 ns against 1000 + 8 x 110): still sooner.
  EXPECT_LT(last_finish_ns(sure), last_finish_ns(none));
  // None stands: as many steps as without speculation, each dearer by its four draft rows.
  const sim_result never = speculating_run(spec + "0\n");

  EXPECT_EQ(never.accepted_drafts, 0);
  // As many steps as plain decoding (give or take the prompt's: one step in flight, not two).
  EXPECT_EQ(never.steps.size(), none.steps.size() - 1);
  EXPECT_GT(last_finish_ns(never), last_finish_ns(none));
  // In between: a share near the acceptance, and the same run replays to the same log.
  const sim_result half = speculating_run(spec + "0.6\n");
  EXPECT_GT(half.accepted_drafts, 0);
  EXPECT_LT(half.accepted_drafts, half.draft_rows);
  EXPECT_EQ(half.event_log_sha256, speculating_run(spec + "0.6\n").event_log_sha256);
  // Budgeted: drafts of confidence 0 never pay for their rows.
  const sim_result budgeted = speculating_run(spec + "0\nmode = \"budgeted\"\n");
  EXPECT_EQ(budgeted.draft_rows, 0);
  EXPECT_EQ(budgeted.steps.size(), never.steps.size());
}

TEST(SimTopology, BadSpeculationIsAClearError) {
  const std::pair<std::string, std::string> cases[] = {
      {"\n[speculation]\ndrafter = \"draft_model\"\n", "the simulator models draft_model drafts with synthetic tokens only"},
      {"\n[speculation]\ndrafter = \"medusa\"\n", "[speculation] drafter: unknown drafter 'medusa'"},
      {"\n[speculation]\ndrafter = \"ngram\"\nmode = \"often\"\n", "[speculation] mode must be fixed or budgeted"},
      {"\n[speculation]\nacceptance = 1.5\n", "[speculation] acceptance = 1.500000 is outside"},
      {"\n[speculation]\nnum_speculative_tokens = 17\n", "num_speculative_tokens"},
  };
  for (const auto& [extra, message] : cases) {
    auto bad = parse_sim_topology(std::string(tiny_topology) + extra, "tiny.toml", TROUPE_SOURCE_DIR);
    ASSERT_FALSE(bad) << message;
    EXPECT_NE(bad.error().message.find(message), std::string::npos) << bad.error().message;
  }
}

}  // namespace
}  // namespace troupe::sim
