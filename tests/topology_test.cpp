// Topology files: the shipped examples parse to exactly what they say, and every class of bad
// file gets one malformed_file error naming the file, the line and the key.
#include "topology/topology.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace troupe;
using namespace troupe::topology;

namespace {

const std::string examples_dir = TROUPE_SOURCE_DIR "/examples";

std::string model_file(const char* name) {
  return (fs::path(TROUPE_MODELS_DIR) / name).lexically_normal().string();
}

expected<topology::topology> parse(const std::string& text) {
  return parse_topology(text, "topology.toml", examples_dir);
}

// Building blocks of the inline documents. k_valid is lines 1-11; text appended to it lands in
// the [[engine]] table 'engine0' from line 12 on.
const std::string k_node0 = R"([[node]]
name = "node0"
host = "127.0.0.1"
port = 7100
)";  // lines 1-4
const std::string k_balancer = R"([load_balancer]
node = "node0"
)";  // lines 5-6
const std::string k_engine0 = R"([[engine]]
name = "engine0"
node = "node0"
model = "../models/stories260K.bin"
tokenizer = "../models/tok512.bin"
)";  // lines 7-11
const std::string k_valid = k_node0 + k_balancer + k_engine0;

/// An engine table on node0 with the given name and role (5 lines).
std::string engine_text(const std::string& name, const std::string& role) {
  return "[[engine]]\nname = \"" + name + "\"\nnode = \"node0\"\nrole = \"" + role +
         "\"\nmodel = \"../models/stories260K.bin\"\ntokenizer = \"../models/tok512.bin\"\n";
}

// [tls] (lines 1-2) and node0's credentials. Parsing only stats TLS files (a node reads them
// at start-up: actors::check_credentials), so any existing file stands in for a PEM file here.
const std::string k_tls = "[tls]\nca = \"../models/NOTICE.md\"\n";
const std::string k_node0_credentials = "certificate = \"../models/NOTICE.md\"\nkey = \"../models/tok512.bin\"\n";

/// A topology (not parsed: check_port_security takes plain data) with one node per host.
topology::topology with_hosts(const std::vector<std::string>& hosts) {
  topology::topology t;
  for (size_t i = 0; i < hosts.size(); i++) t.nodes.push_back(node_spec{"node" + std::to_string(i), hosts[i], 7100});
  return t;
}

}  // namespace

TEST(Topology, SingleNodeExampleParses) {
  auto topo = load_topology(examples_dir + "/single-node.toml");
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->cluster_name, "single-node");
  ASSERT_EQ(topo->nodes.size(), 1u);
  EXPECT_EQ(topo->nodes[0].name, "node0");
  EXPECT_EQ(topo->nodes[0].address, "127.0.0.1");
  EXPECT_EQ(topo->nodes[0].port, 7100);
  EXPECT_EQ(topo->nodes[0].kv_port, 8100);
  EXPECT_EQ(topo->kv_transfer, kv_transfer_kind::caf);
  EXPECT_EQ(topo->load_balancer.node, "node0");
  EXPECT_EQ(topo->load_balancer.max_waiting, 1024);
  EXPECT_EQ(topo->load_balancer.prefill_tier_bounds, (std::vector<int32_t>{128, 512, 2048}));
  EXPECT_EQ(topo->load_balancer.report_interval_ms, 20);
  EXPECT_EQ(topo->load_balancer.connect_timeout_ms, 10000);
  EXPECT_EQ(topo->load_balancer.heartbeat_interval_ms, 1000);
  EXPECT_EQ(topo->load_balancer.heartbeat_timeout_ms, 5000);
  ASSERT_EQ(topo->engines.size(), 1u);
  const engine_spec& engine = topo->engines[0];
  EXPECT_EQ(engine.name, "engine0");
  EXPECT_EQ(engine.node, "node0");
  EXPECT_EQ(engine.role, engine_role::mixed);
  EXPECT_EQ(engine.model_path, model_file("stories260K.bin"));
  EXPECT_EQ(engine.tokenizer_path, model_file("tok512.bin"));
  EXPECT_TRUE(fs::path(engine.model_path).is_absolute());
  EXPECT_EQ(engine.config.num_kv_blocks, 1024);
  EXPECT_EQ(engine.config.block_size, 16);
  EXPECT_EQ(engine.config.scheduler.max_num_batched_tokens, 512);
  EXPECT_EQ(engine.config.scheduler.max_num_seqs, 256);
  EXPECT_EQ(engine.executor_threads, 1);
  ASSERT_NE(topo->find_node("node0"), nullptr);
  EXPECT_EQ(topo->find_node("node0")->port, 7100);
  EXPECT_EQ(topo->find_node("node1"), nullptr);
}

TEST(Topology, ThreeNodeExampleParses) {
  auto topo = load_topology(examples_dir + "/three-node.toml");
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->cluster_name, "three-node");
  EXPECT_EQ(topo->kv_transfer, kv_transfer_kind::caf);
  ASSERT_EQ(topo->nodes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(topo->nodes[i].name, "node" + std::to_string(i));
    EXPECT_EQ(topo->nodes[i].address, "127.0.0.1");
    EXPECT_EQ(topo->nodes[i].port, 7100 + i);
    EXPECT_EQ(topo->nodes[i].kv_port, 8100 + i);
  }
  EXPECT_EQ(topo->load_balancer.node, "node0");
  EXPECT_EQ(topo->load_balancer.max_waiting, 256);
  EXPECT_EQ(topo->load_balancer.prefill_tier_bounds, (std::vector<int32_t>{128, 512, 2048}));
  EXPECT_EQ(topo->load_balancer.report_interval_ms, 20);
  EXPECT_EQ(topo->load_balancer.connect_timeout_ms, 10000);
  ASSERT_EQ(topo->engines.size(), 3u);
  EXPECT_EQ(topo->engines[0].name, "prefill0");
  EXPECT_EQ(topo->engines[0].node, "node0");
  EXPECT_EQ(topo->engines[0].role, engine_role::prefill);
  EXPECT_EQ(topo->engines[0].config.scheduler.max_num_batched_tokens, 1024);
  EXPECT_EQ(topo->engines[0].config.num_kv_blocks, 1024);
  for (int i = 1; i < 3; ++i) {
    const engine_spec& decode = topo->engines[i];
    EXPECT_EQ(decode.name, "decode" + std::to_string(i));
    EXPECT_EQ(decode.node, "node" + std::to_string(i));
    EXPECT_EQ(decode.role, engine_role::decode);
    EXPECT_EQ(decode.config.num_kv_blocks, 2048);
    EXPECT_EQ(decode.config.scheduler.max_num_batched_tokens, 512);
    EXPECT_EQ(decode.model_path, model_file("stories260K.bin"));
    EXPECT_EQ(decode.tokenizer_path, model_file("tok512.bin"));
  }
}

TEST(Topology, TwoBalancersExampleParses) {
  auto topo = load_topology(examples_dir + "/two-balancers.toml");
  ASSERT_TRUE(topo) << topo.error().message;
  ASSERT_EQ(topo->nodes.size(), 4u);
  EXPECT_EQ(topo->load_balancer.nodes, (std::vector<std::string>{"lb0", "lb1"}));
  EXPECT_EQ(topo->load_balancer.node, "lb0");
  EXPECT_EQ(topo->find_node("lb1")->port, 7103);
  ASSERT_EQ(topo->engines.size(), 3u);
  for (const engine_spec& e : topo->engines) EXPECT_FALSE(topo->load_balancer.runs_on(e.node)) << e.name;
}

TEST(Topology, MinimalFileTakesEveryDefault) {
  auto topo = parse(k_valid);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->cluster_name, "troupe");
  EXPECT_EQ(topo->kv_transfer, kv_transfer_kind::caf);
  ASSERT_EQ(topo->nodes.size(), 1u);
  EXPECT_EQ(topo->nodes[0].kv_port, 8100);
  EXPECT_EQ(topo->load_balancer.max_waiting, 1024);
  EXPECT_EQ(topo->load_balancer.prefill_tier_bounds, (std::vector<int32_t>{128, 512, 2048}));
  EXPECT_EQ(topo->load_balancer.report_interval_ms, 20);
  EXPECT_EQ(topo->load_balancer.connect_timeout_ms, 10000);
  ASSERT_EQ(topo->engines.size(), 1u);
  const engine_spec& engine = topo->engines[0];
  const engine::engine_config defaults;
  EXPECT_EQ(engine.role, engine_role::mixed);
  EXPECT_EQ(engine.config.num_kv_blocks, defaults.num_kv_blocks);
  EXPECT_EQ(engine.config.block_size, defaults.block_size);
  EXPECT_EQ(engine.config.scheduler.max_num_batched_tokens,
            defaults.scheduler.max_num_batched_tokens);
  EXPECT_EQ(engine.config.scheduler.max_num_seqs, defaults.scheduler.max_num_seqs);
  EXPECT_EQ(engine.executor_threads, 1);
  EXPECT_EQ(topo->limits.max_message_mib, 64);
  EXPECT_EQ(topo->limits.max_pending_per_client, 256);
  EXPECT_EQ(topo->limits.idle_timeout_ms, 30000);
  EXPECT_EQ(topo->limits.tls_handshake_timeout_ms, 5000);
  EXPECT_EQ(topo->limits.max_connections, 1024);
  EXPECT_EQ(topo->limits.max_connections_per_address, 64);
  EXPECT_FALSE(topo->http.has_value());
}

TEST(Topology, HttpKeysAreReadWithTheirDefaults) {
  auto topo = parse("[http]\nport = 8000\n" + k_valid);
  ASSERT_TRUE(topo) << topo.error().message;
  ASSERT_TRUE(topo->http.has_value());
  EXPECT_EQ(topo->http->port, 8000);
  EXPECT_EQ(topo->http->address, "127.0.0.1");
  EXPECT_EQ(topo->http->drain_timeout_ms, 30000);
  EXPECT_TRUE(topo->http->served_model_names.empty());
  auto every = parse("[http]\nport = 0\nhost = \"::1\"\ndrain_timeout_ms = 1\nserved_model_names = [\"tiny\", \"s\"]\n" +
                     k_valid);
  ASSERT_TRUE(every) << every.error().message;
  EXPECT_EQ(every->http->port, 0);
  EXPECT_EQ(every->http->address, "::1");
  EXPECT_EQ(every->http->drain_timeout_ms, 1);
  EXPECT_EQ(every->http->served_model_names, (std::vector<std::string>{"tiny", "s"}));
  auto upper = parse("[http]\nport = 65535\nhost = \"gateway-1.example\"\ndrain_timeout_ms = 600000\n" + k_valid);
  ASSERT_TRUE(upper) << upper.error().message;
  EXPECT_EQ(upper->http->port, 65535);
  EXPECT_EQ(upper->http->address, "gateway-1.example");
  EXPECT_EQ(upper->http->drain_timeout_ms, 600000);
  // The balancer node's CAF port is taken, but not on another host.
  auto elsewhere = parse("[http]\nport = 7100\nhost = \"0.0.0.0\"\n" + k_valid);
  ASSERT_TRUE(elsewhere) << elsewhere.error().message;
}

