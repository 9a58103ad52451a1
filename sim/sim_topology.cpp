// Simulation topology parsing: each table is described by a list of fields (name, required,
// range, where the value goes), read by one generic loop that reports unknown keys, missing
// keys, wrong types and out-of-range values with the file, line and key. The engine keys of
// [engine] and [speculation] are the key table's (runtime/engine/engine_keys.hpp), which the
// topology files' reader walks too.
#include "sim/sim_topology.hpp"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <tuple>

#include "runtime/balance/router.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/engine/engine_keys.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/kv_cache.hpp"

namespace troupe::sim {
namespace {

namespace fs = std::filesystem;

struct field {
  const char* name;
  bool required;
  double min;
  double max;
  std::function<void(double)> set_number;                        // numeric fields
  std::function<void(const std::string&)> set_text = nullptr;    // string fields
};

std::string at(const std::string& source, const toml::node& node) {
  if (node.source().begin.line == 0) return source + ": (set on the command line) ";  // an override
  return source + ":" + std::to_string(node.source().begin.line) + ": ";
}

/// Applies `set` to `root` (TABLE.KEY=VALUE each; VALUE typed as topology_overrides says).
expected<void> apply_overrides(toml::table& root, const topology_overrides& set, const std::string& source) {
  for (const auto& [key, text] : set) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == key.size() || key.find('.', dot + 1) != std::string::npos)
      return fail(errc::invalid_argument, "a topology setting is TABLE.KEY=VALUE (e.g. engine.replicas=4), got '" +
                                              key + "=" + text + "'");
    const std::string table_name = key.substr(0, dot), name = key.substr(dot + 1);
    if (!root.contains(table_name)) root.insert(table_name, toml::table{});
    toml::table* table = root[table_name].as_table();
    if (!table) return fail(errc::malformed_file, source + ": '" + table_name + "' is not a table");
    int64_t i = 0;
    double d = 0;
    const char* end = text.data() + text.size();
    if (auto [p, ec] = std::from_chars(text.data(), end, i); !text.empty() && ec == std::errc() && p == end) {
      table->insert_or_assign(name, i);
    } else if (char* stop = nullptr; !text.empty() && (d = std::strtod(text.c_str(), &stop), stop == text.c_str() + text.size())) {
      table->insert_or_assign(name, d);
    } else if (text == "true" || text == "false") {
      table->insert_or_assign(name, text == "true");
    } else {
      table->insert_or_assign(name, text);
    }
  }
  return {};
}

/// A number `node` holds, finite and in [min, max]; `what` ("file:line: [table] key") starts the
/// message.
expected<double> read_number(const toml::node& node, double min, double max, const std::string& what) {
  const std::optional<double> v = node.value<double>();
  if (!v || !std::isfinite(*v)) return fail(errc::malformed_file, what + ": expected a number");
  if (*v < min || *v > max)
    return fail(errc::malformed_file, what + " = " + std::to_string(*v) + " is outside [" + std::to_string(min) + ", " +
                                          std::to_string(max) + "]");
  return *v;
}

/// The simulator's own key `f` from `node`.
expected<void> read_field(const field& f, const toml::node& node, const std::string& what) {
  if (f.set_text) {
    if (!node.is_string()) return fail(errc::malformed_file, what + ": expected a string");
    f.set_text(*node.value<std::string>());
    return {};
  }
  auto v = read_number(node, f.min, f.max, what);
  if (!v) return tl::unexpected(v.error());
  f.set_number(*v);
  return {};
}

/// An engine key (runtime/engine/engine_keys.hpp, the topology files' too) from `node` into
/// `config`: its type, range and rules are the key table's.
expected<void> read_engine_key(const engine::engine_key& key, const toml::node& node, engine::engine_config& config,
                               const std::string& what) {
  expected<void> set;
  if (key.type == engine::key_type::text) {
    if (!node.is_string()) return fail(errc::malformed_file, what + ": expected a string");
    set = key.set_text(config, *node.value<std::string>());
  } else {
    if (key.type == engine::key_type::integer && node.is_floating_point())
      return fail(errc::malformed_file, what + ": expected an integer");
    auto v = read_number(node, key.min, key.max, what);
    if (!v) return tl::unexpected(v.error());
    set = key.set_number(config, *v);
  }
  if (!set) return fail(errc::malformed_file, what + set.error().message);
  return {};
}

