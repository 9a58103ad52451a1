// The simulator: SHA-256, simulation topologies, bit-identical replay, real-token mode equal to
// the reference generator, and exact virtual times on a hand-computed trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/generate/reference_generator.hpp"
#include "sim/report.hpp"
#include "sim/sha256.hpp"
#include "sim/sim_topology.hpp"
#include "sim/simulation.hpp"
#include "sim/workload.hpp"
#include "tests/support/golden.hpp"

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

const char* tiny_topology = R"([model]
name = "tiny"
n_layers = 2
dim = 64
n_heads = 8
n_kv_heads = 4
vocab_size = 512
max_context = 512

[hardware]
kv_memory_gib = 0.01

[engine]
block_size = 16
max_num_batched_tokens = 256
max_num_seqs = 64

[cost]
step_ns = 1000
token_ns = 10
sampled_row_ns = 100
attention_token_ns = 1
)";

sim_options options(const sim_topology& t, std::vector<trace_request> workload, uint64_t seed) {
  sim_options o;
  o.topology = t;
  o.workload = std::move(workload);
  o.seed = seed;
  return o;
}

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
  const sim_options o = options(parse_tiny(), {trace_request{0, 16, 3, {}}}, 7);
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
  EXPECT_EQ(r->batch_sizes, (std::vector<int64_t>{1, 1, 1}));
}

TEST(Simulation, HandComputedTimesWithKvReads) {
  // As above plus 2 ns per KV position a chunk reads: step 0 reads 16 (+32 ns: 1428), step 1
  // reads 17 (+34: 1161, done at 2589), step 2 reads 18 (+36: 1164, done at 3753).
  const sim_options o = options(parse_tiny("kv_read_token_ns = 2\n"), {trace_request{0, 16, 3, {}}}, 7);
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
  const sim_options o = options(t, synthetic_workload(s), 5);
  auto a = run_simulation(o);
  auto b = run_simulation(o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);
  EXPECT_EQ(summary_json(*a, {}, 5), summary_json(*b, {}, 5));
  EXPECT_GT(a->num_events, 600);
  s.seed = 12;  // a different run seed draws a different workload
  const sim_options other = options(t, synthetic_workload(s), 6);
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

/// Runs `workload` (shaped to the topology's context) on the 7B simulation topology; returns
/// the simulated prefix hit rate after checking each request's share, and the workload's bound.
std::pair<double, prefix_reuse> hit_rate_and_bound(std::vector<trace_request> workload, int32_t check_every) {
  auto t = load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/sim-llama7b.toml");
  EXPECT_TRUE(t) << t.error().message;
  workload_options shape;
  shape.max_context = t->model.seq_len;
  sim_options o = options(*t, shape_workload(std::move(workload), shape), 3);
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
  return {static_cast<double>(cached) / static_cast<double>(prompt), bound};
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

TEST(Simulation, RealTokensEqualTheReferenceGenerator) {
  auto t = parse_sim_topology(
      "[model]\ncheckpoint = \"models/stories260K.bin\"\n[hardware]\nkv_memory_gib = 0.01\n"
      "[cost]\ntokens = \"real\"\nstep_ns = 1000\ntoken_ns = 10\nsampled_row_ns = 100\nattention_token_ns = 1\n",
      "real.toml", TROUPE_SOURCE_DIR);
  ASSERT_TRUE(t) << t.error().message;
  std::vector<trace_request> workload;
  for (int i = 0; i < 12; i++) workload.push_back(trace_request{i * 500, 5 + 7 * i, 20 + i, {}});
  auto r = run_simulation(options(*t, workload, 3));
  ASSERT_TRUE(r) << r.error().message;
  auto ck = model::checkpoint::load(testing::bundled_model());
  auto tok = tokenizer::load(testing::bundled_tokenizer(), 512);
  model::transformer reference(*ck);
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

}  // namespace
}  // namespace troupe::sim