/// `"m1", "m2", ...`: `count` distinct names as a TOML array's elements.
std::string quoted_names(int count) {
  std::string names;
  for (int i = 1; i <= count; i++) names += (i > 1 ? ", \"m" : "\"m") + std::to_string(i) + "\"";
  return names;
}

TEST(Topology, HttpServedModelNamesAreBoundedDistinctNames) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"\"tiny\"", "must be an array of 1 to 16 strings"},
      {"[]", "must be an array of 1 to 16 strings"},
      {"[" + quoted_names(17) + "]", "must be an array of 1 to 16 strings"},
      {"[\"a\", 1]", "element 2 must be a string of 1 to 256 bytes"},
      {"[\"\"]", "element 1 must be a string of 1 to 256 bytes"},
      {"[\"" + std::string(257, 'm') + "\"]", "element 1 must be a string of 1 to 256 bytes"},
      {"[\"a\", \"a\"]", "element 2 repeats 'a'"},
  };
  for (const auto& [value, message] : cases) {
    auto topo = parse("[http]\nport = 8000\nserved_model_names = " + value + "\n" + k_valid);
    ASSERT_FALSE(topo) << value;
    EXPECT_NE(topo.error().message.find("topology.toml:3: http: key 'served_model_names' " + message), std::string::npos)
        << topo.error().message;
  }
  auto sixteen = parse("[http]\nport = 8000\nserved_model_names = [" + quoted_names(16) + "]\n" + k_valid);
  ASSERT_TRUE(sixteen) << sixteen.error().message;
  EXPECT_EQ(sixteen->http->served_model_names.size(), 16u);
}

TEST(Topology, EveryLimitsKeyIsReadAtItsBounds) {
  auto topo = parse("[limits]\nmax_message_mib = 4095\nmax_pending_per_client = 1\nidle_timeout_ms = 0\n"
                    "tls_handshake_timeout_ms = 100\nmax_connections = 1\nmax_connections_per_host = 1\n" + k_valid);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->limits.max_message_mib, 4095);
  EXPECT_EQ(topo->limits.max_pending_per_client, 1);
  EXPECT_EQ(topo->limits.idle_timeout_ms, 0);
  EXPECT_EQ(topo->limits.tls_handshake_timeout_ms, 100);
  EXPECT_EQ(topo->limits.max_connections, 1);
  EXPECT_EQ(topo->limits.max_connections_per_address, 1);
  auto upper = parse("[limits]\nmax_message_mib = 1\nidle_timeout_ms = 3600000\ntls_handshake_timeout_ms = 600000\n" +
                     k_valid);
  ASSERT_TRUE(upper) << upper.error().message;
  EXPECT_EQ(upper->limits.max_message_mib, 1);
  EXPECT_EQ(upper->limits.idle_timeout_ms, 3600000);
  EXPECT_EQ(upper->limits.tls_handshake_timeout_ms, 600000);
}

// [gateway] (issue 47): each key read at its bounds; one left out keeps the gateway's default
// (nullopt), and an unknown key or a value out of range names itself.
TEST(Topology, GatewayKeysAreReadAtTheirBoundsAndLeftOutOnesKeepTheGatewaysDefaults) {
  auto none = parse(k_valid);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_FALSE(none->gateway.max_connections.has_value());
  EXPECT_FALSE(none->gateway.priority_min.has_value());
  auto low = parse("[gateway]\nmax_connections = 1\nmax_connections_per_address = 1\nmax_in_flight_per_connection = 1\n"
                   "output_mib = 1\nidle_timeout_ms = 1\nheader_timeout_ms = 1\nbody_timeout_ms = 1\n"
                   "write_timeout_ms = 1\npriority_min = -2147483648\n" + k_valid);
  ASSERT_TRUE(low) << low.error().message;
  EXPECT_EQ(low->gateway.max_connections, 1);
  EXPECT_EQ(low->gateway.max_connections_per_address, 1);
  EXPECT_EQ(low->gateway.max_in_flight_per_connection, 1);
  EXPECT_EQ(low->gateway.output_mib, 1);
  EXPECT_EQ(low->gateway.idle_timeout_ms, 1);
  EXPECT_EQ(low->gateway.header_timeout_ms, 1);
  EXPECT_EQ(low->gateway.body_timeout_ms, 1);
  EXPECT_EQ(low->gateway.write_timeout_ms, 1);
  EXPECT_EQ(low->gateway.priority_min, -2147483648LL);
  auto high = parse("[gateway]\nmax_connections = 1048576\noutput_mib = 4096\nidle_timeout_ms = 86400000\n"
                    "write_timeout_ms = 3600000\n" + k_valid);
  ASSERT_TRUE(high) << high.error().message;
  EXPECT_EQ(high->gateway.max_connections, 1048576);
  EXPECT_EQ(high->gateway.output_mib, 4096);
  EXPECT_FALSE(high->gateway.max_connections_per_address.has_value());
  auto over = parse("[gateway]\noutput_mib = 4097\n" + k_valid);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().message, "topology.toml:2: gateway: key 'output_mib' must be in 1..4096, got 4097");
  auto unknown = parse("[gateway]\nmax_conections = 1\n" + k_valid);
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("topology.toml:2: gateway: unknown key 'max_conections'"), std::string::npos)
      << unknown.error().message;
}

TEST(Topology, EveryEngineKeyIsRead) {
  auto topo = parse(k_valid +
                    "role = \"mixed\"\nkv_blocks = 7\nblock_size = 1024\n"
                    "max_num_batched_tokens = 9\nmax_num_seqs = 3\nexecutor_threads = 64\n");
  ASSERT_TRUE(topo) << topo.error().message;
  const engine_spec& engine = topo->engines[0];
  EXPECT_EQ(engine.config.num_kv_blocks, 7);
  EXPECT_EQ(engine.config.block_size, 1024);
  EXPECT_EQ(engine.config.scheduler.max_num_batched_tokens, 9);
  EXPECT_EQ(engine.config.scheduler.max_num_seqs, 3);
  EXPECT_EQ(engine.executor_threads, 64);
  EXPECT_EQ(engine.config.scheduler.step_time_budget_ms, 0);  // off unless asked for
  EXPECT_EQ(engine.config.scheduler.kv_watermark, 0);
  auto watermarked = parse(k_valid + "kv_watermark = 0.05\n");
  ASSERT_TRUE(watermarked) << watermarked.error().message;
  EXPECT_EQ(watermarked->engines[0].config.scheduler.kv_watermark, 0.05);
  EXPECT_EQ(engine.config.scheduler.prefix_cache_slack_tokens, 0);
  auto slack = parse(k_valid + "prefix_cache_slack_tokens = 6\n");
  ASSERT_TRUE(slack) << slack.error().message;
  EXPECT_EQ(slack->engines[0].config.scheduler.prefix_cache_slack_tokens, 6);
  EXPECT_EQ(engine.config.scheduler.policy.name, "priority");
  auto sjf = parse(k_valid + "scheduler = \"sjf\"\nsjf_aging_tokens = 64\n");
  ASSERT_TRUE(sjf) << sjf.error().message;
  EXPECT_EQ(sjf->engines[0].config.scheduler.policy.name, "sjf");
  EXPECT_EQ(sjf->engines[0].config.scheduler.policy.sjf_aging_tokens, 64);
}

TEST(Topology, ATimeBudgetIsPricedByItsCalibrationFile) {
  auto topo = parse(k_valid + "step_time_budget_ms = 2.5\ncalibration = \"calibration-cpu.toml\"\n");
  ASSERT_TRUE(topo) << topo.error().message;
  const sched::scheduler_config& s = topo->engines[0].config.scheduler;
  EXPECT_EQ(s.step_time_budget_ms, 2.5);
  EXPECT_GT(s.step_cost.token_ns, 0);  // the shipped CPU fit, read whole
  EXPECT_GT(s.step_cost.attention_token_ns, 0);
  auto integer = parse(k_valid + "step_time_budget_ms = 3\ncalibration = \"calibration-cpu.toml\"\n");
  ASSERT_TRUE(integer) << integer.error().message;
  EXPECT_EQ(integer->engines[0].config.scheduler.step_time_budget_ms, 3);
  EXPECT_EQ(integer->engines[0].config.scheduler.step_time_correction_window, 64);  // on by default
  auto off = parse(k_valid + "step_time_budget_ms = 3\ncalibration = \"calibration-cpu.toml\"\n"
                   "step_time_correction_window = 0\n");
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_EQ(off->engines[0].config.scheduler.step_time_correction_window, 0);
}

TEST(Topology, EveryClusterNodeAndBalancerKeyIsRead) {
  auto topo = parse(
      "[cluster]\nname = \"c\"\nkv_transfer = \"ucx\"\n"
      "[[node]]\nname = \"node0\"\nhost = \"127.0.0.1\"\nport = 7100\nkv_port = 9100\n"
      "[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = 65535\nkv_port = 1\n"
      "[load_balancer]\nnode = \"node1\"\nmax_waiting = 3\nprefill_tiers = [1, 64, 4096]\nrouter = \"prefix_affinity\"\nprefix_weight = 2\nrate_limit_per_s = 100\nrate_limit_burst = 5\n"
      "report_interval_ms = 60000\nconnect_timeout_ms = 600000\nheartbeat_interval_ms = 60000\n"
      "heartbeat_timeout_ms = 600000\n" +
      k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->cluster_name, "c");
  EXPECT_EQ(topo->kv_transfer, kv_transfer_kind::ucx);
  ASSERT_EQ(topo->nodes.size(), 2u);
  EXPECT_EQ(topo->nodes[0].port, 7100);
  EXPECT_EQ(topo->nodes[0].kv_port, 9100);
  EXPECT_EQ(topo->nodes[1].port, 65535);
  EXPECT_EQ(topo->nodes[1].kv_port, 1);
  EXPECT_EQ(topo->load_balancer.node, "node1");
  EXPECT_EQ(topo->load_balancer.max_waiting, 3);
  EXPECT_EQ(topo->load_balancer.router, "prefix_affinity");
  EXPECT_EQ(topo->load_balancer.prefix_weight, 2.0);
  EXPECT_EQ(topo->load_balancer.rate_limit_per_s, 100);
  EXPECT_EQ(topo->load_balancer.rate_limit_burst, 5);
  EXPECT_EQ(topo->load_balancer.prefill_tier_bounds, (std::vector<int32_t>{1, 64, 4096}));
  EXPECT_EQ(topo->load_balancer.report_interval_ms, 60000);
  EXPECT_EQ(topo->load_balancer.connect_timeout_ms, 600000);
  EXPECT_EQ(topo->load_balancer.heartbeat_interval_ms, 60000);
  EXPECT_EQ(topo->load_balancer.heartbeat_timeout_ms, 600000);
}

