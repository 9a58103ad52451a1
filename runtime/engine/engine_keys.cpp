#include "runtime/engine/engine_keys.hpp"

#include <algorithm>
#include <limits>

#include "runtime/cost/step_time_correction.hpp"
#include "runtime/sched/policy.hpp"

namespace troupe::engine {
namespace {

constexpr double int32_max = std::numeric_limits<int32_t>::max();

/// The setter of an integer key: writes the (whole, in-range) value into `member` of the config.
#define TROUPE_SET_INT(member) [](engine_config& c, double v) -> expected<void> { \
    c.member = static_cast<decltype(c.member)>(v);                              \
    return {};                                                                   \
  }

expected<void> set_time_budget(engine_config& c, double ms) {
  if (ms != 0 && ms < 1e-6) return fail(errc::invalid_argument, " must be 0 (off) or at least 0.000001");
  c.scheduler.step_time_budget_ms = ms;
  return {};
}

expected<void> set_scheduler(engine_config& c, const std::string& name) {
  sched::policy_options named = c.scheduler.policy;
  named.name = name;
  if (auto made = sched::make_policy(named); !made) return fail(errc::invalid_argument, ": " + made.error().message);
  c.scheduler.policy.name = name;
  return {};
}

expected<void> set_drafter(engine_config& c, const std::string& name) {
  auto kind = spec::parse_drafter(name);
  if (!kind) return fail(errc::invalid_argument, ": " + kind.error().message);
  c.speculation.drafter = *kind;
  return {};
}

expected<void> set_speculation_mode(engine_config& c, const std::string& mode) {
  if (mode != "fixed" && mode != "budgeted")
    return fail(errc::invalid_argument, " must be fixed or budgeted; got '" + echo(mode) + "'");
  c.speculation.budgeted = mode == "budgeted";
  return {};
}

expected<void> set_preemption(engine_config& c, const std::string& name) {
  const std::optional<preemption_mode> mode = preemption_mode_named(name);
  if (!mode) return fail(errc::invalid_argument, " must be recompute, swap or cost; got '" + echo(name) + "'");
  c.preemption = *mode;
  return {};
}

expected<void> set_kv_cache_dtype(engine_config& c, const std::string& name) {
  const std::optional<kv::kv_dtype> dtype = kv::kv_dtype_named(name);
  if (!dtype) return fail(errc::invalid_argument, " must be f32, f16 or q8_0; got '" + echo(name) + "'");
  c.kv_cache_dtype = *dtype;
  return {};
}

expected<void> set_grammar_rules(engine_config& c, double rules) {
  c.grammar.num_rules_max = static_cast<int32_t>(rules);
  c.grammar.num_elements_max = int64_t{10} * c.grammar.num_rules_max;  // ten elements per rule
  return {};
}

expected<void> set_matcher_mib(engine_config& c, double mib) {
  c.grammar.matcher_memory_bytes_max = static_cast<int64_t>(mib) << 20;
  return {};
}

expected<void> set_cache_mib(engine_config& c, double mib) {
  c.grammar.cache_memory_bytes_max = static_cast<int64_t>(mib) << 20;
  return {};
}

expected<void> set_swap_bandwidth(engine_config& c, double gb_s) {
  c.swap_bandwidth_gb_s = gb_s;
  return {};
}

expected<void> set_kv_watermark(engine_config& c, double share) {
  c.scheduler.kv_watermark = share;
  return {};
}

engine_key integer(std::string_view name, std::string_view section, std::string_view sim_name, double min, double max,
                   expected<void> (*set)(engine_config&, double), std::string_view doc) {
  return {name, section, sim_name, key_type::integer, min, max, set, nullptr, doc};
}

engine_key number(std::string_view name, std::string_view sim_name, double min, double max,
                  expected<void> (*set)(engine_config&, double), std::string_view doc) {
  return {name, "engine", sim_name, key_type::number, min, max, set, nullptr, doc};
}

engine_key text(std::string_view name, std::string_view section, std::string_view sim_name,
                expected<void> (*set)(engine_config&, const std::string&), std::string_view doc) {
  return {name, section, sim_name, key_type::text, 0, 0, nullptr, set, doc};
}

std::vector<engine_key> make_engine_keys() {
  return {
      integer("kv_blocks", "engine", "", 1, int32_max, TROUPE_SET_INT(num_kv_blocks), "KV pool size in blocks"),
      integer("block_size", "engine", "block_size", 1, 1024, TROUPE_SET_INT(block_size), "tokens per KV block"),
      text("kv_cache_dtype", "engine", "kv_cache_dtype", &set_kv_cache_dtype,
           "f32, f16 or q8_0: what the KV pool stores (default: f32 for float32 weights, else f16)"),
      integer("max_num_batched_tokens", "engine", "max_num_batched_tokens", 1, int32_max,
              TROUPE_SET_INT(scheduler.max_num_batched_tokens), "token budget of one step"),
      integer("max_num_seqs", "engine", "max_num_seqs", 1, int32_max, TROUPE_SET_INT(scheduler.max_num_seqs),
              "running sequences at most"),
      number("step_time_budget_ms", "step_time_budget_ms", 0, 1e6, &set_time_budget,
             "predicted time of one step at most (0 = off)"),
      integer("step_time_correction_window", "engine", "step_time_correction_window", 0,
              cost::step_time_correction::window_max, TROUPE_SET_INT(scheduler.step_time_correction_window),
              "steps the budget's online correction takes the median of (0 = off)"),
      number("kv_watermark", "kv_watermark", 0, 0.5, &set_kv_watermark, "share of the pool admission keeps free"),
      integer("prefix_cache_slack_tokens", "engine", "prefix_cache_slack_tokens", 0,
              sched::prefix_cache_slack_tokens_max, TROUPE_SET_INT(scheduler.prefix_cache_slack_tokens),
              "trailing prompt tokens always computed"),
      text("scheduler", "engine", "scheduler", &set_scheduler, "the scheduling policy (sched::policy_names())"),
      integer("sjf_aging_tokens", "engine", "sjf_aging_tokens", 1, 1 << 20, TROUPE_SET_INT(scheduler.policy.sjf_aging_tokens),
              "sjf: waited tokens that age a sequence by one prompt token"),
      text("drafter", "speculation", "drafter", &set_drafter, "none, ngram, layer_skip or draft_model"),
      integer("num_speculative_tokens", "speculation", "num_speculative_tokens", 1, spec::num_speculative_tokens_max,
              TROUPE_SET_INT(speculation.num_speculative_tokens), "drafts each decode step verifies"),
      integer("ngram_min", "speculation", "", 1, 64, TROUPE_SET_INT(speculation.ngram_min), "n-gram: shortest suffix"),
      integer("ngram_max", "speculation", "", 1, 64, TROUPE_SET_INT(speculation.ngram_max), "n-gram: longest suffix"),
      integer("draft_layers", "speculation", "draft_layers", 1, 1024, TROUPE_SET_INT(speculation.draft_layers),
              "layer_skip: the target's layers that draft"),
      text("speculation_mode", "speculation", "mode", &set_speculation_mode, "fixed or budgeted"),
      text("preemption", "engine", "preemption", &set_preemption, "recompute, swap or cost"),
      integer("copy_stream_min_bytes", "engine", "copy_stream_min_bytes", -1, int32_max, TROUPE_SET_INT(copy_stream_min_bytes),
              "KV moves of a step from this many bytes run beside its forward pass (0: all, -1: none)"),
      number("swap_bandwidth_gb_s", "swap_bandwidth_gb_s", 1e-6, 1e6, &set_swap_bandwidth,
             "preemption cost: host tier -> pool copy speed"),
      integer("grammar_rules_max", "engine", "", 1, 1000000, &set_grammar_rules, "rules one grammar compile may create"),
      integer("grammar_stacks_per_state_max", "engine", "", 1, 16777216, TROUPE_SET_INT(grammar.num_stacks_per_state_max),
              "stack tops one automaton state may visit"),
      integer("grammar_matcher_mib", "engine", "", 1, 65536, &set_matcher_mib, "one matcher's memory"),
      integer("grammar_cache_mib", "engine", "", 0, 65536, &set_cache_mib, "the compiled grammars' cache"),
  };
}

#undef TROUPE_SET_INT

}  // namespace

const std::vector<engine_key>& engine_keys() {
  static const std::vector<engine_key> keys = make_engine_keys();
  return keys;
}

const engine_key* find_engine_key(std::string_view name) {
  const std::vector<engine_key>& keys = engine_keys();
  auto it = std::find_if(keys.begin(), keys.end(), [&](const engine_key& k) { return k.name == name; });
  return it == keys.end() ? nullptr : &*it;
}

const engine_key* find_sim_engine_key(std::string_view section, std::string_view sim_name) {
  const std::vector<engine_key>& keys = engine_keys();
  auto it = std::find_if(keys.begin(), keys.end(), [&](const engine_key& k) {
    return !k.sim_name.empty() && k.section == section && k.sim_name == sim_name;
  });
  return it == keys.end() ? nullptr : &*it;
}

}  // namespace troupe::engine