/// One table of the file: the simulator's own keys, and with `engine` the engine keys it holds.
struct table_fields {
  const char* name;
  const std::vector<field>& fields;
  bool required;
  engine::engine_config* engine = nullptr;
};

expected<void> read_table(const toml::table& root, const table_fields& spec, const std::string& source) {
  const std::string table_name = spec.name;
  const toml::table* table = root[table_name].as_table();
  if (!table) {
    if (!spec.required) return {};
    return fail(errc::malformed_file, source + ": missing [" + table_name + "] table");
  }
  std::set<std::string> seen;
  for (const auto& [key, node] : *table) {
    const std::string name(key.str());
    const std::string what = at(source, node) + "[" + table_name + "] " + name;
    if (const engine::engine_key* k = spec.engine ? engine::find_sim_engine_key(table_name, name) : nullptr) {
      if (auto ok = read_engine_key(*k, node, *spec.engine, what); !ok) return ok;
      continue;
    }
    auto f = std::find_if(spec.fields.begin(), spec.fields.end(), [&](const field& x) { return name == x.name; });
    if (f == spec.fields.end())
      return fail(errc::malformed_file, at(source, node) + "[" + table_name + "]: unknown key '" + echo(name) + "'");
    seen.insert(name);
    if (auto ok = read_field(*f, node, what); !ok) return ok;
  }
  for (const field& f : spec.fields)
    if (f.required && !seen.count(f.name))
      return fail(errc::malformed_file, at(source, *table) + "[" + table_name + "]: missing key '" + f.name + "'");
  return {};
}

template <class T>
std::function<void(double)> into(T& target) {
  return [&target](double v) { target = static_cast<T>(v); };
}

std::string resolve(const std::string& base_dir, const std::string& path) {
  return fs::path(path).is_absolute() ? path : (fs::path(base_dir) / path).lexically_normal().string();
}

/// The [cost] keys of the roofline model, as read; unset numbers come from the preset.
struct roofline_keys {
  std::string model = "calibrated";
  std::string preset;
  std::optional<double> peak_tflops, memory_bandwidth_gb_s, memory_gb, interconnect_gb_s;
  double tensor_parallel = 1;
  double step_overhead_us = 0;
  double overlap = 1;
  double weight_bytes_per_value = 2;  // [model]
  bool any_given = false;             // a roofline-only key is in [cost]
};

/// The roofline model of `t` (shape and KV pool final) from its keys: the preset's datasheet
/// figures, each overridden by an explicit key.
expected<cost::roofline_model> make_roofline(const sim_topology& t, const roofline_keys& k, double kv_bytes_per_value,
                                             const std::string& where) {
  cost::hardware_spec hw;
  if (!k.preset.empty()) {
    auto preset = cost::find_hardware_preset(k.preset);
    if (!preset) return fail(errc::malformed_file, where + "[cost] preset: " + preset.error().message);
    hw = preset->spec;
  }
  const std::tuple<const std::optional<double>&, double&, double, const char*> numbers[] = {
      {k.peak_tflops, hw.peak_flops, 1e12, "peak_tflops"},
      {k.memory_bandwidth_gb_s, hw.memory_bytes_per_s, 1e9, "memory_bandwidth_gb_s"},
      {k.memory_gb, hw.memory_bytes, 1e9, "memory_gb"},
      {k.interconnect_gb_s, hw.interconnect_bytes_per_s, 1e9, "interconnect_gb_s"}};
  for (const auto& [given, target, unit, name] : numbers) {
    if (given) target = *given * unit;
    if (k.preset.empty() && !given && std::string(name) != "interconnect_gb_s")
      return fail(errc::malformed_file, where + "[cost] model = \"roofline\" needs preset = NAME or " + name);
  }
  if (k.tensor_parallel != std::floor(k.tensor_parallel))
    return fail(errc::malformed_file, where + "[cost] tensor_parallel must be a whole number of devices");
  cost::roofline_options o;
  o.hardware = hw;
  o.tensor_parallel = static_cast<int32_t>(k.tensor_parallel);
  o.step_overhead_ns = k.step_overhead_us * 1e3;
  o.overlap = k.overlap;
  o.weight_bytes_per_value = k.weight_bytes_per_value;
  o.kv_bytes_per_value = kv_bytes_per_value;
  o.kv_memory_bytes = t.kv_memory_gib * 1073741824.0;
  auto model = cost::roofline_model::make(t.model, o);
  if (!model) return fail(errc::malformed_file, where + model.error().message);
  return model;
}