TEST(Topology, AHostTierIsReadPerNodeAndSharedByEnginesOfOneShape) {
  auto none = parse(k_valid);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_EQ(none->nodes[0].host_tier_blocks, 0);
  EXPECT_EQ(none->nodes[0].host_tier_fetch_timeout_ms, 0);
  auto tier = parse(k_node0 + "host_tier_blocks = 4096\nhost_tier_fetch_timeout_ms = 1\n" + k_balancer + k_engine0 +
                    engine_text("engine1", "mixed"));
  ASSERT_TRUE(tier) << tier.error().message;
  EXPECT_EQ(tier->nodes[0].host_tier_blocks, 4096);
  EXPECT_EQ(tier->nodes[0].host_tier_fetch_timeout_ms, 1);
  EXPECT_EQ(tier->nodes[0].disk_tier_dir, "");
  auto disk = parse(k_node0 + "host_tier_blocks = 8\ndisk_tier_dir = \"kv-cache\"\ndisk_tier_mib = 4\n" + k_balancer +
                    k_engine0);
  ASSERT_TRUE(disk) << disk.error().message;
  EXPECT_EQ(disk->nodes[0].disk_tier_dir, (fs::path(examples_dir) / "kv-cache").lexically_normal().string());
  EXPECT_EQ(disk->nodes[0].disk_tier_mib, 4);
  // Without a tier, engines of one node may differ.
  auto mixed = parse(k_valid + engine_text("engine1", "mixed") + "block_size = 32\n");
  ASSERT_TRUE(mixed) << mixed.error().message;
}

TEST(Topology, PreemptionSwapsToTheNodesHostTier) {
  auto plain = parse(k_valid);
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_EQ(plain->engines[0].config.preemption, engine::preemption_mode::recompute);
  EXPECT_EQ(plain->engines[0].config.swap_bandwidth_gb_s, 8);
  auto swap = parse(k_node0 + "host_tier_blocks = 64\n" + k_balancer + k_engine0 +
                    "preemption = \"swap\"\nswap_bandwidth_gb_s = 2.5\n");
  ASSERT_TRUE(swap) << swap.error().message;
  EXPECT_EQ(swap->engines[0].config.preemption, engine::preemption_mode::swap);
  EXPECT_EQ(swap->engines[0].config.swap_bandwidth_gb_s, 2.5);
}

TEST(Topology, GrammarLimitsAreEngineKeys) {
  auto plain = parse(k_valid);
  ASSERT_TRUE(plain) << plain.error().message;
  const grammar::grammar_limits& defaults = plain->engines[0].config.grammar;
  EXPECT_EQ(defaults.num_rules_max, 10000);
  EXPECT_EQ(defaults.num_stacks_per_state_max, 65536);
  EXPECT_EQ(defaults.matcher_memory_bytes_max, int64_t{256} << 20);
  EXPECT_EQ(defaults.cache_memory_bytes_max, int64_t{64} << 20);
  auto set = parse(k_valid + "grammar_rules_max = 500\ngrammar_stacks_per_state_max = 4096\ngrammar_matcher_mib = 32\n"
                             "grammar_cache_mib = 0\n");
  ASSERT_TRUE(set) << set.error().message;
  const grammar::grammar_limits& limits = set->engines[0].config.grammar;
  EXPECT_EQ(limits.num_rules_max, 500);
  EXPECT_EQ(limits.num_elements_max, 5000);
  EXPECT_EQ(limits.num_stacks_per_state_max, 4096);
  EXPECT_EQ(limits.matcher_memory_bytes_max, int64_t{32} << 20);
  EXPECT_EQ(limits.cache_memory_bytes_max, 0);
  EXPECT_EQ(parse(k_valid + "grammar_stacks_per_state_max = 0\n").error().message,
            "topology.toml:12: engine 'engine0': key 'grammar_stacks_per_state_max' must be in 1..16777216, got 0");
}

namespace {

/// A second node (4 lines), for a shard host.
const std::string k_node1 = "[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = 7101\n";

const std::string k_node2 = "[[node]]\nname = \"node2\"\nhost = \"127.0.0.1\"\nport = 7102\n";
/// node0..node2 (lines 1-12) and a [load_balancer] whose line 14 is `balancer_line`.
std::string three_nodes_balanced(const std::string& balancer_line) {
  return k_node0 + k_node1 + k_node2 + "[load_balancer]\n" + balancer_line + "\n";
}

/// An [[expert_shard]] of engine0 on `node` (4 lines: experts on the last).
std::string shard_text(const std::string& node, const std::string& experts) {
  return "[[expert_shard]]\nengine = \"engine0\"\nnode = \"" + node + "\"\nexperts = " + experts + "\n";
}

}  // namespace

TEST(Topology, SeveralBalancerNodesAreReadInOrderAndTheFirstIsTheNode) {
  auto topo = parse(three_nodes_balanced("nodes = [\"node2\", \"node1\"]") + k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->load_balancer.node, "node2");
  EXPECT_EQ(topo->load_balancer.nodes, (std::vector<std::string>{"node2", "node1"}));
  EXPECT_EQ(topo->load_balancer.all_nodes(), (std::vector<std::string>{"node2", "node1"}));
  EXPECT_TRUE(topo->load_balancer.runs_on("node1"));
  EXPECT_TRUE(topo->load_balancer.runs_on("node2"));
  EXPECT_FALSE(topo->load_balancer.runs_on("node0"));
  // One node in `nodes` is `node`; `node` alone lists itself.
  auto one = parse(three_nodes_balanced("nodes = [\"node0\"]") + k_engine0);
  ASSERT_TRUE(one) << one.error().message;
  EXPECT_EQ(one->load_balancer.node, "node0");
  auto plain = parse(k_valid);
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_TRUE(plain->load_balancer.nodes.empty());
  EXPECT_EQ(plain->load_balancer.all_nodes(), (std::vector<std::string>{"node0"}));
}

TEST(Topology, ExpertShardsAreReadInFileOrderOnTheEnginesNodeOrAShardHost) {
  auto plain = parse(k_valid);
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_TRUE(plain->expert_shards.empty());
  EXPECT_EQ(plain->engines[0].expert_timeout_ms, 10000);
  auto topo = parse(k_node0 + k_node1 + k_balancer + k_engine0 + "expert_timeout_ms = 250\n" +
                    shard_text("node1", "[0, 1]") + shard_text("node0", "[1, 2, 3]"));
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->engines[0].expert_timeout_ms, 250);
  ASSERT_EQ(topo->expert_shards.size(), 2u);
  EXPECT_EQ(topo->expert_shards[0].engine, "engine0");
  EXPECT_EQ(topo->expert_shards[0].node, "node1");
  EXPECT_EQ(topo->expert_shards[0].experts, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(topo->expert_shards[1].node, "node0");
  EXPECT_EQ(topo->expert_shards[1].experts, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(topo->find_engine("engine0"), &topo->engines[0]);
  EXPECT_EQ(topo->engines[0].expert_window_steps, 0);  // reassignment off
  EXPECT_EQ(topo->engines[0].expert_capacity, 0);
  EXPECT_EQ(topo->engines[0].expert_moe_lb_max, 1.15);
  EXPECT_EQ(topo->engines[0].expert_move_steps_max, 4);
  auto moving = parse(k_valid + "expert_window_steps = 8\nexpert_capacity = 3\nexpert_moe_lb_max = 1.3\n"
                      "expert_move_steps_max = 2\n" + shard_text("node0", "[0, 1, 2, 3]"));
  ASSERT_TRUE(moving) << moving.error().message;
  EXPECT_EQ(moving->engines[0].expert_window_steps, 8);
  EXPECT_EQ(moving->engines[0].expert_capacity, 3);
  EXPECT_EQ(moving->engines[0].expert_moe_lb_max, 1.3);
  EXPECT_EQ(moving->engines[0].expert_move_steps_max, 2);
  EXPECT_EQ(topo->find_engine("engine1"), nullptr);
}

TEST(Topology, KvTransferNamesItsKinds) {
  EXPECT_STREQ(to_string(kv_transfer_kind::caf), "caf");
  EXPECT_STREQ(to_string(kv_transfer_kind::ucx), "ucx");
  auto topo = parse("[cluster]\nkv_transfer = \"caf\"\n" + k_valid);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->kv_transfer, kv_transfer_kind::caf);
  EXPECT_EQ(topo->cluster_name, "troupe");
}

TEST(Topology, BalancerTimingKeysAcceptTheirLowerBounds) {
  auto topo = parse(k_node0 +
                    "[load_balancer]\nnode = \"node0\"\nreport_interval_ms = 1\n"
                    "connect_timeout_ms = 1\nheartbeat_interval_ms = 1\nheartbeat_timeout_ms = 2\n" +
                    k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->load_balancer.report_interval_ms, 1);
  EXPECT_EQ(topo->load_balancer.connect_timeout_ms, 1);
  EXPECT_EQ(topo->load_balancer.heartbeat_interval_ms, 1);
  EXPECT_EQ(topo->load_balancer.heartbeat_timeout_ms, 2);
}

