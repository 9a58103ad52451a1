// The roofline cost model (runtime/cost/roofline): exact step times for hand-computed shapes,
// the shipped presets, validation, its [cost] keys in a simulation topology, and a simulation
// priced by it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "runtime/cost/roofline.hpp"
#include "sim/sim_topology.hpp"
#include "sim/simulation.hpp"

namespace troupe::cost {
namespace {

/// Llama-2-7B: 32 layers of width 4096 (32 heads, no GQA), FFN 11008, 32k vocabulary.
model::model_config llama7b() {
  model::model_config m;
  m.dim = 4096;
  m.hidden_dim = 11008;
  m.n_layers = 32;
  m.n_heads = 32;
  m.n_kv_heads = 32;
  m.vocab_size = 32000;
  m.seq_len = 4096;
  return m;
}

roofline_options preset_options(const char* name, double overhead_ns = 0) {
  roofline_options o;
  o.hardware = find_hardware_preset(name).value().spec;
  o.step_overhead_ns = overhead_ns;
  o.kv_memory_bytes = 40e9;
  return o;
}

step_features decode(int64_t context, int64_t rows = 1) {
  const auto n = static_cast<double>(rows);
  return {1, n, n, n * chunk_attention_tokens(context, 1), n * static_cast<double>(context + 1)};
}

TEST(Roofline, SevenBShapeBytes) {
  const roofline_model r = roofline_model::make(llama7b(), preset_options("h100-sxm")).value();
  // 32 * (2 * 4096² + 2 * 4096 * 4096 + 3 * 4096 * 11008) = 6,476,005,376 matmul parameters,
  // + 32000 * 4096 classifier = 6,607,077,376 parameters of 2 bytes.
  EXPECT_EQ(r.matmul_params(), 6'476'005'376.0);
  EXPECT_EQ(r.weight_bytes(), 13'214'154'752.0);
  EXPECT_EQ(r.kv_bytes_per_token(), 2.0 * 32 * 4096 * 2);  // 524,288
}

TEST(Roofline, BatchOneDecodeOfSevenBIsWeightAndKvBytesOverBandwidthPlusOverhead) {
  const roofline_model r = roofline_model::make(llama7b(), preset_options("h100-sxm", 25'000)).value();
  const step_features f = decode(1023);  // reads the KV of 1024 positions
  const double bytes = 13'214'154'752.0 + 1024 * 524'288.0;
  EXPECT_TRUE(r.price(f).memory_bound());
  EXPECT_EQ(r.price(f).bytes, bytes);
  EXPECT_EQ(r.predict_ns(f), std::llround(bytes / 3.35e12 * 1e9 + 25'000));
  EXPECT_EQ(r.predict_ns(f), 4'129'784);  // 13,751,025,664 B / 3,350 B/ns = 4,104,783.8 ns + 25 µs
  // The same step on an H200: only the bandwidth changes.
  const roofline_model h200 = roofline_model::make(llama7b(), preset_options("h200-sxm", 25'000)).value();
  EXPECT_EQ(h200.predict_ns(f), std::llround(bytes / 4.8e12 * 1e9 + 25'000));
}

TEST(Roofline, LongPrefillIsComputeBound) {
  const roofline_model r = roofline_model::make(llama7b(), preset_options("a100-80gb-sxm", 1'000)).value();
  const step_features f{1, 2048, 1, chunk_attention_tokens(0, 2048), 2048};
  const double flops = 2 * 6'476'005'376.0 * 2048 + 2 * 32000.0 * 4096 + 4 * 32 * 4096 * (2048.0 * 2049 / 2);
  EXPECT_FALSE(r.price(f).memory_bound());
  EXPECT_EQ(r.price(f).flops, flops);
  EXPECT_EQ(r.predict_ns(f), std::llround(flops / 312e12 * 1e9 + 1'000));
}

TEST(Roofline, TensorParallelSplitsTheWorkAndPaysTheAllReduces) {
  roofline_options o = preset_options("h100-sxm");
  o.tensor_parallel = 4;
  const roofline_model r = roofline_model::make(llama7b(), o).value();
  const step_features f = decode(99, 8);
  const roofline_breakdown b = r.price(f);
  EXPECT_EQ(b.memory_ns, (13'214'154'752.0 + 800 * 524'288.0) / (4 * 3.35e12) * 1e9);
  // 2 all-reduces per layer of 8 rows * 4096 values * 2 bytes; a ring moves 2 * 3/4 of it.
  EXPECT_EQ(b.communication_ns, 2 * 32 * (2 * 3.0 / 4) * 4096 * 2 * 8 / 900e9 * 1e9);
  EXPECT_EQ(r.predict_ns(f), std::llround(b.memory_ns + b.communication_ns));
}

TEST(Roofline, OverlapHidesThatShareOfTheShorterTerm) {
  const step_features f = decode(99, 8);
  roofline_options o = preset_options("h100-sxm", 1'000);
  const roofline_breakdown full = roofline_model::make(llama7b(), o).value().price(f);
  ASSERT_TRUE(full.memory_bound());
  EXPECT_EQ(full.total_ns(), full.memory_ns + 1'000);  // the classic roofline: the max
  for (const double overlap : {0.0, 0.25}) {
    o.overlap = overlap;
    const roofline_model r = roofline_model::make(llama7b(), o).value();
    const roofline_breakdown b = r.price(f);
    EXPECT_EQ(b.compute_ns, full.compute_ns);
    EXPECT_EQ(b.memory_ns, full.memory_ns);
    EXPECT_EQ(b.total_ns(), full.memory_ns + (1 - overlap) * full.compute_ns + 1'000) << overlap;
    EXPECT_EQ(r.predict_ns(f), std::llround(b.total_ns()));
  }
  // overlap 0: the two terms one after the other.
  o.overlap = 0;
  EXPECT_EQ(roofline_model::make(llama7b(), o).value().price(f).total_ns(), full.memory_ns + full.compute_ns + 1'000);
}

TEST(Roofline, PresetsCarryTheirDatasheetFigures) {
  const auto& presets = hardware_presets();
  ASSERT_EQ(presets.size(), 4u);
  std::string names;
  for (const hardware_preset& p : presets) names += std::string(p.name) + " ";
  EXPECT_EQ(names, "a100-80gb-sxm h100-sxm h200-sxm l4 ");
  const hardware_spec h100 = find_hardware_preset("h100-sxm").value().spec;
  EXPECT_EQ(h100.peak_flops, 989.5e12);
  EXPECT_EQ(h100.memory_bytes_per_s, 3350e9);
  EXPECT_EQ(h100.memory_bytes, 80e9);
  EXPECT_EQ(h100.interconnect_bytes_per_s, 900e9);
  auto unknown = find_hardware_preset("b200");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().message, "unknown hardware preset 'b200'; known: a100-80gb-sxm, h100-sxm, h200-sxm, l4");
}

TEST(Roofline, InvalidOptionsAreErrors) {
  const auto error_of = [](const roofline_options& o) {
    auto r = roofline_model::make(llama7b(), o);
    EXPECT_FALSE(r);
    return r ? std::string() : r.error().message;
  };
  roofline_options o = preset_options("l4");
  EXPECT_EQ(error_of(o), "roofline: the weights (13.21 GB) and the KV pool (40.00 GB) do not fit in 1 x 24.00 GB "
                         "of device memory");
  o.tensor_parallel = 3;  // 72 GB: fits
  EXPECT_TRUE(roofline_model::make(llama7b(), o));
  o.hardware.interconnect_bytes_per_s = 0;
  EXPECT_EQ(error_of(o), "roofline: tensor_parallel = 3 needs an interconnect bandwidth");
  o = preset_options("l4");
  o.hardware.memory_bytes_per_s = 0;
  EXPECT_EQ(error_of(o), "roofline: memory bandwidth must be a positive number, got 0.000000");
  o = preset_options("h100-sxm", -1);
  EXPECT_EQ(error_of(o), "roofline: the step overhead must be >= 0");
  o = preset_options("h100-sxm");
  o.tensor_parallel = 0;
  EXPECT_EQ(error_of(o), "roofline: tensor_parallel must be >= 1, got 0");
  for (const double overlap : {-0.1, 1.5, std::nan("")}) {
    o = preset_options("h100-sxm");
    o.overlap = overlap;
    EXPECT_EQ(error_of(o).rfind("roofline: overlap must be in [0, 1], got ", 0), 0u) << overlap;
  }
}

}  // namespace
}  // namespace troupe::cost

namespace troupe::sim {
namespace {

// A tiny shape (2 layers, dim 64, kv_dim 32, hidden 256, vocab 512: 155,648 parameters) with
// 1-byte weights on a device of 1 GB/s, so that a step's memory time in ns is its bytes.
const char* tiny_roofline = R"([model]
n_layers = 2
dim = 64
n_heads = 8
n_kv_heads = 4
vocab_size = 512
max_context = 512
weight_bytes_per_value = 1

[hardware]
kv_memory_gib = 0.01

[engine]
block_size = 16

[cost]
model = "roofline"
peak_tflops = 1000
memory_bandwidth_gb_s = 1
memory_gb = 1
step_overhead_us = 1
)";

TEST(RooflineTopology, ExplicitNumbersAndPresets) {
  auto t = parse_sim_topology(tiny_roofline, "tiny.toml", "");
  ASSERT_TRUE(t) << t.error().message;
  ASSERT_TRUE(t->roofline);
  EXPECT_EQ(t->roofline->weight_bytes(), 155'648.0);
  EXPECT_EQ(t->roofline->kv_bytes_per_token(), 2.0 * 2 * 32 * 2);
  EXPECT_EQ(t->roofline->options().step_overhead_ns, 1000.0);
  EXPECT_EQ(t->roofline->options().overlap, 1.0);
  t = parse_sim_topology(std::string(tiny_roofline) + "overlap = 0.4\n", "tiny.toml", "");
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->roofline->options().overlap, 0.4);
  // A preset, one figure overridden.
  std::string text = tiny_roofline;
  text = text.substr(0, text.find("peak_tflops")) + "preset = \"h100-sxm\"\nmemory_bandwidth_gb_s = 2000\n";
  t = parse_sim_topology(text, "tiny.toml", "");
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->roofline->options().hardware.peak_flops, 989.5e12);
  EXPECT_EQ(t->roofline->options().hardware.memory_bytes_per_s, 2000e9);
  EXPECT_EQ(t->roofline->options().hardware.memory_bytes, 80e9);
  auto example = load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/sim-llama7b-h100.toml");
  ASSERT_TRUE(example) << example.error().message;
  EXPECT_EQ(example->roofline->weight_bytes(), 13'214'154'752.0);
}

TEST(RooflineTopology, BadKeysNameTheProblem) {
  const std::string base = tiny_roofline;
  const std::string head = base.substr(0, base.find("model = \"roofline\""));
  const std::pair<std::string, std::string> cases[] = {
      {head + "model = \"magic\"\n", "[cost] model must be \"calibrated\" or \"roofline\", got \"magic\""},
      {base + "step_ns = 1\ntoken_ns = 1\nsampled_row_ns = 1\nattention_token_ns = 1\n",
       "[cost] model = \"roofline\" prices steps from the hardware"},
      {head + "step_ns = 1\ntoken_ns = 1\nsampled_row_ns = 1\nattention_token_ns = 1\npreset = \"l4\"\n",
       "belong to model = \"roofline\""},
      {head + "model = \"roofline\"\npeak_tflops = 1\nmemory_gb = 1\n",
       "[cost] model = \"roofline\" needs preset = NAME or memory_bandwidth_gb_s"},
      {head + "model = \"roofline\"\npreset = \"tpu\"\n", "[cost] preset: unknown hardware preset 'tpu'; known:"},
      {base + "tensor_parallel = 1.5\n", "[cost] tensor_parallel must be a whole number of devices"},
      {base + "tensor_parallel = 2\n", "tensor_parallel = 2 needs an interconnect bandwidth"},
      {head + "model = \"roofline\"\npeak_tflops = -1\n", "[cost] peak_tflops = -1.000000 is outside"},
      {head + "model = \"roofline\"\npreset = \"l4\"\nmemory_gb = 0.001\n", "do not fit in 1 x 0.00 GB of device memory"},
      {base + "overlap = 1.5\n", "[cost] overlap = 1.500000 is outside"},
      {head + "step_ns = 1\ntoken_ns = 1\nsampled_row_ns = 1\nattention_token_ns = 1\noverlap = 0.5\n",
       "step_overhead_us and overlap belong to model = \"roofline\""},
  };
  for (const auto& [text, message] : cases) {
    auto t = parse_sim_topology(text, "tiny.toml", "");
    ASSERT_FALSE(t) << message;
    EXPECT_EQ(t.error().code, errc::malformed_file);
    EXPECT_NE(t.error().message.find(message), std::string::npos) << t.error().message;
  }
}

TEST(RooflineSimulation, HandComputedTimes) {
  // One request: 16 prompt tokens, 3 new. Every step is memory-bound: 155,648 weight bytes +
  // 256 bytes per KV position read, at 1 byte/ns, + 1 µs. Step 0 prefills positions 0..15
  // (reads 16): 160,744 ns. Step 1 decodes position 16 (reads 17): 161,000 ns. Step 2 decodes
  // position 17 (reads 18): 161,256 ns.
  auto t = parse_sim_topology(tiny_roofline, "tiny.toml", "");
  ASSERT_TRUE(t) << t.error().message;
  sim_options o;
  o.topology = *t;
  o.workload = {trace_request{0, 16, 3, {}}};
  o.seed = 7;
  auto r = run_simulation(o);
  ASSERT_TRUE(r) << r.error().message;
  const request_record& q = r->requests.at(0);
  EXPECT_EQ(q.first_token_ns, 160'744);
  EXPECT_EQ(q.itl_ns, (std::vector<int64_t>{161'000, 161'256}));
  EXPECT_EQ(q.finish_ns, 483'000);
}

}  // namespace
}  // namespace troupe::sim