/// Which cost model prices the steps, checked against the keys given for the other.
expected<void> finish_cost_model(sim_topology& t, const roofline_keys& k, const std::string& calibration,
                                 bool cost_inline, double kv_bytes_per_value, const std::string& where) {
  if (k.model != "calibrated" && k.model != "roofline")
    return fail(errc::malformed_file, where + "[cost] model must be \"calibrated\" or \"roofline\", got \"" +
                                          echo(k.model) + "\"");
  if (k.model == "calibrated") {
    if (k.any_given)
      return fail(errc::malformed_file, where + "[cost] preset, peak_tflops, memory_bandwidth_gb_s, memory_gb, "
                                                "interconnect_gb_s, tensor_parallel, step_overhead_us and overlap belong to "
                                                "model = \"roofline\"");
    if (calibration.empty() == !cost_inline)
      return fail(errc::malformed_file, where + "[cost] needs either calibration = FILE or step_ns, token_ns, "
                                                "sampled_row_ns and attention_token_ns (and optionally "
                                                "kv_read_token_ns), not both");
    if (!calibration.empty()) {
      auto params = cost::read_calibration(calibration);
      if (!params) return fail(params.error().code, where + params.error().message);
      t.cost = *params;
    }
    return {};
  }
  if (!calibration.empty() || cost_inline)
    return fail(errc::malformed_file, where + "[cost] model = \"roofline\" prices steps from the hardware: remove "
                                              "calibration and the step_ns/token_ns/... parameters");
  auto roofline = make_roofline(t, k, kv_bytes_per_value, where);
  if (!roofline) return tl::unexpected(roofline.error());
  t.roofline = std::move(*roofline);
  return {};
}

/// The [moe] keys that need the model's shape or other keys, as read.
struct moe_keys {
  std::string policy = "none";
  double drift_every_s = 0;
  double link_latency_us = 0;
  std::optional<double> dispatch_bytes_per_row, expert_bytes;
};

/// `[moe]` once the model's shape is known: the policy, the defaults from the shape, the checks.
expected<void> finish_moe(sim_topology& t, const moe_keys& k, double weight_bytes_per_value, const toml::table& root,
                          const std::string& source) {
  if (!root["moe"].as_table()) return {};
  const std::string where = at(source, *root["moe"].node()) + "[moe] ";
  moe_settings& m = t.moe;
  if (k.policy != "none" && k.policy != "periodic")
    return fail(errc::malformed_file, where + "policy must be none or periodic, got '" + echo(k.policy) + "'");
  m.policy = k.policy == "periodic" ? moe_policy::periodic : moe_policy::none;
  m.n_layers = t.model.n_layers;
  m.drift_every_ns = std::llround(k.drift_every_s * 1e9);
  m.link_latency_ns = k.link_latency_us * 1e3;
  // Defaults from the shape: bf16-sized activations; an expert's three matrices (w1, w2, w3).
  m.dispatch_bytes_per_row = k.dispatch_bytes_per_row.value_or(2.0 * t.model.dim);
  m.expert_bytes = k.expert_bytes.value_or(3.0 * t.model.dim * t.model.hidden_dim * weight_bytes_per_value);
  if (auto ok = validate(m); !ok) return fail(errc::malformed_file, where + ok.error().message);
  return {};
}

/// What the tables hold beyond sim_topology's own fields, used once every table is read.
struct sim_keys {
  double kv_bytes_per_value = 0;  // [model]; 0: not given (the engine's kv_cache_dtype's, else 2)
  std::string checkpoint;         // [model], as written
  std::string calibration;        // [cost], resolved
  std::string tokens = "synthetic";
  roofline_keys roofline;
  moe_keys moe;
};