TEST(Topology, EmptyPrefillTiersIsOneTier) {
  auto topo = parse(k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = []\n" +
                    k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_TRUE(topo->load_balancer.prefill_tier_bounds.empty());
}

TEST(Topology, SixteenPrefillTierBoundsAreAccepted) {
  std::string bounds;
  std::vector<int32_t> expected_bounds;
  for (int32_t i = 1; i <= 16; ++i) {
    bounds += (i == 1 ? "" : ", ") + std::to_string(i * 100);
    expected_bounds.push_back(i * 100);
  }
  auto topo = parse(k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [" + bounds +
                    "]\n" + k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->load_balancer.prefill_tier_bounds, expected_bounds);
}

TEST(Topology, HighPortNeedsOnlyAnExplicitKvPort) {
  auto topo = parse(
      "[[node]]\nname = \"node0\"\nhost = \"127.0.0.1\"\nport = 65000\nkv_port = 65001\n" +
      k_balancer + k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->nodes[0].port, 65000);
  EXPECT_EQ(topo->nodes[0].kv_port, 65001);
  // The largest port whose default still fits.
  auto edge = parse("[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 64535\n" + k_balancer +
                    k_engine0);
  ASSERT_TRUE(edge) << edge.error().message;
  EXPECT_EQ(edge->nodes[0].kv_port, 65535);
}

TEST(Topology, SamePortsOnDifferentHostsAreAccepted) {
  auto topo = parse(k_node0 +
                    "[[node]]\nname = \"node1\"\nhost = \"10.0.0.2\"\nport = 7100\n"
                    "[[node]]\nname = \"node2\"\nhost = \"10.0.0.3\"\nport = 8100\n"
                    "kv_port = 7100\n" +
                    k_balancer + k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  ASSERT_EQ(topo->nodes.size(), 3u);
  EXPECT_EQ(topo->nodes[1].kv_port, 8100);
  EXPECT_EQ(topo->nodes[2].kv_port, 7100);
}

TEST(Topology, AbsoluteModelPathIsKept) {
  auto topo = parse(k_node0 + k_balancer +
                    "[[engine]]\nname = \"e\"\nnode = \"node0\"\n"
                    "model = \"" TROUPE_MODELS_DIR
                    "/stories260K.bin\"\n"
                    "tokenizer = \"" TROUPE_MODELS_DIR "/tok512.bin\"\n");
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->engines[0].model_path, model_file("stories260K.bin"));
}

TEST(Topology, PrefillWithDecodeAndMixedWithDecodeAreAccepted) {
  EXPECT_TRUE(
      parse(k_node0 + k_balancer + engine_text("p", "prefill") + engine_text("d", "decode")));
  EXPECT_TRUE(parse(k_node0 + k_balancer + engine_text("m", "mixed") + engine_text("d", "decode")));
  EXPECT_TRUE(
      parse(k_node0 + k_balancer + engine_text("m", "mixed") + engine_text("p", "prefill")));
}

TEST(Topology, TlsCaAndNodeCredentialsAreRead) {
  auto topo = parse(k_tls + k_node0 + k_node0_credentials + k_balancer + k_engine0);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->tls_ca, model_file("NOTICE.md"));
  ASSERT_EQ(topo->nodes.size(), 1u);
  EXPECT_EQ(topo->nodes[0].certificate, model_file("NOTICE.md"));
  EXPECT_EQ(topo->nodes[0].key, model_file("tok512.bin"));
  EXPECT_EQ(check_port_security(*topo, false), port_security::tls);
}

TEST(Topology, WithoutTlsThereAreNoCredentials) {
  auto topo = parse(k_valid);
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->tls_ca, "");
  EXPECT_EQ(topo->nodes[0].certificate, "");
  EXPECT_EQ(topo->nodes[0].key, "");
}

// ---- The plaintext rule: TLS, or every node on loopback, or --insecure. ----

TEST(PortSecurity, LoopbackIs127Slash8LocalhostAndIpv6One) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "127.255.255.255", "localhost", "::1"})
    EXPECT_TRUE(is_loopback(host)) << host;
  for (const char* host : {"0:0:0:0:0:0:0:1", "::ffff:127.0.0.2"}) EXPECT_TRUE(is_loopback(host)) << host;
  // A name that starts like an address is a name (today: "127.evil.example" was loopback).
  for (const char* host : {"0.0.0.0", "10.0.0.1", "128.0.0.1", "1127.0.0.1", "localhost.example.com", "::", "",
                           "node1", "127.evil.example", "127.0.0.1.nip.io", "127.", "127.0.0.1 ", "::ffff:10.0.0.1"})
    EXPECT_FALSE(is_loopback(host)) << host;
}

TEST(PortSecurity, PlaintextOnLoopbackIsAllowedWithAWarning) {
  const topology::topology t = with_hosts({"127.0.0.1", "localhost", "::1"});
  EXPECT_EQ(check_port_security(t, false), port_security::plaintext_loopback);
  EXPECT_EQ(check_port_security(t, true), port_security::plaintext_loopback);
  EXPECT_EQ(security_warning(port_security::plaintext_loopback),
            "no [tls] in the topology: the CAF port is unauthenticated plaintext (allowed because every node is on "
            "a loopback address; any local process can reach it)");
}

TEST(PortSecurity, PlaintextOffLoopbackIsRefusedNamingTheNodeUnlessInsecure) {
  const topology::topology t = with_hosts({"127.0.0.1", "10.0.0.7", "10.0.0.8"});
  auto refused = check_port_security(t, false);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::invalid_argument);
  EXPECT_EQ(refused.error().message,
            "node 'node1' listens on 10.0.0.7, not a loopback address, and the topology has no [tls] table: anyone "
            "who reaches the port could join the cluster. Add [tls] with a certificate per node (troupe certs makes "
            "them; docs/security.md), or pass --insecure on a network you trust");
  EXPECT_EQ(check_port_security(t, true), port_security::plaintext_insecure);
  EXPECT_EQ(security_warning(port_security::plaintext_insecure).rfind("INSECURE (--insecure): ", 0), 0u);
}

TEST(PortSecurity, TlsIsAllowedAnywhereAndNeedsNoWarning) {
  topology::topology t = with_hosts({"10.0.0.7", "127.0.0.1"});
  t.tls_ca = "/certs/ca.pem";
  EXPECT_EQ(check_port_security(t, false), port_security::tls);
  EXPECT_EQ(check_port_security(t, true), port_security::tls);
  EXPECT_EQ(security_warning(port_security::tls), "");
}

// ---- Each class of error: one document, one exact message fragment (with its line). ----

struct bad_file {
  const char* name;
  std::string text;
  std::string message;  ///< must appear in the error message
};

std::ostream& operator<<(std::ostream& out, const bad_file& c) { return out << c.name; }


class TopologyError : public ::testing::TestWithParam<bad_file> {};

TEST_P(TopologyError, IsMalformedFileWithLocatedMessage) {
  const bad_file& c = GetParam();
  auto topo = parse(c.text);
  ASSERT_FALSE(topo) << "accepted:\n" << c.text;
  EXPECT_EQ(topo.error().code, errc::malformed_file);
  EXPECT_NE(topo.error().message.find(c.message), std::string::npos)
      << "message: " << topo.error().message << "\nwanted:  " << c.message;
}

const std::string examples_models = (fs::path(examples_dir) / "../models").lexically_normal();

