// The engine keys (runtime/engine/engine_keys.hpp) are defined once, and both readers walk them:
// a topology file's [[engine]] and a simulation topology's [engine] / [speculation] accept and
// reject the same values, and each error names the key.
#include "runtime/engine/engine_keys.hpp"

#include <gtest/gtest.h>

#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sim/sim_topology.hpp"
#include "tests/support/sim_fixtures.hpp"
#include "topology/topology.hpp"

using namespace troupe;

namespace {

/// A topology whose node has a host tier and whose engine a calibration, so that every valid
/// engine key value (a time budget, preemption = "swap" or "cost") stands; its engine table ends it.
const std::string k_topology = R"([[node]]
name = "node0"
host = "127.0.0.1"
port = 7100
host_tier_blocks = 64

[load_balancer]
node = "node0"

[[engine]]
name = "engine0"
node = "node0"
model = "../models/stories260K.bin"
tokenizer = "../models/tok512.bin"
calibration = "calibration-cpu.toml"
)";

/// A valid value of each text key (the key table checks text values by their setters).
const std::map<std::string, std::string> k_valid_text = {
    {"scheduler", "fcfs"},      {"drafter", "ngram"},        {"speculation_mode", "budgeted"},
    {"preemption", "swap"},     {"kv_cache_dtype", "f16"}};

/// One value of a key as a file writes it: `text` is quoted in TOML, a number is not.
struct value {
  std::string text;
  bool quoted = false;
};

std::string number_text(double v) {
  std::ostringstream out;
  out << std::setprecision(15) << v;
  return out.str();
}

expected<topology::topology> topology_with(const engine::engine_key& key, const value& v) {
  const std::string written = v.quoted ? "\"" + v.text + "\"" : v.text;
  return topology::parse_topology(k_topology + std::string(key.name) + " = " + written + "\n", "topology.toml",
                                  TROUPE_SOURCE_DIR "/examples");
}

/// The same value set on the simulator's table (`--set SECTION.KEY=VALUE`, typed as the command
/// line types it), over the tiny topology with a host tier.
expected<sim::sim_topology> sim_with(const engine::engine_key& key, const value& v) {
  const std::string text = std::string(troupe::testing::tiny_sim_topology) + "\n[host_tier]\nblocks = 64\n";
  const std::string setting = std::string(key.section) + "." + std::string(key.sim_name);
  return sim::parse_sim_topology(text, "tiny.toml", TROUPE_SOURCE_DIR, {{setting, v.text}});
}

/// Values both readers must accept for `key`, then values both must refuse.
std::pair<std::vector<value>, std::vector<value>> values_of(const engine::engine_key& key) {
  if (key.type == engine::key_type::text) {
    const auto valid = k_valid_text.find(std::string(key.name));
    EXPECT_NE(valid, k_valid_text.end()) << "no valid value listed for " << key.name;
    return {{{valid == k_valid_text.end() ? "" : valid->second, true}}, {{"no-such-value", true}, {"7", false}}};
  }
  std::vector<value> bad = {{number_text(key.min - 1)}, {number_text(key.max * 2 + 1)}, {"fast", true}};
  if (key.type == engine::key_type::integer) bad.push_back({number_text(key.min + 0.5)});
  return {{{number_text(key.min)}, {number_text(key.max)}}, bad};
}

TEST(EngineKeys, BothReadersAcceptAndRejectTheSameValues) {
  int keys_read_by_both = 0;
  for (const engine::engine_key& key : engine::engine_keys()) {
    if (key.sim_name.empty()) continue;  // the simulator does not read it
    ++keys_read_by_both;
    const auto [good, bad] = values_of(key);
    for (const value& v : good) {
      auto topo = topology_with(key, v);
      EXPECT_TRUE(topo) << key.name << " = " << v.text << ": " << topo.error().message;
      auto sim = sim_with(key, v);
      EXPECT_TRUE(sim) << key.name << " = " << v.text << ": " << sim.error().message;
    }
    for (const value& v : bad) {
      auto topo = topology_with(key, v);
      ASSERT_FALSE(topo) << key.name << " = " << v.text << " accepted by the topology reader";
      EXPECT_NE(topo.error().message.find("key '" + std::string(key.name) + "'"), std::string::npos)
          << topo.error().message;
      auto sim = sim_with(key, v);
      ASSERT_FALSE(sim) << key.name << " = " << v.text << " accepted by the simulator's reader";
      const std::string named = "[" + std::string(key.section) + "] " + std::string(key.sim_name);
      EXPECT_NE(sim.error().message.find(named), std::string::npos) << sim.error().message;
    }
  }
  EXPECT_GE(keys_read_by_both, 15);
}

TEST(EngineKeys, ATimeBudgetBelowOneNanosecondIsRefusedByBoth) {
  const engine::engine_key* key = engine::find_engine_key("step_time_budget_ms");
  ASSERT_NE(key, nullptr);
  const value tiny{"0.0000001"};
  auto topo = topology_with(*key, tiny);
  ASSERT_FALSE(topo);
  EXPECT_NE(topo.error().message.find("key 'step_time_budget_ms' must be 0 (off) or at least 0.000001"),
            std::string::npos)
      << topo.error().message;
  auto sim = sim_with(*key, tiny);
  ASSERT_FALSE(sim);
  EXPECT_NE(sim.error().message.find("[engine] step_time_budget_ms must be 0 (off) or at least 0.000001"),
            std::string::npos)
      << sim.error().message;
}

TEST(EngineKeys, NamesAreUniqueAndRangesOrdered) {
  const std::vector<engine::engine_key>& keys = engine::engine_keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(engine::find_engine_key(keys[i].name), &keys[i]);
    if (!keys[i].sim_name.empty()) {
      EXPECT_EQ(engine::find_sim_engine_key(keys[i].section, keys[i].sim_name), &keys[i]);
    }
    if (keys[i].type != engine::key_type::text) {
      EXPECT_LE(keys[i].min, keys[i].max) << keys[i].name;
      EXPECT_NE(keys[i].set_number, nullptr) << keys[i].name;
    } else {
      EXPECT_NE(keys[i].set_text, nullptr) << keys[i].name;
    }
    EXPECT_FALSE(keys[i].doc.empty()) << keys[i].name;
  }
}

}  // namespace