/// Cross-field checks and derived values, once every table is read.
expected<sim_topology> finish_sim_topology(sim_topology t, const sim_keys& k, const std::string& checkpoint,
                                           const std::string& source, bool cost_inline) {
  const std::string where = source + ": ";
  if (k.tokens != "synthetic" && k.tokens != "real")
    return fail(errc::malformed_file, where + "[cost] tokens must be \"synthetic\" or \"real\", got \"" + echo(k.tokens) + "\"");
  t.tokens = k.tokens == "real" ? token_mode::real : token_mode::synthetic;
  if (!checkpoint.empty()) {
    if (t.model.dim || t.model.n_layers || t.model.n_heads || t.model.n_kv_heads || t.model.vocab_size || t.model.seq_len)
      return fail(errc::malformed_file, where + "[model] gives a checkpoint: its shape comes from the checkpoint, "
                                                "so n_layers/dim/n_heads/n_kv_heads/vocab_size/max_context must not be set");
    auto ck = model::checkpoint::load(checkpoint);
    if (!ck) return fail(ck.error().code, where + ck.error().message);
    t.model = ck->config();
    t.checkpoint_path = checkpoint;
  } else {
    const model::model_config& m = t.model;
    if (!m.dim || !m.n_layers || !m.n_heads || !m.n_kv_heads || !m.vocab_size || !m.seq_len)
      return fail(errc::malformed_file, where + "[model] needs either a checkpoint or all of n_layers, dim, n_heads, "
                                                "n_kv_heads, vocab_size and max_context");
    if (m.dim % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0)
      return fail(errc::malformed_file, where + "[model] dim must be a multiple of n_heads, and n_heads of n_kv_heads");
    if (!t.model.hidden_dim) t.model.hidden_dim = 4 * m.dim;
  }
  if (t.tokens == token_mode::real && t.checkpoint_path.empty())
    return fail(errc::malformed_file, where + "tokens = \"real\" needs [model] checkpoint = the model that computes them");
  double kv_bytes_per_value = k.kv_bytes_per_value > 0 ? k.kv_bytes_per_value : 2;  // fp16 by default
  if (const std::optional<kv::kv_dtype> dtype = t.engine.kv_cache_dtype) {
    if (k.kv_bytes_per_value > 0 && k.kv_bytes_per_value != kv::kv_bytes_per_value(*dtype))
      return fail(errc::malformed_file, where + "[model] kv_bytes_per_value = " + std::to_string(k.kv_bytes_per_value) +
                                            " disagrees with [engine] kv_cache_dtype = \"" +
                                            std::string(kv::name_of(*dtype)) + "\": give one of them");
    if (auto ok = model::check_kv_dtype(t.model, *dtype); !ok)
      return fail(errc::malformed_file, where + "[engine] " + ok.error().message);
    kv_bytes_per_value = kv::kv_bytes_per_value(*dtype);
  }
  t.kv_bytes_per_token = static_cast<int64_t>(std::llround(2.0 * t.model.n_layers * t.model.kv_dim() * kv_bytes_per_value));
  const double blocks = t.kv_memory_gib * 1073741824.0 / (static_cast<double>(t.engine.block_size) * t.kv_bytes_per_token);
  const int64_t needed = (t.model.seq_len + t.engine.block_size - 1) / t.engine.block_size;
  if (blocks < static_cast<double>(needed))
    return fail(errc::malformed_file, where + "[hardware] kv_memory_gib = " + std::to_string(t.kv_memory_gib) +
                                          " holds " + std::to_string(static_cast<int64_t>(blocks)) +
                                          " KV blocks, fewer than one max_context sequence needs (" +
                                          std::to_string(needed) + ")");
  t.engine.num_kv_blocks = static_cast<int32_t>(std::min(blocks, 2e9));
  if (auto ok = finish_cost_model(t, k.roofline, k.calibration, cost_inline, kv_bytes_per_value, where); !ok)
    return tl::unexpected(ok.error());
  if (t.engine.scheduler.step_time_budget_ms != 0 && t.roofline)
    return fail(errc::malformed_file, where + "[engine] step_time_budget_ms needs the calibrated cost model: the "
                                              "scheduler's budget solver prices steps with it, not with the roofline");
  t.engine.scheduler.step_cost = t.cost;  // the scheduler prices steps as the executor runs them
  if (t.engine.speculation.budgeted && t.roofline)
    return fail(errc::malformed_file, where + "[speculation] mode = \"budgeted\" needs the calibrated cost model: "
                                              "the engine prices draft rows with it, not with the roofline");
  if (auto ok = spec::validate(t.engine.speculation, t.model.n_layers); !ok)
    return fail(errc::malformed_file, where + "[speculation] " + ok.error().message);
  return t;
}

constexpr double big = 1 << 30;