INSTANTIATE_TEST_SUITE_P(
    Topology, TopologyError,
    ::testing::Values(
        // Syntax.
        bad_file{"syntax_error", "[[node]]\nname = \n", "topology.toml:2:8: TOML syntax error: "},
        bad_file{"duplicate_key_is_syntax_error", k_node0 + "port = 7101\n", "topology.toml:5:"},
        // Unknown keys, at every level.
        bad_file{"unknown_engine_key", k_valid + "kv_block = 5\n",
                 "topology.toml:12: engine 'engine0': unknown key 'kv_block' (expected one of: "
                 "name, node, role, model, tokenizer, calibration, draft_model, executor_threads, max_model_len, step_log, layout_cache, "
                 "expert_timeout_ms, expert_window_steps, expert_capacity, expert_moe_lb_max, expert_move_steps_max, "
                 "kv_blocks, block_size, kv_cache_dtype, max_num_batched_tokens, max_num_seqs, step_time_budget_ms, "
                 "step_time_correction_window, kv_watermark, prefix_cache_slack_tokens, scheduler, sjf_aging_tokens, "
                 "drafter, num_speculative_tokens, ngram_min, ngram_max, draft_layers, speculation_mode, preemption, "
                 "copy_stream_min_bytes, swap_bandwidth_gb_s, grammar_rules_max, grammar_stacks_per_state_max, grammar_matcher_mib, "
                 "grammar_cache_mib)"},
        // Preemption.
        bad_file{"unknown_preemption", k_valid + "preemption = \"drop\"\n",
                 "topology.toml:12: engine 'engine0': key 'preemption' must be recompute, swap or cost; got 'drop'"},
        bad_file{"preemption_cost_without_calibration", k_valid + "preemption = \"cost\"\n",
                 "topology.toml:12: engine 'engine0': key 'preemption' = \"cost\" needs key 'calibration' (a "
                 "`troupe calibrate` file that prices recomputing)"},
        bad_file{"preemption_swap_without_a_host_tier", k_valid + "preemption = \"swap\"\n",
                 "topology.toml:12: engine 'engine0': key 'preemption' swaps to the host tier: node 'node0' needs one "
                 "(host_tier_blocks)"},
        bad_file{"swap_bandwidth_zero", k_valid + "swap_bandwidth_gb_s = 0\n",
                 "topology.toml:12: engine 'engine0': key 'swap_bandwidth_gb_s' must be in 1e-06..1000000, got 0"},
        bad_file{"bad_speculation_mode", k_valid + "speculation_mode = \"sometimes\"\n",
                 "topology.toml:12: engine 'engine0': key 'speculation_mode' must be fixed or budgeted; got "
                 "'sometimes'"},
        // Speculative decoding.
        bad_file{"unknown_drafter", k_valid + "drafter = \"medusa\"\n",
                 "topology.toml:12: engine 'engine0': key 'drafter': unknown drafter 'medusa' (expected none, ngram, "
                 "layer_skip or draft_model)"},
        bad_file{"draft_model_without_path", k_valid + "drafter = \"draft_model\"\n",
                 "topology.toml:12: engine 'engine0': key 'drafter' = \"draft_model\" needs key 'draft_model'"},
        bad_file{"too_many_drafts", k_valid + "drafter = \"ngram\"\nnum_speculative_tokens = 17\n",
                 "num_speculative_tokens"},
        bad_file{"unknown_node_key",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nip = \"1.2.3.4\"\nport = 1\n",
                 "topology.toml:4: node 'node0': unknown key 'ip'"},
        bad_file{"unknown_balancer_key", k_node0 + "[load_balancer]\nnode = \"node0\"\nqueue = 3\n",
                 "topology.toml:7: load_balancer: unknown key 'queue'"},
        bad_file{"unknown_cluster_key", "[cluster]\nname = \"c\"\nsize = 3\n" + k_valid,
                 "topology.toml:3: cluster: unknown key 'size'"},
        bad_file{"unknown_cluster_key_lists_kv_transfer", "[cluster]\nkv = \"ucx\"\n" + k_valid,
                 "topology.toml:2: cluster: unknown key 'kv' (expected one of: name, "
                 "kv_transfer, drain_grace_ms)"},
        bad_file{"drain_grace_out_of_range", "[cluster]\ndrain_grace_ms = -1\n" + k_valid,
                 "topology.toml:2: cluster: key 'drain_grace_ms'"},
        bad_file{"rejoin_interval_out_of_range",
                 k_valid.substr(0, k_valid.find("[load_balancer]")) + "[load_balancer]\nrejoin_interval_ms = 600001\n" +
                     k_valid.substr(k_valid.find("[load_balancer]") + 16),
                 "key 'rejoin_interval_ms'"},
        bad_file{"unknown_node_key_lists_kv_port",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 1\nkvport = 2\n",
                 "topology.toml:5: node 'node0': unknown key 'kvport' (expected one of: name, "
                 "host, port, kv_port, certificate, key, host_tier_blocks, host_tier_fetch_timeout_ms, "
                 "disk_tier_dir, disk_tier_mib)"},
        bad_file{"disk_tier_dir_without_mib",
                 k_node0 + "host_tier_blocks = 8\ndisk_tier_dir = \"kv\"\n" + k_balancer + k_engine0,
                 "topology.toml:6: node 'node0': disk_tier_dir and disk_tier_mib go together: set both or neither"},
        bad_file{"disk_tier_mib_without_dir", k_node0 + "host_tier_blocks = 8\ndisk_tier_mib = 4\n" + k_balancer + k_engine0,
                 "topology.toml:6: node 'node0': disk_tier_dir and disk_tier_mib go together: set both or neither"},
        bad_file{"disk_tier_without_host_tier",
                 k_node0 + "disk_tier_dir = \"kv\"\ndisk_tier_mib = 4\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': a disk tier holds what the host tier evicts: set host_tier_blocks too"},
        bad_file{"disk_tier_mib_zero",
                 k_node0 + "host_tier_blocks = 8\ndisk_tier_dir = \"kv\"\ndisk_tier_mib = 0\n" + k_balancer + k_engine0,
                 "topology.toml:7: node 'node0': key 'disk_tier_mib' must be in 1..2147483647, got 0"},
        // The host tier.
        bad_file{"host_tier_blocks_negative", k_node0 + "host_tier_blocks = -1\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'host_tier_blocks' must be in 0..2147483647, got -1"},
        bad_file{"host_tier_blocks_too_big", k_node0 + "host_tier_blocks = 2147483648\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'host_tier_blocks' must be in 0..2147483647, got 2147483648"},
        bad_file{"host_tier_blocks_not_an_integer", k_node0 + "host_tier_blocks = \"1GiB\"\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'host_tier_blocks' must be an integer, got a string"},
        bad_file{"host_tier_fetch_timeout_negative",
                 k_node0 + "host_tier_fetch_timeout_ms = -1\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'host_tier_fetch_timeout_ms' must be in 0..60000, got -1"},
        bad_file{"host_tier_fetch_timeout_too_long",
                 k_node0 + "host_tier_fetch_timeout_ms = 60001\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'host_tier_fetch_timeout_ms' must be in 0..60000, got 60001"},
        bad_file{"host_tier_shared_by_engines_of_two_block_sizes",
                 k_node0 + "host_tier_blocks = 64\n" + k_balancer + k_engine0 + engine_text("engine1", "mixed") +
                     "block_size = 32\n",
                 "topology.toml:13: engine 'engine1': node 'node0' has a host tier (host_tier_blocks), which its "
                 "engines share: each must run the model and block_size of engine 'engine0' ("},
        bad_file{"unknown_balancer_key_lists_new_keys",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tier = [1]\n",
                 "topology.toml:7: load_balancer: unknown key 'prefill_tier' (expected one of: "
                 "node, nodes, max_waiting, prefill_tiers, router, prefix_weight, rate_limit_per_s, rate_limit_burst, "
                 "chat_template, report_interval_ms, connect_timeout_ms, "
                 "heartbeat_interval_ms, heartbeat_timeout_ms, rejoin_interval_ms)"},
        bad_file{"bad_chat_template", k_node0 + "[load_balancer]\nnode = \"node0\"\nchat_template = \"jinja\"\n",
                 "topology.toml:7: load_balancer: key 'chat_template' must be one of auto, bare, plain, chatml, llama2, "
                 "llama3; got 'jinja'"},
        bad_file{"unknown_top_level_key", k_valid + "[nodes]\n",
                 "topology.toml:12: unknown key 'nodes' (expected one of: cluster, tls, limits, http, node, "
                 "load_balancer, engine, expert_shard, gateway)"},
        // [[expert_shard]] (k_valid is lines 1-11, so a shard appended starts at line 12).
        bad_file{"expert_shard_unknown_key", k_valid + shard_text("node0", "[0]") + "replicas = 2\n",
                 "topology.toml:16: expert_shard #1: unknown key 'replicas' (expected one of: engine, node, experts)"},
        bad_file{"expert_shard_unknown_engine",
                 k_valid + "[[expert_shard]]\nengine = \"engine9\"\nnode = \"node0\"\nexperts = [0]\n",
                 "topology.toml:13: expert_shard #1: key 'engine' names unknown engine 'engine9'"},
        bad_file{"expert_shard_unknown_node", k_valid + shard_text("node9", "[0]"),
                 "topology.toml:14: expert_shard #1: key 'node' names unknown node 'node9'"},
        bad_file{"expert_shard_missing_experts",
                 k_valid + "[[expert_shard]]\nengine = \"engine0\"\nnode = \"node0\"\n",
                 "topology.toml:12: expert_shard #1: missing required key 'experts'"},
        bad_file{"expert_shard_no_experts", k_valid + shard_text("node0", "[]"),
                 "topology.toml:15: expert_shard #1: key 'experts' must name at least one expert"},
        bad_file{"expert_shard_experts_not_increasing", k_valid + shard_text("node0", "[2, 1]"),
                 "topology.toml:15: expert_shard #1: key 'experts' element 2 must be greater than the one before "
                 "(strictly increasing), got 1 after 2"},
        bad_file{"expert_shard_expert_out_of_range", k_valid + shard_text("node0", "[1024]"),
                 "topology.toml:15: expert_shard #1: key 'experts' element 1 must be in 0..1023, got 1024"},
        bad_file{"expert_shard_experts_not_an_array", k_valid + shard_text("node0", "3"),
                 "topology.toml:15: expert_shard #1: key 'experts' must be an array of integers, got an integer"},
        bad_file{"expert_shard_on_the_balancers_node",
                 k_node0 + k_node1 + "[load_balancer]\nnode = \"node1\"\n" + k_engine0 + shard_text("node1", "[0]"),
                 "topology.toml:18: expert_shard #1: node 'node1' is not engine 'engine0''s node ('node0') and runs "
                 "the load balancer: shards of another node's engine need a shard host, a node with neither"},
        bad_file{"expert_shard_on_another_engines_node",
                 k_node0 + k_node1 + k_balancer + k_engine0 +
                     "[[engine]]\nname = \"engine1\"\nnode = \"node1\"\nmodel = \"../models/stories260K.bin\"\n"
                     "tokenizer = \"../models/tok512.bin\"\n" + shard_text("node1", "[0]"),
                 "topology.toml:23: expert_shard #1: node 'node1' is not engine 'engine0''s node ('node0') and runs "
                 "engine 'engine1': shards of another node's engine need a shard host, a node with neither"},
        bad_file{"expert_window_without_shards", k_valid + "expert_window_steps = 8\n",
                 "topology.toml:12: engine 'engine0': key 'expert_window_steps' moves experts between expert shards: "
                 "the engine has no [[expert_shard]] entries"},
        bad_file{"expert_moe_lb_max_below_one", k_valid + "expert_moe_lb_max = 0.9\n",
                 "topology.toml:12: engine 'engine0': key 'expert_moe_lb_max' must be in 1..1000, got 0.9"},
        bad_file{"expert_move_steps_zero", k_valid + "expert_move_steps_max = 0\n",
                 "topology.toml:12: engine 'engine0': key 'expert_move_steps_max' must be in 1..1000000, got 0"},
        bad_file{"expert_capacity_too_big", k_valid + "expert_capacity = 1025\n",
                 "topology.toml:12: engine 'engine0': key 'expert_capacity' must be in 0..1024, got 1025"},
        bad_file{"expert_timeout_zero", k_valid + "expert_timeout_ms = 0\n",
                 "topology.toml:12: engine 'engine0': key 'expert_timeout_ms' must be in 1..600000, got 0"},
        bad_file{"unknown_http_key", "[http]\nport = 8000\naddress = \"x\"\n" + k_valid,
                 "topology.toml:3: http: unknown key 'address' (expected one of: port, host, drain_timeout_ms, "
                 "served_model_names, api_keys_file, ssl_certfile, ssl_keyfile, allowed_origins)"},
        bad_file{"http_port_missing", "[http]\nhost = \"127.0.0.1\"\n" + k_valid,
                 "topology.toml:1: http: missing required key 'port'"},
        bad_file{"http_port_negative", "[http]\nport = -1\n" + k_valid,
                 "topology.toml:2: http: key 'port' must be in 0..65535, got -1"},
        bad_file{"http_port_65536", "[http]\nport = 65536\n" + k_valid,
                 "topology.toml:2: http: key 'port' must be in 0..65535, got 65536"},
        bad_file{"http_port_a_string", "[http]\nport = \"8000\"\n" + k_valid,
                 "topology.toml:2: http: key 'port' must be an integer, got a string"},
        bad_file{"http_host_empty", "[http]\nport = 8000\nhost = \"\"\n" + k_valid,
                 "topology.toml:3: http: key 'host' must not be empty"},
        bad_file{"http_host_an_integer", "[http]\nport = 8000\nhost = 127\n" + k_valid,
                 "topology.toml:3: http: key 'host' must be a string, got an integer"},
        bad_file{"http_host_a_url", "[http]\nport = 8000\nhost = \"http://127.0.0.1\"\n" + k_valid,
                 "topology.toml:3: http: key 'host' must be a host name or an IP address, got 'http://127.0.0.1'"},
        bad_file{"http_drain_timeout_0", "[http]\nport = 8000\ndrain_timeout_ms = 0\n" + k_valid,
                 "topology.toml:3: http: key 'drain_timeout_ms' must be in 1..600000, got 0"},
        bad_file{"http_port_is_the_balancer_nodes_port", "[http]\nport = 7100\n" + k_valid,
                 "topology.toml:2: http: address 127.0.0.1:7100 is already used by node 'node0' (its port), which "
                 "runs a load balancer and so the HTTP gateway"},
        bad_file{"http_port_is_the_balancer_nodes_kv_port", "[http]\nport = 8100\n" + k_valid,
                 "topology.toml:2: http: address 127.0.0.1:8100 is already used by node 'node0' (its kv_port), which "
                 "runs a load balancer and so the HTTP gateway"},
        bad_file{"unknown_limits_key", "[limits]\nmax_message = 3\n" + k_valid,
                 "topology.toml:2: limits: unknown key 'max_message' (expected one of: max_message_mib, "
                 "max_pending_per_client, idle_timeout_ms, tls_handshake_timeout_ms, max_connections, "
                 "max_connections_per_host)"},
        bad_file{"max_connections_0", "[limits]\nmax_connections = 0\n" + k_valid,
                 "topology.toml:2: limits: key 'max_connections' must be in 1..2147483647, got 0"},
        bad_file{"max_connections_per_host_0", "[limits]\nmax_connections_per_host = 0\n" + k_valid,
                 "topology.toml:2: limits: key 'max_connections_per_host' must be in 1..2147483647, got 0"},
        bad_file{"max_message_mib_0", "[limits]\nmax_message_mib = 0\n" + k_valid,
                 "topology.toml:2: limits: key 'max_message_mib' must be in 1..4095, got 0"},
        bad_file{"max_message_mib_4096", "[limits]\nmax_message_mib = 4096\n" + k_valid,
                 "topology.toml:2: limits: key 'max_message_mib' must be in 1..4095, got 4096"},
        bad_file{"max_pending_per_client_0", "[limits]\nmax_pending_per_client = 0\n" + k_valid,
                 "topology.toml:2: limits: key 'max_pending_per_client' must be in 1..2147483647, got 0"},
        bad_file{"idle_timeout_ms_500", "[limits]\nidle_timeout_ms = 500\n" + k_valid,
                 "topology.toml:2: limits: key 'idle_timeout_ms' must be 0 (never) or at least 1000, got 500"},
        bad_file{"idle_timeout_ms_negative", "[limits]\nidle_timeout_ms = -1\n" + k_valid,
                 "topology.toml:2: limits: key 'idle_timeout_ms' must be in 0..3600000, got -1"},
        bad_file{"tls_handshake_timeout_ms_99", "[limits]\ntls_handshake_timeout_ms = 99\n" + k_valid,
                 "topology.toml:2: limits: key 'tls_handshake_timeout_ms' must be in 100..600000, got 99"},
        bad_file{"limits_not_a_table", "limits = 3\n" + k_valid,
                 "topology.toml:1: key 'limits' must be a table ([limits]), got an integer"},
        // Missing required keys: reported at the table's header line.
        bad_file{"missing_port", k_balancer + "[[node]]\nname = \"node0\"\nhost = \"h\"\n",
                 "topology.toml:3: node 'node0': missing required key 'port'"},
        bad_file{"missing_node_name", "[[node]]\nhost = \"h\"\nport = 1\n",
                 "topology.toml:1: node #1: missing required key 'name'"},
        bad_file{"missing_model",
                 k_node0 + k_balancer +
                     "[[engine]]\nname = \"e\"\nnode = \"node0\"\n"
                     "tokenizer = \"../models/tok512.bin\"\n",
                 "topology.toml:7: engine 'e': missing required key 'model'"},
        bad_file{"missing_engine_node", k_node0 + k_balancer + "[[engine]]\nname = \"e\"\n",
                 "topology.toml:7: engine 'e': missing required key 'node'"},
        bad_file{"missing_balancer_node", k_node0 + "[load_balancer]\nmax_waiting = 3\n",
                 "topology.toml:5: load_balancer: missing required key 'node'"},
        // Wrong types.
        bad_file{"port_is_string", "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = \"x\"\n",
                 "topology.toml:4: node 'node0': key 'port' must be an integer, got a string"},
        bad_file{"name_is_integer", "[[node]]\nname = 5\n",
                 "topology.toml:2: node #1: key 'name' must be a string, got an integer"},
        bad_file{"kv_blocks_is_float", k_valid + "kv_blocks = 1.5\n",
                 "topology.toml:12: engine 'engine0': key 'kv_blocks' must be an integer, "
                 "got a float"},
        bad_file{"empty_host", "[[node]]\nname = \"node0\"\nhost = \"\"\nport = 1\n",
                 "topology.toml:3: node 'node0': key 'host' must not be empty"},
        bad_file{"node_is_a_table", "[node]\nname = \"node0\"\n",
                 "topology.toml:1: key 'node' must be an array of tables ([[node]]), "
                 "got a table"},
        bad_file{"engine_is_array_of_values", "engine = [1, 2]\n" + k_node0 + k_balancer,
                 "topology.toml:1: key 'engine' must be an array of tables ([[engine]]), "
                 "got an array of values"},
        bad_file{"balancer_is_a_value", "load_balancer = 5\n" + k_node0 + k_engine0,
                 "topology.toml:1: key 'load_balancer' must be a table ([load_balancer]), "
                 "got an integer"},
        // Out of range.
        bad_file{"port_zero", "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 0\n",
                 "topology.toml:4: node 'node0': key 'port' must be in 1..65535, got 0"},
        bad_file{"port_too_big", "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 65536\n",
                 "topology.toml:4: node 'node0': key 'port' must be in 1..65535, got 65536"},
        bad_file{"kv_blocks_zero", k_valid + "kv_blocks = 0\n",
                 "topology.toml:12: engine 'engine0': key 'kv_blocks' must be in 1..2147483647, "
                 "got 0"},
        bad_file{"kv_blocks_beyond_int32", k_valid + "kv_blocks = 4294967296\n",
                 "key 'kv_blocks' must be in 1..2147483647, got 4294967296"},
        bad_file{"block_size_zero", k_valid + "block_size = 0\n",
                 "topology.toml:12: engine 'engine0': key 'block_size' must be in 1..1024, got 0"},
        bad_file{"block_size_too_big", k_valid + "block_size = 1025\n",
                 "topology.toml:12: engine 'engine0': key 'block_size' must be in 1..1024, "
                 "got 1025"},
        bad_file{"max_num_batched_tokens_zero", k_valid + "max_num_batched_tokens = 0\n",
                 "topology.toml:12: engine 'engine0': key 'max_num_batched_tokens' must be in "
                 "1..2147483647, got 0"},
        bad_file{"max_num_seqs_negative", k_valid + "max_num_seqs = -1\n",
                 "topology.toml:12: engine 'engine0': key 'max_num_seqs' must be in "
                 "1..2147483647, got -1"},
        bad_file{"time_budget_negative", k_valid + "step_time_budget_ms = -1\n",
                 "topology.toml:12: engine 'engine0': key 'step_time_budget_ms' must be in 0..1000000, got -1"},
        bad_file{"time_budget_not_a_number", k_valid + "step_time_budget_ms = \"fast\"\n",
                 "topology.toml:12: engine 'engine0': key 'step_time_budget_ms' must be a number, got a string"},
        bad_file{"correction_window_too_big", k_valid + "step_time_correction_window = 5000\n",
                 "topology.toml:12: engine 'engine0': key 'step_time_correction_window' must be in 0..4096, got 5000"},
        bad_file{"kv_watermark_too_big", k_valid + "kv_watermark = 0.6\n",
                 "topology.toml:12: engine 'engine0': key 'kv_watermark' must be in 0..0.5, got 0.6"},
        bad_file{"prefix_cache_slack_negative", k_valid + "prefix_cache_slack_tokens = -1\n",
                 "topology.toml:12: engine 'engine0': key 'prefix_cache_slack_tokens' must be in 0..1048576, got -1"},
        bad_file{"prefix_cache_slack_too_big", k_valid + "prefix_cache_slack_tokens = 1048577\n",
                 "topology.toml:12: engine 'engine0': key 'prefix_cache_slack_tokens' must be in 0..1048576, got 1048577"},
        bad_file{"prefix_cache_slack_not_an_integer", k_valid + "prefix_cache_slack_tokens = 1.5\n",
                 "topology.toml:12: engine 'engine0': key 'prefix_cache_slack_tokens' must be an integer, got a float"},
        bad_file{"unknown_scheduler", k_valid + "scheduler = \"lifo\"\n",
                 "topology.toml:12: engine 'engine0': key 'scheduler': unknown scheduler 'lifo'; known: priority, fcfs, sjf"},
        bad_file{"sjf_aging_tokens_zero", k_valid + "scheduler = \"sjf\"\nsjf_aging_tokens = 0\n",
                 "engine 'engine0': key 'sjf_aging_tokens' must be in 1..1048576, got 0"},
        bad_file{"scheduler_is_integer", k_valid + "scheduler = 3\n", "engine 'engine0': key 'scheduler'"},
        bad_file{"time_budget_without_calibration", k_valid + "step_time_budget_ms = 2\n",
                 "topology.toml:12: engine 'engine0': key 'step_time_budget_ms' needs key 'calibration'"},
        bad_file{"time_budget_calibration_missing", k_valid + "step_time_budget_ms = 2\ncalibration = \"none.toml\"\n",
                 "topology.toml:13: engine 'engine0': key 'calibration': file not found: "},
        bad_file{"time_budget_calibration_malformed",
                 k_valid + "step_time_budget_ms = 2\ncalibration = \"single-node.toml\"\n",
                 "topology.toml:13: engine 'engine0': key 'calibration': "},
        bad_file{"executor_threads_zero", k_valid + "executor_threads = 0\n",
                 "topology.toml:12: engine 'engine0': key 'executor_threads' must be in 1..64, "
                 "got 0"},
        bad_file{"executor_threads_65", k_valid + "executor_threads = 65\n",
                 "topology.toml:12: engine 'engine0': key 'executor_threads' must be in 1..64, "
                 "got 65"},
        bad_file{"kv_port_zero",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 1\nkv_port = 0\n",
                 "topology.toml:5: node 'node0': key 'kv_port' must be in 1..65535, got 0"},
        bad_file{"kv_port_too_big",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 1\nkv_port = 65536\n",
                 "topology.toml:5: node 'node0': key 'kv_port' must be in 1..65535, got 65536"},
        bad_file{"kv_port_is_string",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 1\nkv_port = \"2\"\n",
                 "topology.toml:5: node 'node0': key 'kv_port' must be an integer, got a string"},
        bad_file{"default_kv_port_overflows",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 65000\n" + k_balancer,
                 "topology.toml:4: node 'node0': port 65000 leaves no default 'kv_port' "
                 "(port + 1000 = 66000 > 65535): set kv_port"},
        bad_file{"default_kv_port_overflows_by_one",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 64536\n" + k_balancer,
                 "topology.toml:4: node 'node0': port 64536 leaves no default 'kv_port' "
                 "(port + 1000 = 65536 > 65535): set kv_port"},
        bad_file{"report_interval_ms_zero",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nreport_interval_ms = 0\n",
                 "topology.toml:7: load_balancer: key 'report_interval_ms' must be in 1..60000, "
                 "got 0"},
        bad_file{"report_interval_ms_60001",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nreport_interval_ms = 60001\n",
                 "topology.toml:7: load_balancer: key 'report_interval_ms' must be in 1..60000, "
                 "got 60001"},
        bad_file{"heartbeat_interval_ms_zero",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nheartbeat_interval_ms = 0\n",
                 "topology.toml:7: load_balancer: key 'heartbeat_interval_ms' must be in 1..60000, got 0"},
        bad_file{"heartbeat_timeout_ms_600001",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nheartbeat_timeout_ms = 600001\n",
                 "topology.toml:7: load_balancer: key 'heartbeat_timeout_ms' must be in 1..600000, got 600001"},
        bad_file{"heartbeat_timeout_not_above_interval",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nheartbeat_interval_ms = 2000\n"
                           "heartbeat_timeout_ms = 2000\n",
                 "topology.toml:8: load_balancer: key 'heartbeat_timeout_ms' must exceed heartbeat_interval_ms "
                 "(2000), got 2000"},
        bad_file{"connect_timeout_ms_zero",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = 0\n",
                 "topology.toml:7: load_balancer: key 'connect_timeout_ms' must be in 1..600000, "
                 "got 0"},
        bad_file{"connect_timeout_ms_600001",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = 600001\n",
                 "topology.toml:7: load_balancer: key 'connect_timeout_ms' must be in 1..600000, "
                 "got 600001"},
        bad_file{"connect_timeout_ms_is_float",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = 1.5\n",
                 "topology.toml:7: load_balancer: key 'connect_timeout_ms' must be an integer, "
                 "got a float"},
        bad_file{"router_unknown", k_node0 + "[load_balancer]\nnode = \"node0\"\nrouter = \"fastest\"\n",
                 "topology.toml:7: load_balancer: key 'router': unknown router 'fastest'; known: "
                 "auto, least_loaded, round_robin, power_of_two, prefix_affinity"},
        bad_file{"prefix_weight_negative", k_node0 + "[load_balancer]\nnode = \"node0\"\nprefix_weight = -0.5\n",
                 "topology.toml:7: load_balancer: key 'prefix_weight' must be in 0..1000000, got -0.5"},
        bad_file{"prefix_weight_string", k_node0 + "[load_balancer]\nnode = \"node0\"\nprefix_weight = \"high\"\n",
                 "topology.toml:7: load_balancer: key 'prefix_weight' must be a number, got a string"},
        bad_file{"rate_limit_negative", k_node0 + "[load_balancer]\nnode = \"node0\"\nrate_limit_per_s = -1\n",
                 "topology.toml:7: load_balancer: key 'rate_limit_per_s' must be in 0..1000000000, got -1"},
        bad_file{"rate_limit_burst_zero", k_node0 + "[load_balancer]\nnode = \"node0\"\nrate_limit_burst = 0\n",
                 "topology.toml:7: load_balancer: key 'rate_limit_burst' must be in 1..1000000, got 0"},
        bad_file{"router_not_a_string", k_node0 + "[load_balancer]\nnode = \"node0\"\nrouter = 2\n",
                 "topology.toml:7: load_balancer: key 'router' must be a string, got an integer"},
        // prefill_tiers: an array of strictly increasing integers >= 1, at most 16.
        bad_file{"prefill_tiers_not_an_array",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = 128\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' must be an array of "
                 "integers, got an integer"},
        bad_file{"prefill_tiers_is_a_table",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = { a = 1 }\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' must be an array of "
                 "integers, got a table"},
        bad_file{"prefill_tiers_string_element",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [128, \"512\"]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' element 2 must be an "
                 "integer, got a string"},
        bad_file{"prefill_tiers_float_element",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [1.5]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' element 1 must be an "
                 "integer, got a float"},
        bad_file{"prefill_tiers_zero",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [0, 512]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' element 1 must be in "
                 "1..2147483647, got 0"},
        bad_file{"prefill_tiers_negative",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [128, -1]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' element 2 must be in "
                 "1..2147483647, got -1"},
        bad_file{"prefill_tiers_beyond_int32",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [4294967296]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' element 1 must be in "
                 "1..2147483647, got 4294967296"},
        bad_file{"prefill_tiers_equal",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [128, 128]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' element 2 must be greater "
                 "than the one before (strictly increasing), got 128 after 128"},
        bad_file{"prefill_tiers_decreasing_on_its_own_line",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [\n  512,\n"
                           "  2048,\n  128,\n]\n",
                 "topology.toml:10: load_balancer: key 'prefill_tiers' element 3 must be greater "
                 "than the one before (strictly increasing), got 128 after 2048"},
        bad_file{"prefill_tiers_seventeen_bounds",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nprefill_tiers = [1, 2, 3, 4, 5, "
                           "6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]\n",
                 "topology.toml:7: load_balancer: key 'prefill_tiers' has 17 elements, at most 16 "
                 "allowed"},
        bad_file{"max_waiting_zero",
                 k_node0 + "[load_balancer]\nnode = \"node0\"\nmax_waiting = 0\n",
                 "topology.toml:7: load_balancer: key 'max_waiting' must be in 1..2147483647, "
                 "got 0"},
        // Duplicates.
        bad_file{"duplicate_node_name",
                 k_node0 + "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 2\n",
                 "topology.toml:6: node 'node0': duplicate node name (first defined at line 1)"},
        bad_file{"duplicate_address",
                 k_node0 + "[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = 7100\n",
                 "topology.toml:8: node 'node1': address 127.0.0.1:7100 is already used by "
                 "node 'node0'"},
        bad_file{"duplicate_address_names_the_first_use",
                 k_node0 + "[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = 7100\n",
                 "topology.toml:8: node 'node1': address 127.0.0.1:7100 is already used by "
                 "node 'node0' (its port, line 4)"},
        bad_file{"kv_port_is_another_nodes_port",
                 k_node0 +
                     "[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = 7101\n"
                     "kv_port = 7100\n",
                 "topology.toml:9: node 'node1': address 127.0.0.1:7100 (kv_port) is already "
                 "used by node 'node0' (its port, line 4)"},
        bad_file{"port_is_another_nodes_default_kv_port",
                 k_node0 + "[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = 8100\n",
                 "topology.toml:8: node 'node1': address 127.0.0.1:8100 is already used by "
                 "node 'node0' (its default kv_port = port + 1000, line 4)"},
        bad_file{"port_is_another_nodes_kv_port",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 7100\nkv_port = 7101\n"
                 "[[node]]\nname = \"node1\"\nhost = \"h\"\nport = 7101\n",
                 "topology.toml:9: node 'node1': address h:7101 is already used by node 'node0' "
                 "(its kv_port, line 5)"},
        bad_file{"kv_port_is_another_nodes_kv_port",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 7100\nkv_port = 9000\n"
                 "[[node]]\nname = \"node1\"\nhost = \"h\"\nport = 7101\nkv_port = 9000\n",
                 "topology.toml:10: node 'node1': address h:9000 (kv_port) is already used by "
                 "node 'node0' (its kv_port, line 5)"},
        bad_file{"default_kv_port_is_another_nodes_kv_port",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 7100\nkv_port = 8101\n"
                 "[[node]]\nname = \"node1\"\nhost = \"h\"\nport = 7101\n",
                 "topology.toml:9: node 'node1': address h:8101 (default kv_port = port + 1000) "
                 "is already used by node 'node0' (its kv_port, line 5)"},
        bad_file{"kv_port_is_own_port",
                 "[[node]]\nname = \"node0\"\nhost = \"h\"\nport = 7100\nkv_port = 7100\n",
                 "topology.toml:5: node 'node0': address h:7100 (kv_port) is already used by "
                 "node 'node0' (its port, line 4)"},
        bad_file{"duplicate_engine_name", k_valid + engine_text("engine0", "mixed"),
                 "topology.toml:13: engine 'engine0': duplicate engine name (first defined at "
                 "line 7)"},
        // References to nodes.
        bad_file{"engine_on_unknown_node",
                 k_node0 + k_balancer + "[[engine]]\nname = \"e\"\nnode = \"node9\"\n",
                 "topology.toml:9: engine 'e': key 'node' names unknown node 'node9'"},
        bad_file{"balancer_node_and_nodes", three_nodes_balanced("node = \"node1\"\nnodes = [\"node2\"]") + k_engine0,
                 "topology.toml:15: load_balancer: give key 'node' or key 'nodes', not both"},
        bad_file{"balancer_nodes_unknown", three_nodes_balanced("nodes = [\"node1\", \"node9\"]") + k_engine0,
                 "topology.toml:14: load_balancer: key 'nodes' names unknown node 'node9'"},
        bad_file{"balancer_nodes_empty", three_nodes_balanced("nodes = []") + k_engine0,
                 "topology.toml:14: load_balancer: key 'nodes' must be an array of 1 to 4 strings"},
        bad_file{"balancer_nodes_five", three_nodes_balanced("nodes = [\"a\", \"b\", \"c\", \"d\", \"e\"]") + k_engine0,
                 "topology.toml:14: load_balancer: key 'nodes' must be an array of 1 to 4 strings"},
        bad_file{"balancer_nodes_repeat", three_nodes_balanced("nodes = [\"node1\", \"node1\"]") + k_engine0,
                 "topology.toml:14: load_balancer: key 'nodes' element 2 repeats 'node1'"},
        bad_file{"balancer_nodes_not_strings", three_nodes_balanced("nodes = [1, 2]") + k_engine0,
                 "topology.toml:14: load_balancer: key 'nodes' element 1 must be a string of 1 to 256 bytes"},
        bad_file{"two_balancer_nodes_one_with_an_engine", three_nodes_balanced("nodes = [\"node1\", \"node0\"]") + k_engine0,
                 "topology.toml:14: load_balancer: node 'node0' runs a balancer and engine 'engine0': with several "
                 "balancer nodes, engines run on other nodes"},
        bad_file{"two_balancer_nodes_one_with_a_host_tier",
                 k_node0 + k_node1 + "host_tier_blocks = 8\n" + k_node2 + "[load_balancer]\nnodes = [\"node1\", \"node2\"]\n" +
                     k_engine0,
                 "topology.toml:15: load_balancer: node 'node1' runs a balancer and a host tier: with several "
                 "balancer nodes, tiers run on the engines' nodes"},
        bad_file{"balancer_on_unknown_node",
                 k_node0 + "[load_balancer]\nnode = \"nodeX\"\n" + k_engine0,
                 "topology.toml:6: load_balancer: key 'node' names unknown node 'nodeX'"},
        // Model and tokenizer files.
        bad_file{"model_not_found",
                 k_node0 + k_balancer +
                     "[[engine]]\nname = \"e\"\nnode = \"node0\"\n"
                     "model = \"../models/missing.bin\"\n",
                 "topology.toml:10: engine 'e': key 'model': file not found: " + examples_models +
                     "/missing.bin (from '../models/missing.bin')"},
        bad_file{"tokenizer_not_found",
                 k_node0 + k_balancer +
                     "[[engine]]\nname = \"e\"\nnode = \"node0\"\n"
                     "model = \"../models/stories260K.bin\"\n"
                     "tokenizer = \"tok.bin\"\n",
                 "topology.toml:11: engine 'e': key 'tokenizer': file not found: " + examples_dir +
                     "/tok.bin (from 'tok.bin')"},
        bad_file{"model_is_a_directory",
                 k_node0 + k_balancer +
                     "[[engine]]\nname = \"e\"\nnode = \"node0\"\n"
                     "model = \"../models\"\n",
                 "topology.toml:10: engine 'e': key 'model': not a regular file: " +
                     examples_models + " (from '../models')"},
        // kv_transfer.
        bad_file{"unknown_kv_transfer", "[cluster]\nkv_transfer = \"tcp\"\n" + k_valid,
                 "topology.toml:2: cluster: key 'kv_transfer' must be one of caf, ucx; got 'tcp'"},
        bad_file{"kv_transfer_is_integer", "[cluster]\nname = \"c\"\nkv_transfer = 1\n" + k_valid,
                 "topology.toml:3: cluster: key 'kv_transfer' must be a string, got an integer"},
        bad_file{"kv_transfer_is_case_sensitive", "[cluster]\nkv_transfer = \"UCX\"\n" + k_valid,
                 "topology.toml:2: cluster: key 'kv_transfer' must be one of caf, ucx; got 'UCX'"},
        // Roles.
        bad_file{"unknown_role", k_valid + "role = \"both\"\n",
                 "topology.toml:12: engine 'engine0': key 'role' must be one of mixed, prefill, "
                 "decode; got 'both'"},
        bad_file{"only_decode_engines",
                 k_node0 + k_balancer + engine_text("d1", "decode") + engine_text("d2", "decode"),
                 "topology.toml:7: every engine has role 'decode': no engine can prefill"},
        bad_file{"only_prefill_engines", k_node0 + k_balancer + engine_text("p1", "prefill"),
                 "topology.toml:7: every engine has role 'prefill': no engine can decode"},
        // [tls] and the nodes' certificates and keys.
        bad_file{"tls_not_a_table", "tls = 1\n" + k_valid,
                 "topology.toml:1: key 'tls' must be a table ([tls]), got an integer"},
        bad_file{"tls_without_ca", "[tls]\n" + k_valid, "topology.toml:1: tls: missing required key 'ca'"},
        bad_file{"tls_unknown_key", k_tls + "cert = \"x\"\n" + k_valid,
                 "topology.toml:3: tls: unknown key 'cert' (expected one of: ca)"},
        bad_file{"tls_ca_not_found", "[tls]\nca = \"certs/ca.pem\"\n" + k_valid,
                 "topology.toml:2: tls: key 'ca': file not found: " +
                     (fs::path(examples_dir) / "certs/ca.pem").lexically_normal().string() + " (from 'certs/ca.pem')"},
        bad_file{"tls_node_without_certificate", k_tls + k_valid,
                 "topology.toml:3: node 'node0': missing required key 'certificate'"},
        bad_file{"tls_node_without_key", k_tls + k_node0 + "certificate = \"../models/NOTICE.md\"\n",
                 "topology.toml:3: node 'node0': missing required key 'key'"},
        bad_file{"tls_node_key_not_found",
                 k_tls + k_node0 + "certificate = \"../models/NOTICE.md\"\nkey = \"node0-key.pem\"\n",
                 "topology.toml:8: node 'node0': key 'key': file not found: "},
        bad_file{"certificate_without_tls", k_node0 + "certificate = \"../models/NOTICE.md\"\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'certificate' needs a [tls] table naming the cluster's 'ca'"},
        bad_file{"key_without_tls", k_node0 + "key = \"../models/NOTICE.md\"\n" + k_balancer + k_engine0,
                 "topology.toml:5: node 'node0': key 'key' needs a [tls] table naming the cluster's 'ca'"},
        // Missing tables.
        bad_file{"no_nodes", k_balancer + k_engine0,
                 "topology.toml: no [[node]] tables: a topology needs a node"},
        bad_file{"empty_file", "", "topology.toml: no [[node]] tables"},
        bad_file{"empty_node_array", "node = []\n" + k_balancer,
                 "topology.toml: no [[node]] tables"},
        bad_file{"no_engines", k_node0 + k_balancer,
                 "topology.toml: no [[engine]] tables: a topology needs an engine"},
        bad_file{"no_load_balancer", k_node0 + k_engine0,
                 "topology.toml: missing [load_balancer] table"}),
    [](const ::testing::TestParamInfo<bad_file>& info) { return std::string(info.param.name); });

// ---- Files on disk: load_topology reads, resolves against the file's directory, reports IO.

class TopologyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "troupe_topology_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
  }

  fs::path dir_;
};

TEST_F(TopologyFile, RelativePathsResolveAgainstTheFilesDirectory) {
  write(dir_ / "weights" / "m.bin", "");
  write(dir_ / "weights" / "t.bin", "");
  write(dir_ / "conf" / "topo.toml",
        k_node0 + k_balancer +
            "[[engine]]\nname = \"e\"\nnode = \"node0\"\nmodel = \"../weights/m.bin\"\n"
            "tokenizer = \"../weights/./t.bin\"\n");
  auto topo = load_topology((dir_ / "conf" / "topo.toml").string());
  ASSERT_TRUE(topo) << topo.error().message;
  EXPECT_EQ(topo->engines[0].model_path, (dir_ / "weights" / "m.bin").string());
  EXPECT_EQ(topo->engines[0].tokenizer_path, (dir_ / "weights" / "t.bin").string());
}

TEST_F(TopologyFile, TheLayoutCacheIsADirectoryBesideTheFileOrOff) {
  write(dir_ / "weights" / "m.bin", "");
  write(dir_ / "weights" / "t.bin", "");
  const std::string engine = "[[engine]]\nname = \"e\"\nnode = \"node0\"\nmodel = \"../weights/m.bin\"\n"
                             "tokenizer = \"../weights/t.bin\"\n";
  for (const auto& [value, expected] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"layout_cache = \"../cache\"\n", (dir_ / "cache").string()}, {"layout_cache = \"off\"\n", "off"}}) {
    write(dir_ / "conf" / "topo.toml", k_node0 + k_balancer + engine + value);
    auto topo = load_topology((dir_ / "conf" / "topo.toml").string());
    ASSERT_TRUE(topo) << topo.error().message;
    EXPECT_EQ(topo->engines[0].layout_cache, expected) << value;
  }
  write(dir_ / "conf" / "topo.toml", k_node0 + k_balancer + engine + "layout_cache = 3\n");
  auto topo = load_topology((dir_ / "conf" / "topo.toml").string());
  ASSERT_FALSE(topo);
  EXPECT_EQ(topo.error().code, errc::malformed_file);
  EXPECT_NE(topo.error().message.find("layout_cache"), std::string::npos) << topo.error().message;
}