std::vector<field> model_fields(sim_topology& t, sim_keys& k, const std::string& base_dir) {
  model::model_config& m = t.model;
  return {{"name", false, 0, 0, nullptr, [&t](const std::string& s) { t.model_name = s; }},
          {"checkpoint", false, 0, 0, nullptr, [&k](const std::string& s) { k.checkpoint = s; }},
          {"tokenizer", false, 0, 0, nullptr,
           [&t, &base_dir](const std::string& s) { t.tokenizer_path = resolve(base_dir, s); }},
          {"n_layers", false, 1, 1024, into(m.n_layers)},      {"dim", false, 1, big, into(m.dim)},
          {"hidden_dim", false, 1, big, into(m.hidden_dim)},    {"n_heads", false, 1, 1024, into(m.n_heads)},
          {"n_kv_heads", false, 1, 1024, into(m.n_kv_heads)},   {"vocab_size", false, 4, big, into(m.vocab_size)},
          {"max_context", false, 2, big, into(m.seq_len)},
          {"kv_bytes_per_value", false, 0.125, 8, into(k.kv_bytes_per_value)},
          {"weight_bytes_per_value", false, 0.125, 8, into(k.roofline.weight_bytes_per_value)}};
}

/// [cost]: the calibrated model's parameters (or its file), the token mode, the roofline's keys.
std::vector<field> cost_fields(sim_topology& t, sim_keys& k, const std::string& base_dir) {
  roofline_keys& r = k.roofline;
  const auto roofline_only = [&r](std::function<void(double)> set) {
    return [&r, set](double v) {
      r.any_given = true;
      set(v);
    };
  };
  return {{"step_ns", false, 0, 1e15, into(t.cost.step_ns)},
          {"token_ns", false, 0, 1e15, into(t.cost.token_ns)},
          {"sampled_row_ns", false, 0, 1e15, into(t.cost.sampled_row_ns)},
          {"attention_token_ns", false, 0, 1e15, into(t.cost.attention_token_ns)},
          {"kv_read_token_ns", false, 0, 1e15, into(t.cost.kv_read_token_ns)},
          {"calibration", false, 0, 0, nullptr,
           [&k, &base_dir](const std::string& s) { k.calibration = resolve(base_dir, s); }},
          {"tokens", false, 0, 0, nullptr, [&k](const std::string& s) { k.tokens = s; }},
          {"model", false, 0, 0, nullptr, [&r](const std::string& s) { r.model = s; }},
          {"preset", false, 0, 0, nullptr, [&r](const std::string& s) {
             r.any_given = true;
             r.preset = s;
           }},
          {"peak_tflops", false, 1e-6, 1e9, roofline_only(into(r.peak_tflops))},
          {"memory_bandwidth_gb_s", false, 1e-6, 1e9, roofline_only(into(r.memory_bandwidth_gb_s))},
          {"memory_gb", false, 1e-6, 1e9, roofline_only(into(r.memory_gb))},
          {"interconnect_gb_s", false, 1e-6, 1e9, roofline_only(into(r.interconnect_gb_s))},
          {"tensor_parallel", false, 1, 1024, roofline_only(into(r.tensor_parallel))},
          {"step_overhead_us", false, 0, 1e9, roofline_only(into(r.step_overhead_us))},
          {"overlap", false, 0, 1, roofline_only(into(r.overlap))}};
}

std::vector<field> moe_fields(sim_topology& t, moe_keys& k) {
  return {{"n_experts", true, 1, 1024, into(t.moe.n_experts)},
          {"top_k", true, 1, 1024, into(t.moe.top_k)},
          {"num_shards", true, 1, 4096, into(t.moe.num_shards)},
          {"capacity", true, 1, 1024, into(t.moe.capacity)},
          {"expert_row_ns", true, 0, 1e12, into(t.moe.expert_row_ns)},
          {"zipf_exponent", false, 0, 16, into(t.moe.zipf_exponent)},
          {"drift_every_s", false, 0, 1e9, into(k.drift_every_s)},
          {"dispatch_bytes_per_row", false, 0, 1e12, into(k.dispatch_bytes_per_row)},
          {"link_bandwidth_gb_s", false, 1e-6, 1e9, into(t.moe.link_bandwidth_gb_s)},
          {"link_latency_us", false, 0, 1e9, into(k.link_latency_us)},
          {"expert_bytes", false, 0, 1e15, into(k.expert_bytes)},
          {"policy", false, 0, 0, nullptr, [&k](const std::string& s) { k.policy = s; }},
          {"window_steps", false, 1, 1e9, into(t.moe.window_steps)},
          // Read by periodic alone; allowed with none, so that a sweep can switch policies.
          {"moe_lb_max", false, 1, 1e6, into(t.moe.moe_lb_max)}};
}

/// Every table into `t` and `k`. [engine] and [speculation] hold the engine keys
/// (runtime/engine/engine_keys.hpp) beside the simulator's own.
expected<void> read_tables(const toml::table& root, sim_topology& t, sim_keys& k, const std::string& base_dir,
                           const std::string& source) {
  const std::vector<field> model = model_fields(t, k, base_dir), cost = cost_fields(t, k, base_dir),
                           moe = moe_fields(t, k.moe);
  const std::vector<field> hardware = {{"kv_memory_gib", true, 1e-6, 1e6, into(t.kv_memory_gib)}};
  const std::vector<field> engine = {{"replicas", false, 1, 4096, into(t.replicas)},
                                     {"prefill_replicas", false, 0, 4095, into(t.prefill_replicas)},
                                     {"max_waiting", false, 1, big, into(t.max_waiting)}};
  const std::vector<field> balancer = {
      {"router", false, 0, 0, nullptr, [&t](const std::string& s) { t.router = s; }},
      {"rate_limit_per_s", false, 0, 1e9, into(t.rate_limit_per_s)},
      {"rate_limit_burst", false, 1, 1e6, into(t.rate_limit_burst)},
      {"prefix_weight", false, 0, balance::prefix_weight_max, into(t.prefix_weight)}};
  const std::vector<field> host_tier = {{"blocks", false, 0, 1e15, into(t.host_tier.blocks)},
                                        {"bandwidth_gb_s", false, 1e-6, 1e9, into(t.host_tier.bandwidth_gb_s)},
                                        {"latency_us", false, 0, 1e9, into(t.host_tier.latency_us)},
                                        {"fetch_timeout_ms", false, 0, 60000, into(t.host_tier.fetch_timeout_ms)}};
  const std::vector<field> disk_tier = {{"blocks", false, 0, 1e15, into(t.disk_tier.blocks)},
                                        {"bandwidth_gb_s", false, 1e-6, 1e9, into(t.disk_tier.bandwidth_gb_s)},
                                        {"latency_us", false, 0, 1e9, into(t.disk_tier.latency_us)}};
  const std::vector<field> network = {{"latency_us", false, 0, 1e9, into(t.network.latency_us)},
                                      {"bandwidth_gb_s", false, 0, 1e9, into(t.network.bandwidth_gb_s)},
                                      {"loss_percent", false, 0, 50, into(t.network.loss_percent)},
                                      {"endpoint_gb_s", false, 0, 1e9, into(t.network.endpoint_gb_s)}};
  const std::vector<field> speculation = {{"acceptance", false, 0, 1, into(t.speculation.acceptance)},
                                          {"draft_token_ns", false, 0, 1e15, into(t.speculation.draft_token_ns)}};
  for (const table_fields& table :
       {table_fields{"model", model, true}, {"hardware", hardware, true}, {"engine", engine, false, &t.engine},
        {"load_balancer", balancer, false}, {"cost", cost, true}, {"host_tier", host_tier, false},
        {"disk_tier", disk_tier, false}, {"speculation", speculation, false, &t.engine}, {"network", network, false},
        {"moe", moe, false}})
    if (auto ok = read_table(root, table, source); !ok) return ok;
  return {};
}