TEST_F(TopologyFile, ErrorsNameTheFilePath) {
  const std::string path = (dir_ / "bad.toml").string();
  write(path, k_valid + "kv_block = 5\n");
  auto topo = load_topology(path);
  ASSERT_FALSE(topo);
  EXPECT_EQ(topo.error().code, errc::malformed_file);
  EXPECT_EQ(topo.error().message.rfind(path + ":12: engine 'engine0': unknown key 'kv_block'", 0),
            0u)
      << topo.error().message;
}

TEST_F(TopologyFile, MissingFileIsIoError) {
  const std::string path = (dir_ / "absent.toml").string();
  auto topo = load_topology(path);
  ASSERT_FALSE(topo);
  EXPECT_EQ(topo.error().code, errc::io_error);
  EXPECT_EQ(topo.error().message, "cannot read topology file '" + path + "': no such file");
}

TEST_F(TopologyFile, DirectoryIsIoError) {
  auto topo = load_topology(dir_.string());
  ASSERT_FALSE(topo);
  EXPECT_EQ(topo.error().code, errc::io_error);
  EXPECT_EQ(topo.error().message,
            "cannot read topology file '" + dir_.string() + "': not a regular file");
}

TEST_F(TopologyFile, EmptyFileIsMalformedNotIoError) {
  const std::string path = (dir_ / "empty.toml").string();
  write(path, "");
  auto topo = load_topology(path);
  ASSERT_FALSE(topo);
  EXPECT_EQ(topo.error().code, errc::malformed_file);
  EXPECT_EQ(topo.error().message.rfind(path + ": no [[node]] tables", 0), 0u)
      << topo.error().message;
}