/// Checks across tables: the drafter and preemption the simulator can model, the tiers below
/// one another, a decode replica left, a known router.
expected<void> check_tables(const sim_topology& t, const toml::table& root, const std::string& source) {
  if (t.engine.speculation.drafter == spec::drafter_kind::draft_model)
    return fail(errc::malformed_file, at(source, *root["speculation"]["drafter"].node()) +
                                          "[speculation] drafter: the simulator models draft_model drafts with "
                                          "synthetic tokens only (use drafter = \"ngram\" and `acceptance`)");
  if (t.engine.preemption != engine::preemption_mode::recompute && t.host_tier.blocks == 0)
    return fail(errc::malformed_file, at(source, *root["engine"]["preemption"].node()) + "[engine] preemption = '" +
                                          echo(root["engine"]["preemption"].value_or(std::string())) +
                                          "' swaps to the host tier: it needs [host_tier] blocks > 0");
  if (t.disk_tier.blocks > 0 && t.host_tier.blocks == 0)
    return fail(errc::malformed_file, at(source, *root["disk_tier"]["blocks"].node()) +
                                          "[disk_tier] lies below the host tier: it needs [host_tier] blocks > 0");
  if (t.prefill_replicas >= t.replicas)
    return fail(errc::malformed_file, at(source, *root["engine"]["prefill_replicas"].node()) +
                                          "[engine] prefill_replicas must leave at least one decode replica: " +
                                          std::to_string(t.prefill_replicas) + " of " + std::to_string(t.replicas));
  if (auto r = balance::make_router({t.router, 0, t.prefix_weight}); !r)
    return fail(errc::malformed_file, at(source, *root["load_balancer"]["router"].node()) + "[load_balancer] router: " +
                                          r.error().message);
  return {};
}

/// Whether [cost] gives the calibrated model's parameters inline: all four of them, or none.
expected<bool> cost_inline(const toml::table& root, const std::string& source) {
  const toml::table* cost = root["cost"].as_table();
  int inline_params = 0;
  for (const char* k : {"step_ns", "token_ns", "sampled_row_ns", "attention_token_ns"}) inline_params += cost->contains(k);
  if ((inline_params != 0 && inline_params != 4) || (inline_params == 0 && cost->contains("kv_read_token_ns")))
    return fail(errc::malformed_file, at(source, *cost) + "[cost] needs all four of step_ns, token_ns, "
                                                          "sampled_row_ns and attention_token_ns "
                                                          "(kv_read_token_ns is optional)");
  return inline_params == 4;
}

/// The TOML document of `text` with `set` applied; every top-level key a known table.
expected<toml::table> parse_toml(std::string_view text, const std::string& source, const topology_overrides& set) {
  toml::table root;
  try {  // toml++ is built with exceptions; none leaves this function
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return fail(errc::malformed_file, source + ":" + std::to_string(e.source().begin.line) + ": " +
                                          std::string(e.description()));
  }
  if (auto ok = apply_overrides(root, set, source); !ok) return tl::unexpected(ok.error());
  for (const auto& [key, node] : root)
    if (!node.is_table() || (key != "model" && key != "hardware" && key != "engine" && key != "cost" &&
                             key != "load_balancer" && key != "host_tier" && key != "disk_tier" && key != "speculation" &&
                             key != "network" && key != "moe"))
      return fail(errc::malformed_file, at(source, node) + "unknown top-level key '" + echo(key.str()) + "'");
  return root;
}

}  // namespace

expected<sim_topology> parse_sim_topology(std::string_view text, const std::string& source,
                                          const std::string& base_dir, const topology_overrides& set) {
  auto root = parse_toml(text, source, set);
  if (!root) return tl::unexpected(root.error());
  sim_topology t;
  sim_keys k;
  if (const toml::node* copies = (*root)["host_tier"]["copies"].node())  // before 2026-12-07
    return fail(errc::malformed_file, at(source, *copies) +
                                          "[host_tier] copies is gone: a step's moves overlap its compute as the engine's copy "
                                          "stream has them, set by [engine] copy_stream_min_bytes (0: every step's, as "
                                          "\"overlapped\" did; -1: none, as \"step\" did)");
  if (auto ok = read_tables(*root, t, k, base_dir, source); !ok) return tl::unexpected(ok.error());
  if (auto ok = check_tables(t, *root, source); !ok) return tl::unexpected(ok.error());
  auto inline_params = cost_inline(*root, source);
  if (!inline_params) return tl::unexpected(inline_params.error());
  auto finished = finish_sim_topology(std::move(t), k, k.checkpoint.empty() ? "" : resolve(base_dir, k.checkpoint),
                                      source, *inline_params);
  if (!finished) return finished;
  if (auto ok = finish_moe(*finished, k.moe, k.roofline.weight_bytes_per_value, *root, source); !ok)
    return tl::unexpected(ok.error());
  return finished;
}

expected<sim_topology> load_sim_topology(const std::string& path, const topology_overrides& set) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return fail(errc::io_error, "cannot read simulation topology '" + echo(path, echo_path_bytes_max) + "'");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_sim_topology(text, path, fs::path(path).parent_path().string(), set);
}

}  // namespace troupe::sim
