// Topology file parsing and validation. The only translation unit that includes toml++: it
// turns a TOML document into the plain structs of topology.hpp or into one error naming the
// file, the line and the key. Tables are read one function each; cross-table checks
// (duplicates, references, roles) happen as soon as the tables they need have been read.

#include "topology/topology.hpp"

#include "runtime/tokenizer/chat_template.hpp"

#include <toml++/toml.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <system_error>

#include "runtime/balance/placement.hpp"
#include "runtime/balance/router.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/engine/engine_keys.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::topology {

namespace fs = std::filesystem;

const char* to_string(engine_role role) {
  switch (role) {
    case engine_role::mixed: return "mixed";
    case engine_role::prefill: return "prefill";
    case engine_role::decode: return "decode";
  }
  TROUPE_ASSERT_MSG(false, "unknown engine_role");
  return "";
}

const char* to_string(kv_transfer_kind kind) {
  switch (kind) {
    case kv_transfer_kind::caf: return "caf";
    case kv_transfer_kind::ucx: return "ucx";
  }
  TROUPE_ASSERT_MSG(false, "unknown kv_transfer_kind");
  return "";
}

const node_spec* topology::find_node(std::string_view name) const {
  auto it = std::find_if(nodes.begin(), nodes.end(),
                         [&](const node_spec& node) { return node.name == name; });
  return it == nodes.end() ? nullptr : &*it;
}

const engine_spec* topology::first_engine_on(std::string_view node) const {
  auto it = std::find_if(engines.begin(), engines.end(), [&](const engine_spec& e) { return e.node == node; });
  return it == engines.end() ? nullptr : &*it;
}

const engine_spec* topology::find_engine(std::string_view name) const {
  auto it = std::find_if(engines.begin(), engines.end(), [&](const engine_spec& e) { return e.name == name; });
  return it == engines.end() ? nullptr : &*it;
}

namespace {

constexpr int64_t int32_max = std::numeric_limits<int32_t>::max();
constexpr int64_t port_max = 65535;
/// What a node's kv_port is when the file does not say.
constexpr int64_t kv_port_offset = 1000;
/// More tiers than this would only thin out the prefill engines each tier gets.
constexpr size_t num_prefill_tier_bounds_max = 16;
/// A name in [load_balancer] nodes longer than this names no node anyway.
constexpr size_t node_name_bytes_max = 256;

/// What every error message needs: the file's name, and where relative paths start.
struct context {
  const std::string& source_name;
  const std::string& base_dir;
};

/// The table being read: its name in messages ("engine 'engine0'", "node #2") and its header
/// line, which is where a missing key is reported.
struct scope {
  std::string label;
  toml::source_index line = 0;
};

/// A key or value of the file as a message quotes it (at most echo_bytes_max bytes of it).
[[nodiscard]] std::string in_quotes(std::string_view text) { return "'" + echo(text) + "'"; }

[[nodiscard]] toml::source_index line_of(const toml::node& node) {
  return node.source().begin.line;
}

/// `source:line: label: what`; the line is left out when unknown (0), the label when empty.
[[nodiscard]] tl::unexpected<error> malformed(const context& ctx, toml::source_index line,
                                              std::string_view label, std::string_view what) {
  std::string message = ctx.source_name;
  if (line > 0) message += ":" + std::to_string(line);
  message += ": ";
  if (!label.empty()) message += std::string(label) + ": ";
  message += what;
  return fail(errc::malformed_file, std::move(message));
}

[[nodiscard]] const char* type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "an unknown type";
}

/// Fails on the first key of `table` (in key order) that is not in `known`.
[[nodiscard]] expected<void> check_known_keys(const context& ctx, const toml::table& table,
                                              const scope& where, const std::vector<std::string_view>& known) {
  TROUPE_ASSERT(known.size() > 0);
  for (const auto& [key, value] : table) {
    if (std::find(known.begin(), known.end(), key.str()) != known.end()) continue;
    std::string expected_keys;
    for (std::string_view k : known) {
      expected_keys += (expected_keys.empty() ? "" : ", ") + std::string(k);
    }
    return malformed(
        ctx, key.source().begin.line, where.label,
        "unknown key " + in_quotes(key.str()) + " (expected one of: " + expected_keys + ")");
  }
  return {};
}

/// A non-empty string; `fallback` makes the key optional.
[[nodiscard]] expected<std::string> read_string(const context& ctx, const toml::table& table,
                                                const scope& where, std::string_view key,
                                                std::optional<std::string> fallback = {}) {
  const toml::node* node = table.get(key);
  if (node == nullptr) {
    if (fallback) return *fallback;
    return malformed(ctx, where.line, where.label, "missing required key " + in_quotes(key));
  }
  const auto* value = node->as_string();
  if (value == nullptr) {
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " must be a string, got " + type_name(node->type()));
  }
  if (value->get().empty()) {
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " must not be empty");
  }
  return value->get();
}

/// An integer in [min, max]; `fallback` makes the key optional.
[[nodiscard]] expected<int32_t> read_int(const context& ctx, const toml::table& table,
                                         const scope& where, std::string_view key,
                                         std::optional<int32_t> fallback, int64_t min,
                                         int64_t max = int32_max) {
  TROUPE_ASSERT(min <= max);
  TROUPE_ASSERT(max <= int32_max);
  const toml::node* node = table.get(key);
  if (node == nullptr) {
    if (fallback) return *fallback;
    return malformed(ctx, where.line, where.label, "missing required key " + in_quotes(key));
  }
  const auto* value = node->as_integer();
  if (value == nullptr) {
    return malformed(
        ctx, line_of(*node), where.label,
        "key " + in_quotes(key) + " must be an integer, got " + type_name(node->type()));
  }
  const int64_t number = value->get();
  if (number < min || number > max) {
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " must be in " + std::to_string(min) + ".." +
                         std::to_string(max) + ", got " + std::to_string(number));
  }
  return static_cast<int32_t>(number);
}

/// A number (integer or float) in [min, max]; absent: `fallback`.
[[nodiscard]] expected<double> read_number(const context& ctx, const toml::table& table, const scope& where,
                                           std::string_view key, double fallback, double min, double max) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return fallback;
  const std::optional<double> value = node->is_number() ? node->value<double>() : std::nullopt;
  if (!value) {
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " must be a number, got " + type_name(node->type()));
  }
  if (!(*value >= min && *value <= max)) {
    std::ostringstream range;
    range << std::setprecision(15) << "key " << in_quotes(key) << " must be in " << min << ".." << max << ", got " << *value;
    return malformed(ctx, line_of(*node), where.label, range.str());
  }
  return *value;
}

/// The line of `key`'s value in `table`, or the table's own line when the key is absent.
[[nodiscard]] toml::source_index line_of_key(const toml::table& table, std::string_view key) {
  const toml::node* node = table.get(key);
  return node != nullptr ? line_of(*node) : line_of(table);
}

/// `key` names a node of `nodes` (which must already be read).
[[nodiscard]] expected<std::string> read_node_reference(const context& ctx,
                                                        const toml::table& table,
                                                        const scope& where,
                                                        const std::vector<node_spec>& nodes) {
  auto name = read_string(ctx, table, where, "node");
  if (!name) return name;
  auto known = std::find_if(nodes.begin(), nodes.end(),
                            [&](const node_spec& node) { return node.name == *name; });
  if (known == nodes.end()) {
    return malformed(ctx, line_of_key(table, "node"), where.label,
                     "key 'node' names unknown node " + in_quotes(*name));
  }
  return name;
}

/// An existing regular file, resolved against the topology file's directory.
[[nodiscard]] expected<std::string> read_file_path(const context& ctx, const toml::table& table,
                                                   const scope& where, std::string_view key) {
  auto raw = read_string(ctx, table, where, key);
  if (!raw) return raw;
  std::error_code ec;
  fs::path resolved = fs::absolute(fs::path(ctx.base_dir) / *raw, ec).lexically_normal();
  const toml::source_index line = line_of_key(table, key);
  const std::string tried = echo(resolved.string(), echo_path_bytes_max) + " (from '" + echo(*raw, echo_path_bytes_max) + "')";
  if (ec) {
    return malformed(ctx, line, where.label,
                     "key " + in_quotes(key) + ": cannot resolve " + tried + ": " + ec.message());
  }
  const fs::file_status status = fs::status(resolved, ec);
  if (!fs::exists(status)) {
    return malformed(ctx, line, where.label,
                     "key " + in_quotes(key) + ": file not found: " + tried);
  }
  if (!fs::is_regular_file(status)) {
    return malformed(ctx, line, where.label,
                     "key " + in_quotes(key) + ": not a regular file: " + tried);
  }
  return resolved.string();
}

/// The array of tables `[[key]]`; an absent key is an empty array.
[[nodiscard]] expected<std::vector<const toml::table*>> read_tables(const context& ctx,
                                                                    const toml::table& root,
                                                                    std::string_view key) {
  std::vector<const toml::table*> tables;
  const toml::node* node = root.get(key);
  if (node == nullptr) return tables;
  const toml::array* array = node->as_array();
  if (array == nullptr || !(array->empty() || array->is_array_of_tables())) {
    return malformed(ctx, line_of(*node), "",
                     "key " + in_quotes(key) + " must be an array of tables ([[" +
                         std::string(key) + "]]), got " +
                         (array ? "an array of values" : type_name(node->type())));
  }
  for (const toml::node& element : *array) tables.push_back(element.as_table());
  return tables;
}

/// "engine 'engine0'" when the table has a usable name, else "engine #1" (1-based index).
[[nodiscard]] std::string label_of(std::string_view kind, const toml::table& table, size_t index) {
  const auto* name = table.get_as<std::string>("name");
  if (name != nullptr && !name->get().empty())
    return std::string(kind) + " " + in_quotes(name->get());
  return std::string(kind) + " #" + std::to_string(index + 1);
}

/// A node's `certificate` and `key`: both required with [tls] (`tls`), both refused without.
[[nodiscard]] expected<void> read_node_credentials(const context& ctx, const toml::table& table,
                                                   const scope& where, bool tls, node_spec& node) {
  for (const char* key : {"certificate", "key"}) {
    if (tls || table.get(key) == nullptr) continue;
    return malformed(ctx, line_of_key(table, key), where.label,
                     "key " + in_quotes(key) + " needs a [tls] table naming the cluster's 'ca'");
  }
  if (!tls) return {};
  auto certificate = read_file_path(ctx, table, where, "certificate");
  if (!certificate) return tl::unexpected(certificate.error());
  auto key = read_file_path(ctx, table, where, "key");
  if (!key) return tl::unexpected(key.error());
  node.certificate = *certificate;
  node.key = *key;
  return {};
}

/// disk_tier_dir (relative to the file) and disk_tier_mib come together, below a host tier.
[[nodiscard]] expected<void> read_disk_tier(const context& ctx, const toml::table& table, const scope& where,
                                            node_spec& node) {
  const bool has_dir = table.get("disk_tier_dir") != nullptr;
  if (has_dir != (table.get("disk_tier_mib") != nullptr))
    return malformed(ctx, line_of_key(table, has_dir ? "disk_tier_dir" : "disk_tier_mib"), where.label,
                     "disk_tier_dir and disk_tier_mib go together: set both or neither");
  if (!has_dir) return {};
  if (node.host_tier_blocks == 0)
    return malformed(ctx, line_of_key(table, "disk_tier_dir"), where.label,
                     "a disk tier holds what the host tier evicts: set host_tier_blocks too");
  auto dir = read_string(ctx, table, where, "disk_tier_dir");
  if (!dir) return tl::unexpected(dir.error());
  node.disk_tier_dir = (fs::path(ctx.base_dir) / *dir).lexically_normal().string();
  auto mib = read_int(ctx, table, where, "disk_tier_mib", std::nullopt, 1);
  if (!mib) return tl::unexpected(mib.error());
  node.disk_tier_mib = *mib;
  return {};
}

[[nodiscard]] expected<node_spec> read_node(const context& ctx, const toml::table& table,
                                            size_t index, bool tls) {
  const scope where{label_of("node", table, index), line_of(table)};
  if (auto ok = check_known_keys(ctx, table, where,
                                 {"name", "host", "port", "kv_port", "certificate", "key", "host_tier_blocks",
                                  "host_tier_fetch_timeout_ms", "disk_tier_dir", "disk_tier_mib"});
      !ok) {
    return tl::unexpected(ok.error());
  }
  node_spec node;
  auto name = read_string(ctx, table, where, "name");
  if (!name) return tl::unexpected(name.error());
  node.name = *name;
  auto address = read_string(ctx, table, where, "host");
  if (!address) return tl::unexpected(address.error());
  node.address = *address;
  auto port = read_int(ctx, table, where, "port", std::nullopt, 1, port_max);
  if (!port) return tl::unexpected(port.error());
  node.port = static_cast<uint16_t>(*port);
  const int64_t kv_port_default = *port + kv_port_offset;
  if (table.get("kv_port") == nullptr && kv_port_default > port_max) {
    return malformed(ctx, line_of_key(table, "port"), where.label,
                     "port " + std::to_string(*port) + " leaves no default 'kv_port' (port + " +
                         std::to_string(kv_port_offset) + " = " +
                         std::to_string(kv_port_default) + " > " + std::to_string(port_max) +
                         "): set kv_port");
  }
  auto kv_port = read_int(ctx, table, where, "kv_port", static_cast<int32_t>(kv_port_default), 1,
                          port_max);
  if (!kv_port) return tl::unexpected(kv_port.error());
  node.kv_port = static_cast<uint16_t>(*kv_port);
  if (auto ok = read_node_credentials(ctx, table, where, tls, node); !ok) return tl::unexpected(ok.error());
  auto tier_blocks = read_int(ctx, table, where, "host_tier_blocks", 0, 0);
  if (!tier_blocks) return tl::unexpected(tier_blocks.error());
  node.host_tier_blocks = *tier_blocks;
  auto fetch_timeout = read_int(ctx, table, where, "host_tier_fetch_timeout_ms", node.host_tier_fetch_timeout_ms, 0, 60000);
  if (!fetch_timeout) return tl::unexpected(fetch_timeout.error());
  node.host_tier_fetch_timeout_ms = *fetch_timeout;
  if (auto ok = read_disk_tier(ctx, table, where, node); !ok) return tl::unexpected(ok.error());
  TROUPE_ASSERT(node.port >= 1);
  TROUPE_ASSERT(node.kv_port >= 1);
  return node;
}

/// One port a node listens on, and how to point at it in a message.
struct listener {
  const char* what;  ///< "port", "kv_port" or "default kv_port = port + 1000"
  uint16_t port = 0;
  toml::source_index line = 0;
};

/// A node's two listeners; a default kv_port is located at the `port` it derives from.
[[nodiscard]] std::array<listener, 2> listeners_of(const node_spec& node,
                                                   const toml::table& table) {
  const bool kv_port_explicit = table.get("kv_port") != nullptr;
  return {listener{"port", node.port, line_of_key(table, "port")},
          listener{kv_port_explicit ? "kv_port" : "default kv_port = port + 1000", node.kv_port,
                   line_of_key(table, kv_port_explicit ? "kv_port" : "port")}};
}

/// `address:port` is taken: say by which node's which listener, and where that was set. A clash
/// of ports keeps the older message's form; a kv_port clash says it is about the kv_port.
[[nodiscard]] tl::unexpected<error> address_in_use(const context& ctx, const listener& mine,
                                                   std::string_view label, const node_spec& node,
                                                   const listener& theirs) {
  const bool is_port = std::string_view(mine.what) == "port";
  const std::string which = is_port ? "" : " (" + std::string(mine.what) + ")";
  return malformed(ctx, mine.line, label,
                   "address " + node.address + ":" + std::to_string(mine.port) + which +
                       " is already used by node " + in_quotes(node.name) + " (its " +
                       theirs.what + ", line " + std::to_string(theirs.line) + ")");
}

/// No listener of `node` (read from `table`) is one of `other`'s (an earlier node).
[[nodiscard]] expected<void> check_addresses(const context& ctx, const node_spec& node,
                                             const toml::table& table, const node_spec& other,
                                             const toml::table& other_table) {
  if (node.address != other.address) return {};
  const std::array<listener, 2> mine = listeners_of(node, table);
  const std::array<listener, 2> theirs = listeners_of(other, other_table);
  for (const listener& m : mine) {
    for (const listener& t : theirs) {
      if (m.port != t.port) continue;
      return address_in_use(ctx, m, "node " + in_quotes(node.name), other, t);
    }
  }
  return {};
}

/// A node's kv_port is not its own port (only possible when kv_port is explicit).
[[nodiscard]] expected<void> check_own_addresses(const context& ctx, const node_spec& node,
                                                 const toml::table& table) {
  const std::array<listener, 2> own = listeners_of(node, table);
  if (own[1].port != own[0].port) return {};
  return address_in_use(ctx, own[1], "node " + in_quotes(node.name), node, own[0]);
}

/// Every [[node]]: at least one, unique names, unique (address, port) and (address, kv_port).
[[nodiscard]] expected<std::vector<node_spec>> read_nodes(const context& ctx,
                                                          const toml::table& root, bool tls) {
  auto tables = read_tables(ctx, root, "node");
  if (!tables) return tl::unexpected(tables.error());
  if (tables->empty()) return malformed(ctx, 0, "", "no [[node]] tables: a topology needs a node");
  std::vector<node_spec> nodes;
  for (size_t i = 0; i < tables->size(); ++i) {
    const toml::table& table = *(*tables)[i];
    auto node = read_node(ctx, table, i, tls);
    if (!node) return tl::unexpected(node.error());
    const std::string label = "node " + in_quotes(node->name);
    for (size_t j = 0; j < nodes.size(); ++j) {
      if (nodes[j].name == node->name) {
        return malformed(ctx, line_of_key(table, "name"), label,
                         "duplicate node name (first defined at line " +
                             std::to_string(line_of(*(*tables)[j])) + ")");
      }
      if (auto ok = check_addresses(ctx, *node, table, nodes[j], *(*tables)[j]); !ok) {
        return tl::unexpected(ok.error());
      }
    }
    if (auto ok = check_own_addresses(ctx, *node, table); !ok) {
      return tl::unexpected(ok.error());
    }
    nodes.push_back(std::move(*node));
  }
  TROUPE_ASSERT(nodes.size() == tables->size());
  return nodes;
}

[[nodiscard]] expected<engine_role> read_role(const context& ctx, const toml::table& table,
                                              const scope& where) {
  auto role = read_string(ctx, table, where, "role", std::string("mixed"));
  if (!role) return tl::unexpected(role.error());
  for (engine_role r : {engine_role::mixed, engine_role::prefill, engine_role::decode}) {
    if (*role == to_string(r)) return r;
  }
  return malformed(ctx, line_of_key(table, "role"), where.label,
                   "key 'role' must be one of mixed, prefill, decode; got " + in_quotes(*role));
}

/// One engine key of `table` (runtime/engine/engine_keys.hpp): its type and range checked as the
/// key table says, its value set into `config`.
[[nodiscard]] expected<void> read_engine_key(const context& ctx, const toml::table& table, const scope& where,
                                             const engine::engine_key& key, engine::engine_config& config) {
  expected<void> set;
  if (key.type == engine::key_type::text) {
    auto text = read_string(ctx, table, where, key.name);
    if (!text) return tl::unexpected(text.error());
    set = key.set_text(config, *text);
  } else if (key.type == engine::key_type::integer) {
    auto value = read_int(ctx, table, where, key.name, std::nullopt, static_cast<int64_t>(key.min),
                          static_cast<int64_t>(key.max));
    if (!value) return tl::unexpected(value.error());
    set = key.set_number(config, *value);
  } else {
    auto value = read_number(ctx, table, where, key.name, 0, key.min, key.max);
    if (!value) return tl::unexpected(value.error());
    set = key.set_number(config, *value);
  }
  if (!set) return malformed(ctx, line_of_key(table, key.name), where.label, "key " + in_quotes(key.name) + set.error().message);
  return {};
}

/// `calibration`, a `troupe calibrate` file that prices the steps: needed by a time budget (its
/// step_cost) and by preemption = "cost" (which prices recomputing).
[[nodiscard]] expected<void> read_calibration(const context& ctx, const toml::table& table, const scope& where,
                                              engine::engine_config& config) {
  if (!table.contains("calibration")) {
    if (config.scheduler.step_time_budget_ms != 0)
      return malformed(ctx, line_of_key(table, "step_time_budget_ms"), where.label,
                       "key 'step_time_budget_ms' needs key 'calibration' (a `troupe calibrate` file that "
                       "prices the steps)");
    if (config.preemption == engine::preemption_mode::cost)
      return malformed(ctx, line_of_key(table, "preemption"), where.label,
                       "key 'preemption' = \"cost\" needs key 'calibration' (a `troupe calibrate` file that prices "
                       "recomputing)");
    return {};
  }
  auto path = read_file_path(ctx, table, where, "calibration");
  if (!path) return tl::unexpected(path.error());
  auto params = cost::read_calibration(*path);
  if (!params) {
    return malformed(ctx, line_of_key(table, "calibration"), where.label,
                     "key 'calibration': " + params.error().message);
  }
  config.scheduler.step_cost = *params;
  return {};
}

/// What speculation needs beyond its keys: ngram_max at least ngram_min, and `draft_model` (a
/// checkpoint path) for the draft_model drafter.
[[nodiscard]] expected<void> read_draft_model(const context& ctx, const toml::table& table, const scope& where,
                                              spec::speculation_config& config) {
  if (config.ngram_max < config.ngram_min)
    return malformed(ctx, line_of_key(table, "ngram_max"), where.label,
                     "key 'ngram_max' must be in " + std::to_string(config.ngram_min) + ".." +
                         std::to_string(static_cast<int64_t>(engine::find_engine_key("ngram_max")->max)) + ", got " +
                         std::to_string(config.ngram_max));
  if (table.contains("draft_model")) {
    auto path = read_file_path(ctx, table, where, "draft_model");
    if (!path) return tl::unexpected(path.error());
    config.draft_model = *path;
  }
  if (config.drafter == spec::drafter_kind::draft_model && config.draft_model.empty())
    return malformed(ctx, line_of_key(table, "drafter"), where.label,
                     "key 'drafter' = \"draft_model\" needs key 'draft_model' (a llama2.c checkpoint with the "
                     "model's vocabulary)");
  return {};
}

/// The engine_config keys, as the key table defines them (defaults are engine_config's own), and
/// the files some of them need.
[[nodiscard]] expected<void> read_engine_keys(const context& ctx, const toml::table& table, const scope& where,
                                              engine::engine_config& config) {
  for (const engine::engine_key& key : engine::engine_keys()) {
    if (!table.contains(key.name)) continue;
    if (auto ok = read_engine_key(ctx, table, where, key, config); !ok) return ok;
  }
  if (auto ok = read_calibration(ctx, table, where, config); !ok) return ok;
  return read_draft_model(ctx, table, where, config.speculation);
}

/// The keys of an [[engine]] beyond the engine_config's: the executor's threads, the longest
/// context, the expert shards' timing, the step log.
[[nodiscard]] expected<void> read_engine_spec_keys(const context& ctx, const toml::table& table,
                                                   const scope& where, engine_spec& engine) {
  auto threads = read_int(ctx, table, where, "executor_threads", engine.executor_threads, 1, 64);
  if (!threads) return tl::unexpected(threads.error());
  engine.executor_threads = *threads;
  auto max_context = read_int(ctx, table, where, "max_model_len", engine.max_context, 0, 1 << 24);
  if (!max_context) return tl::unexpected(max_context.error());
  engine.max_context = *max_context;
  auto expert_timeout = read_int(ctx, table, where, "expert_timeout_ms", engine.expert_timeout_ms, 1, 600000);
  if (!expert_timeout) return tl::unexpected(expert_timeout.error());
  engine.expert_timeout_ms = *expert_timeout;
  auto window = read_int(ctx, table, where, "expert_window_steps", engine.expert_window_steps, 0, 1000000);
  if (!window) return tl::unexpected(window.error());
  engine.expert_window_steps = *window;
  auto capacity = read_int(ctx, table, where, "expert_capacity", engine.expert_capacity, 0, model::moe_experts_max);
  if (!capacity) return tl::unexpected(capacity.error());
  engine.expert_capacity = *capacity;
  auto lb_max = read_number(ctx, table, where, "expert_moe_lb_max", engine.expert_moe_lb_max, 1, 1000);
  if (!lb_max) return tl::unexpected(lb_max.error());
  engine.expert_moe_lb_max = *lb_max;
  auto move_steps = read_int(ctx, table, where, "expert_move_steps_max", engine.expert_move_steps_max, 1, 1000000);
  if (!move_steps) return tl::unexpected(move_steps.error());
  engine.expert_move_steps_max = *move_steps;
  auto step_log = read_string(ctx, table, where, "step_log", std::string());
  if (!step_log) return tl::unexpected(step_log.error());
  if (!step_log->empty())
    engine.step_log = (fs::path(ctx.base_dir) / *step_log).lexically_normal().string();
  auto layout_cache = read_string(ctx, table, where, "layout_cache", std::string());
  if (!layout_cache) return tl::unexpected(layout_cache.error());
  if (!layout_cache->empty())
    engine.layout_cache =
        *layout_cache == "off" ? "off" : (fs::path(ctx.base_dir) / *layout_cache).lexically_normal().string();
  return {};
}

/// The keys an [[engine]] table may hold: its own, then the engine keys of the key table.
[[nodiscard]] std::vector<std::string_view> engine_table_keys() {
  std::vector<std::string_view> known = {"name", "node", "role", "model", "tokenizer", "calibration",
                                         "draft_model", "executor_threads", "max_model_len", "step_log", "layout_cache",
                                         "expert_timeout_ms",
                                         "expert_window_steps", "expert_capacity", "expert_moe_lb_max",
                                         "expert_move_steps_max"};
  for (const engine::engine_key& key : engine::engine_keys()) known.push_back(key.name);
  return known;
}

[[nodiscard]] expected<engine_spec> read_engine(const context& ctx, const toml::table& table,
                                                size_t index, const std::vector<node_spec>& nodes) {
  const scope where{label_of("engine", table, index), line_of(table)};
  if (auto ok = check_known_keys(ctx, table, where, engine_table_keys()); !ok) return tl::unexpected(ok.error());
  engine_spec engine;
  auto name = read_string(ctx, table, where, "name");
  if (!name) return tl::unexpected(name.error());
  engine.name = *name;
  auto node = read_node_reference(ctx, table, where, nodes);
  if (!node) return tl::unexpected(node.error());
  engine.node = *node;
  auto role = read_role(ctx, table, where);
  if (!role) return tl::unexpected(role.error());
  engine.role = *role;
  auto model = read_file_path(ctx, table, where, "model");
  if (!model) return tl::unexpected(model.error());
  engine.model_path = *model;
  auto tokenizer = read_file_path(ctx, table, where, "tokenizer");
  if (!tokenizer) return tl::unexpected(tokenizer.error());
  engine.tokenizer_path = *tokenizer;
  if (auto ok = read_engine_keys(ctx, table, where, engine.config); !ok) return tl::unexpected(ok.error());
  if (auto ok = read_engine_spec_keys(ctx, table, where, engine); !ok) return tl::unexpected(ok.error());
  return engine;
}

/// Some engine can prefill, and prefill-only engines have somewhere to hand requests to.
[[nodiscard]] expected<void> check_roles(const context& ctx, toml::source_index line,
                                         const std::vector<engine_spec>& engines) {
  TROUPE_ASSERT(!engines.empty());
  auto count = [&](engine_role role) {
    return std::count_if(engines.begin(), engines.end(),
                         [&](const engine_spec& e) { return e.role == role; });
  };
  const auto num_mixed = count(engine_role::mixed);
  const auto num_prefill = count(engine_role::prefill);
  const auto num_decode = count(engine_role::decode);
  if (num_mixed + num_prefill == 0) {
    return malformed(ctx, line, "",
                     "every engine has role 'decode': no engine can prefill a prompt (make one "
                     "'mixed' or 'prefill')");
  }
  if (num_prefill > 0 && num_mixed + num_decode == 0) {
    return malformed(ctx, line, "",
                     "every engine has role 'prefill': no engine can decode the prefilled "
                     "requests (make one 'mixed' or 'decode')");
  }
  return {};
}

/// Every [[engine]]: at least one, unique names, known nodes, a workable mix of roles.
/// The engines of a node with a host tier share it, and a block is named by its tokens alone:
/// they must run one model with one block size, or one engine's KV would serve another's.
[[nodiscard]] expected<void> check_shared_tiers(const context& ctx, const std::vector<const toml::table*>& tables,
                                                const std::vector<engine_spec>& engines,
                                                const std::vector<node_spec>& nodes) {
  for (size_t j = 0; j < engines.size(); ++j) {
    const auto node = std::find_if(nodes.begin(), nodes.end(), [&](const node_spec& n) { return n.name == engines[j].node; });
    if ((node == nodes.end() || node->host_tier_blocks == 0) &&
        engines[j].config.preemption != engine::preemption_mode::recompute)
      return malformed(ctx, line_of_key(*tables[j], "preemption"), "engine " + in_quotes(engines[j].name),
                       "key 'preemption' swaps to the host tier: node " + in_quotes(engines[j].node) +
                           " needs one (host_tier_blocks)");
    if (node == nodes.end() || node->host_tier_blocks == 0) continue;
    for (size_t i = 0; i < j; ++i) {
      const engine_spec& a = engines[i];
      const engine_spec& b = engines[j];
      if (a.node != b.node || (a.model_path == b.model_path && a.config.block_size == b.config.block_size)) continue;
      return malformed(ctx, line_of(*tables[j]), "engine " + in_quotes(b.name),
                       "node " + in_quotes(b.node) + " has a host tier (host_tier_blocks), which its engines share: "
                       "each must run the model and block_size of engine " + in_quotes(a.name) + " (" + a.model_path +
                       ", block_size " + std::to_string(a.config.block_size) + "), got " + b.model_path +
                       ", block_size " + std::to_string(b.config.block_size));
    }
  }
  return {};
}

[[nodiscard]] expected<std::vector<engine_spec>> read_engines(const context& ctx,
                                                              const toml::table& root,
                                                              const std::vector<node_spec>& nodes) {
  auto tables = read_tables(ctx, root, "engine");
  if (!tables) return tl::unexpected(tables.error());
  if (tables->empty()) {
    return malformed(ctx, 0, "", "no [[engine]] tables: a topology needs an engine");
  }
  std::vector<engine_spec> engines;
  for (size_t i = 0; i < tables->size(); ++i) {
    const toml::table& table = *(*tables)[i];
    auto engine = read_engine(ctx, table, i, nodes);
    if (!engine) return tl::unexpected(engine.error());
    for (size_t j = 0; j < engines.size(); ++j) {
      if (engines[j].name != engine->name) continue;
      return malformed(ctx, line_of_key(table, "name"), "engine " + in_quotes(engine->name),
                       "duplicate engine name (first defined at line " +
                           std::to_string(line_of(*(*tables)[j])) + ")");
    }
    engines.push_back(std::move(*engine));
  }
  if (auto ok = check_roles(ctx, line_of(*tables->front()), engines); !ok) {
    return tl::unexpected(ok.error());
  }
  if (auto ok = check_shared_tiers(ctx, *tables, engines, nodes); !ok) return tl::unexpected(ok.error());
  return engines;
}


/// A table `[key]` of the root, or nullptr when absent.
[[nodiscard]] expected<const toml::table*> read_table(const context& ctx, const toml::table& root,
                                                      std::string_view key) {
  const toml::node* node = root.get(key);
  if (node == nullptr) return nullptr;
  if (!node->is_table()) {
    return malformed(ctx, line_of(*node), "",
                     "key " + in_quotes(key) + " must be a table ([" + std::string(key) +
                         "]), got " + type_name(node->type()));
  }
  return node->as_table();
}

/// `key`: an array of at most `max_count` strictly increasing integers in [min, max]; absent =
/// `fallback` (none: the key is required).
[[nodiscard]] expected<std::vector<int32_t>> read_increasing_ints(const context& ctx, const toml::table& table,
                                                                  const scope& where, std::string_view key,
                                                                  std::optional<std::vector<int32_t>> fallback,
                                                                  int64_t min, int64_t max, size_t max_count) {
  TROUPE_ASSERT(min <= max && max <= int32_max);
  const toml::node* node = table.get(key);
  if (node == nullptr) {
    if (fallback) return *fallback;
    return malformed(ctx, where.line, where.label, "missing required key " + in_quotes(key));
  }
  const toml::array* array = node->as_array();
  if (array == nullptr) {
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " must be an array of integers, got " +
                         std::string(type_name(node->type())));
  }
  if (array->size() > max_count) {
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " has " + std::to_string(array->size()) + " elements, at most " +
                         std::to_string(max_count) + " allowed");
  }
  std::vector<int32_t> values;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    const std::string what = "key " + in_quotes(key) + " element " + std::to_string(i + 1);
    const auto* value = element.as_integer();
    if (value == nullptr) {
      return malformed(ctx, line_of(element), where.label,
                       what + " must be an integer, got " + type_name(element.type()));
    }
    const int64_t number = value->get();
    if (number < min || number > max) {
      return malformed(ctx, line_of(element), where.label,
                       what + " must be in " + std::to_string(min) + ".." + std::to_string(max) + ", got " +
                           std::to_string(number));
    }
    if (!values.empty() && number <= values.back()) {
      return malformed(ctx, line_of(element), where.label,
                       what + " must be greater than the one before (strictly increasing), got " +
                           std::to_string(number) + " after " + std::to_string(values.back()));
    }
    values.push_back(static_cast<int32_t>(number));
  }
  TROUPE_ASSERT(values.size() == array->size());
  return values;
}

/// heartbeat_interval_ms, heartbeat_timeout_ms and rejoin_interval_ms into `balancer`; a timeout
/// must exceed the interval (else a healthy engine is lost between two pings).
[[nodiscard]] expected<void> read_heartbeat(const context& ctx, const toml::table& table, const scope& where,
                                            load_balancer_spec& balancer) {
  auto interval = read_int(ctx, table, where, "heartbeat_interval_ms", balancer.heartbeat_interval_ms, 1, 60000);
  if (!interval) return tl::unexpected(interval.error());
  auto timeout = read_int(ctx, table, where, "heartbeat_timeout_ms", balancer.heartbeat_timeout_ms, 1, 600000);
  if (!timeout) return tl::unexpected(timeout.error());
  if (*timeout <= *interval) {
    const toml::node* key = table.get("heartbeat_timeout_ms");
    return malformed(ctx, key ? line_of(*key) : where.line, where.label,
                     "key 'heartbeat_timeout_ms' must exceed heartbeat_interval_ms (" + std::to_string(*interval) +
                         "), got " + std::to_string(*timeout));
  }
  auto rejoin = read_int(ctx, table, where, "rejoin_interval_ms", balancer.rejoin_interval_ms, 0, 600000);
  if (!rejoin) return tl::unexpected(rejoin.error());
  balancer.heartbeat_interval_ms = *interval;
  balancer.heartbeat_timeout_ms = *timeout;
  balancer.rejoin_interval_ms = *rejoin;
  return {};
}

/// `router`: one of balance::router_names(); absent = `fallback`.
[[nodiscard]] expected<std::string> read_router(const context& ctx, const toml::table& table, const scope& where,
                                                const std::string& fallback) {
  auto name = read_string(ctx, table, where, "router", fallback);
  if (!name) return name;
  if (auto r = balance::make_router({*name, 0}); !r)
    return malformed(ctx, line_of_key(table, "router"), where.label, "key 'router': " + r.error().message);
  return name;
}

[[nodiscard]] expected<std::vector<std::string>> read_strings(const context& ctx, const toml::table& table,
                                                              const scope& where, std::string_view key,
                                                              size_t max_count, size_t max_bytes);

/// `node`, or `nodes` (1 to balance::balancers_max distinct known nodes), into `balancer`.
[[nodiscard]] expected<void> read_balancer_nodes(const context& ctx, const toml::table& table, const scope& where,
                                                 const std::vector<node_spec>& nodes, load_balancer_spec& balancer) {
  if (table.get("nodes") == nullptr) {
    auto node = read_node_reference(ctx, table, where, nodes);
    if (!node) return tl::unexpected(node.error());
    balancer.node = *node;
    return {};
  }
  if (table.get("node") != nullptr)
    return malformed(ctx, line_of_key(table, "nodes"), where.label, "give key 'node' or key 'nodes', not both");
  auto names = read_strings(ctx, table, where, "nodes", balance::balancers_max, node_name_bytes_max);
  if (!names) return tl::unexpected(names.error());
  for (const std::string& name : *names)
    if (std::none_of(nodes.begin(), nodes.end(), [&](const node_spec& n) { return n.name == name; }))
      return malformed(ctx, line_of_key(table, "nodes"), where.label, "key 'nodes' names unknown node " + in_quotes(name));
  balancer.node = names->front();
  balancer.nodes = std::move(*names);
  return {};
}

/// With several balancer nodes, none runs an engine or a host tier (another balancer reaches a
/// node's engines through its node actor, which a balancer's node does not publish).
[[nodiscard]] expected<void> check_balancer_nodes(const context& ctx, const toml::table& root, const topology& t) {
  if (t.load_balancer.nodes.size() < 2) return {};
  const toml::node* table = root.get("load_balancer");
  const toml::source_index line = table ? line_of_key(*table->as_table(), "nodes") : 0;
  for (const std::string& name : t.load_balancer.nodes) {
    if (const engine_spec* e = t.first_engine_on(name))
      return malformed(ctx, line, "load_balancer",
                       "node " + in_quotes(name) + " runs a balancer and engine " + in_quotes(e->name) +
                           ": with several balancer nodes, engines run on other nodes");
    if (t.find_node(name)->host_tier_blocks > 0)
      return malformed(ctx, line, "load_balancer",
                       "node " + in_quotes(name) + " runs a balancer and a host tier: with several balancer nodes, "
                       "tiers run on the engines' nodes");
  }
  return {};
}

[[nodiscard]] expected<load_balancer_spec> read_load_balancer(const context& ctx,
                                                              const toml::table& root,
                                                              const std::vector<node_spec>& nodes) {
  auto table = read_table(ctx, root, "load_balancer");
  if (!table) return tl::unexpected(table.error());
  if (*table == nullptr) {
    return malformed(ctx, 0, "", "missing [load_balancer] table: say which node runs it");
  }
  const scope where{"load_balancer", line_of(**table)};
  if (auto ok = check_known_keys(ctx, **table, where,
                                 {"node", "nodes", "max_waiting", "prefill_tiers", "router", "prefix_weight", "rate_limit_per_s", "rate_limit_burst", "chat_template", "report_interval_ms",
                                  "connect_timeout_ms", "heartbeat_interval_ms", "heartbeat_timeout_ms", "rejoin_interval_ms"});
      !ok) {
    return tl::unexpected(ok.error());
  }
  load_balancer_spec balancer;
  if (auto ok = read_balancer_nodes(ctx, **table, where, nodes, balancer); !ok) return tl::unexpected(ok.error());
  auto max_waiting = read_int(ctx, **table, where, "max_waiting", balancer.max_waiting, 1);
  if (!max_waiting) return tl::unexpected(max_waiting.error());
  balancer.max_waiting = *max_waiting;
  auto bounds = read_increasing_ints(ctx, **table, where, "prefill_tiers", balancer.prefill_tier_bounds, 1, int32_max,
                                     num_prefill_tier_bounds_max);
  if (!bounds) return tl::unexpected(bounds.error());
  balancer.prefill_tier_bounds = std::move(*bounds);
  auto router = read_router(ctx, **table, where, balancer.router);
  if (!router) return tl::unexpected(router.error());
  balancer.router = std::move(*router);
  auto prefix_weight =
      read_number(ctx, **table, where, "prefix_weight", balancer.prefix_weight, 0, balance::prefix_weight_max);
  if (!prefix_weight) return tl::unexpected(prefix_weight.error());
  balancer.prefix_weight = *prefix_weight;
  auto rate = read_int(ctx, **table, where, "rate_limit_per_s", balancer.rate_limit_per_s, 0, 1000000000);
  if (!rate) return tl::unexpected(rate.error());
  balancer.rate_limit_per_s = *rate;
  auto burst = read_int(ctx, **table, where, "rate_limit_burst", balancer.rate_limit_burst, 1, 1000000);
  if (!burst) return tl::unexpected(burst.error());
  balancer.rate_limit_burst = *burst;
  auto chat = read_string(ctx, **table, where, "chat_template", balancer.chat_template);
  if (!chat) return tl::unexpected(chat.error());
  if (*chat != "auto" && !parse_chat_template(*chat))
    return malformed(ctx, line_of_key(**table, "chat_template"), where.label,
                     "key 'chat_template' must be one of auto, bare, plain, chatml, llama2, llama3; got " + in_quotes(*chat));
  balancer.chat_template = *chat;
  auto report_interval =
      read_int(ctx, **table, where, "report_interval_ms", balancer.report_interval_ms, 1, 60000);
  if (!report_interval) return tl::unexpected(report_interval.error());
  balancer.report_interval_ms = *report_interval;
  auto connect_timeout =
      read_int(ctx, **table, where, "connect_timeout_ms", balancer.connect_timeout_ms, 1, 600000);
  if (!connect_timeout) return tl::unexpected(connect_timeout.error());
  balancer.connect_timeout_ms = *connect_timeout;
  auto heartbeat = read_heartbeat(ctx, **table, where, balancer);
  if (!heartbeat) return tl::unexpected(heartbeat.error());
  return balancer;
}

[[nodiscard]] expected<kv_transfer_kind> read_kv_transfer(const context& ctx,
                                                          const toml::table& table,
                                                          const scope& where) {
  auto kind = read_string(ctx, table, where, "kv_transfer",
                          std::string(to_string(topology{}.kv_transfer)));
  if (!kind) return tl::unexpected(kind.error());
  for (kv_transfer_kind k : {kv_transfer_kind::caf, kv_transfer_kind::ucx}) {
    if (*kind == to_string(k)) return k;
  }
  return malformed(ctx, line_of_key(table, "kv_transfer"), where.label,
                   "key 'kv_transfer' must be one of caf, ucx; got " + in_quotes(*kind));
}

/// The optional [cluster] table: its name and how KV moves between engines.
[[nodiscard]] expected<void> read_cluster(const context& ctx, const toml::table& root,
                                          topology& result) {
  auto table = read_table(ctx, root, "cluster");
  if (!table) return tl::unexpected(table.error());
  if (*table == nullptr) return {};
  const scope where{"cluster", line_of(**table)};
  if (auto ok = check_known_keys(ctx, **table, where, {"name", "kv_transfer", "drain_grace_ms"}); !ok) {
    return tl::unexpected(ok.error());
  }
  auto name = read_string(ctx, **table, where, "name", result.cluster_name);
  if (!name) return tl::unexpected(name.error());
  result.cluster_name = *name;
  auto kv_transfer = read_kv_transfer(ctx, **table, where);
  if (!kv_transfer) return tl::unexpected(kv_transfer.error());
  result.kv_transfer = *kv_transfer;
  auto grace = read_int(ctx, **table, where, "drain_grace_ms", result.drain_grace_ms, 0, 3600000);
  if (!grace) return tl::unexpected(grace.error());
  result.drain_grace_ms = *grace;
  return {};
}

/// The optional [tls] table: the cluster CA every node and client certificate is checked against.
[[nodiscard]] expected<void> read_tls(const context& ctx, const toml::table& root, topology& result) {
  auto table = read_table(ctx, root, "tls");
  if (!table) return tl::unexpected(table.error());
  if (*table == nullptr) return {};
  const scope where{"tls", line_of(**table)};
  if (auto ok = check_known_keys(ctx, **table, where, {"ca"}); !ok) return tl::unexpected(ok.error());
  auto ca = read_file_path(ctx, **table, where, "ca");
  if (!ca) return tl::unexpected(ca.error());
  result.tls_ca = *ca;
  return {};
}

/// The optional [limits] table: what a peer of the CAF port can make a node hold.
[[nodiscard]] expected<void> read_limits(const context& ctx, const toml::table& root, limits_spec& limits) {
  auto table = read_table(ctx, root, "limits");
  if (!table) return tl::unexpected(table.error());
  if (*table == nullptr) return {};
  const scope where{"limits", line_of(**table)};
  if (auto ok = check_known_keys(ctx, **table, where,
                                 {"max_message_mib", "max_pending_per_client", "idle_timeout_ms",
                                  "tls_handshake_timeout_ms", "max_connections", "max_connections_per_host"});
      !ok) {
    return tl::unexpected(ok.error());
  }
  auto message = read_int(ctx, **table, where, "max_message_mib", limits.max_message_mib, 1, 4095);
  if (!message) return tl::unexpected(message.error());
  limits.max_message_mib = *message;
  auto pending = read_int(ctx, **table, where, "max_pending_per_client", limits.max_pending_per_client, 1);
  if (!pending) return tl::unexpected(pending.error());
  limits.max_pending_per_client = *pending;
  auto idle = read_int(ctx, **table, where, "idle_timeout_ms", limits.idle_timeout_ms, 0, 3600000);
  if (!idle) return tl::unexpected(idle.error());
  if (*idle > 0 && *idle < 1000) {
    return malformed(ctx, line_of_key(**table, "idle_timeout_ms"), where.label,
                     "key 'idle_timeout_ms' must be 0 (never) or at least 1000, got " + std::to_string(*idle));
  }
  limits.idle_timeout_ms = *idle;
  auto handshake =
      read_int(ctx, **table, where, "tls_handshake_timeout_ms", limits.tls_handshake_timeout_ms, 100, 600000);
  if (!handshake) return tl::unexpected(handshake.error());
  limits.tls_handshake_timeout_ms = *handshake;
  auto connections = read_int(ctx, **table, where, "max_connections", limits.max_connections, 1);
  if (!connections) return tl::unexpected(connections.error());
  limits.max_connections = *connections;
  auto per_host = read_int(ctx, **table, where, "max_connections_per_host", limits.max_connections_per_address, 1);
  if (!per_host) return tl::unexpected(per_host.error());
  limits.max_connections_per_address = *per_host;
  return {};
}

/// The optional [gateway] table: what one client may make the gateways hold. A key left out
/// keeps the gateway's default.
[[nodiscard]] expected<void> read_gateway(const context& ctx, const toml::table& root, gateway_spec& gateway) {
  auto table = read_table(ctx, root, "gateway");
  if (!table) return tl::unexpected(table.error());
  if (*table == nullptr) return {};
  const scope where{"gateway", line_of(**table)};
  if (auto ok = check_known_keys(ctx, **table, where,
                                 {"max_connections", "max_connections_per_address", "max_in_flight_per_connection",
                                  "output_mib", "idle_timeout_ms", "header_timeout_ms", "body_timeout_ms",
                                  "write_timeout_ms", "priority_min"});
      !ok) {
    return tl::unexpected(ok.error());
  }
  struct bounded_key {
    std::string_view name;
    std::optional<int32_t>& field;
    int64_t min, max;
  };
  const bounded_key keys[] = {
      {"max_connections", gateway.max_connections, 1, 1 << 20},
      {"max_connections_per_address", gateway.max_connections_per_address, 1, 1 << 20},
      {"max_in_flight_per_connection", gateway.max_in_flight_per_connection, 1, 1 << 20},
      {"output_mib", gateway.output_mib, 1, 4096},
      {"idle_timeout_ms", gateway.idle_timeout_ms, 1, 86400000},
      {"header_timeout_ms", gateway.header_timeout_ms, 1, 3600000},
      {"body_timeout_ms", gateway.body_timeout_ms, 1, 3600000},
      {"write_timeout_ms", gateway.write_timeout_ms, 1, 3600000},
      {"priority_min", gateway.priority_min, std::numeric_limits<int32_t>::min(), int32_max},
  };
  for (const bounded_key& k : keys) {
    if (!(*table)->contains(k.name)) continue;
    auto value = read_int(ctx, **table, where, k.name, std::nullopt, k.min, k.max);
    if (!value) return tl::unexpected(value.error());
    k.field = *value;
  }
  return {};
}

/// Letters, digits, '.', '-' and ':' (IPv6): what a host name or an IP address is made of.
[[nodiscard]] bool is_host_text(std::string_view address) {
  return std::all_of(address.begin(), address.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == ':';
  });
}

/// [http]'s keys of access: files (each optional, existing, relative to the topology file; the
/// certificate and its key together) and the CORS origins (checked where the gateway starts).
[[nodiscard]] expected<void> read_http_access(const context& ctx, const toml::table& table, const scope& where,
                                              http_spec& http) {
  for (auto [key, field] : {std::pair{"api_keys_file", &http_spec::api_keys_file},
                            std::pair{"ssl_certfile", &http_spec::ssl_certfile},
                            std::pair{"ssl_keyfile", &http_spec::ssl_keyfile}}) {
    if (table.get(key) == nullptr) continue;
    auto path = read_file_path(ctx, table, where, key);
    if (!path) return tl::unexpected(path.error());
    http.*field = *path;
  }
  if (http.ssl_certfile.empty() != http.ssl_keyfile.empty())
    return malformed(ctx, where.line, where.label, "keys 'ssl_certfile' and 'ssl_keyfile' go together");
  auto origins = read_string(ctx, table, where, "allowed_origins", std::string());
  if (!origins) return tl::unexpected(origins.error());
  http.allowed_origins = *origins;
  return {};
}

/// `key`: an optional array of at most `max_count` distinct non-empty strings of at most
/// `max_bytes` bytes each; absent = none.
[[nodiscard]] expected<std::vector<std::string>> read_strings(const context& ctx, const toml::table& table,
                                                              const scope& where, std::string_view key,
                                                              size_t max_count, size_t max_bytes) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return std::vector<std::string>{};
  const toml::array* array = node->as_array();
  if (array == nullptr || array->empty() || array->size() > max_count)
    return malformed(ctx, line_of(*node), where.label,
                     "key " + in_quotes(key) + " must be an array of 1 to " + std::to_string(max_count) + " strings");
  std::vector<std::string> values;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    const auto* value = element.as_string();
    const std::string what = "key " + in_quotes(key) + " element " + std::to_string(i + 1);
    if (value == nullptr || value->get().empty() || value->get().size() > max_bytes)
      return malformed(ctx, line_of(element), where.label,
                       what + " must be a string of 1 to " + std::to_string(max_bytes) + " bytes");
    if (std::find(values.begin(), values.end(), value->get()) != values.end())
      return malformed(ctx, line_of(element), where.label, what + " repeats " + in_quotes(value->get()));
    values.push_back(value->get());
  }
  return values;
}

/// The optional [http] table: where the balancer's node serves the HTTP API. Its address must
/// not be one the balancer's node already listens on.
[[nodiscard]] expected<void> read_http(const context& ctx, const toml::table& root, topology& result) {
  auto table = read_table(ctx, root, "http");
  if (!table) return tl::unexpected(table.error());
  if (*table == nullptr) return {};
  const scope where{"http", line_of(**table)};
  if (auto ok = check_known_keys(ctx, **table, where,
                                 {"port", "host", "drain_timeout_ms", "served_model_names", "api_keys_file",
                                  "ssl_certfile", "ssl_keyfile", "allowed_origins"});
      !ok)
    return tl::unexpected(ok.error());
  http_spec http;
  auto address = read_string(ctx, **table, where, "host", http.address);
  if (!address) return tl::unexpected(address.error());
  if (!is_host_text(*address))
    return malformed(ctx, line_of_key(**table, "host"), where.label,
                     "key 'host' must be a host name or an IP address, got " + in_quotes(*address));
  http.address = *address;
  auto port = read_int(ctx, **table, where, "port", std::nullopt, 0, port_max);
  if (!port) return tl::unexpected(port.error());
  http.port = static_cast<uint16_t>(*port);
  auto drain = read_int(ctx, **table, where, "drain_timeout_ms", http.drain_timeout_ms, 1, 600000);
  if (!drain) return tl::unexpected(drain.error());
  http.drain_timeout_ms = *drain;
  auto names = read_strings(ctx, **table, where, "served_model_names", served_model_names_max, served_model_name_bytes_max);
  if (!names) return tl::unexpected(names.error());
  http.served_model_names = std::move(*names);
  if (auto ok = read_http_access(ctx, **table, where, http); !ok) return tl::unexpected(ok.error());
  for (const std::string& name : result.load_balancer.all_nodes()) {
    const node_spec* node = result.find_node(name);
    TROUPE_ASSERT(node != nullptr);
    if (http.port != 0 && http.address == node->address && (http.port == node->port || http.port == node->kv_port))
      return malformed(ctx, line_of_key(**table, "port"), where.label,
                       "address " + http.address + ":" + std::to_string(http.port) + " is already used by node " +
                           in_quotes(node->name) + " (its " + (http.port == node->port ? "port" : "kv_port") +
                           "), which runs a load balancer and so the HTTP gateway");
  }
  result.http = std::move(http);
  return {};
}

/// Every [[expert_shard]], after the engines and the load balancer: known engine and node, and a
/// node that is the engine's own or a shard host. A shard host runs no engine and not the
/// balancer, so that it waits on nobody at start-up while the engines' nodes wait on it.
[[nodiscard]] expected<std::vector<expert_shard_spec>> read_expert_shards(const context& ctx, const toml::table& root,
                                                                          const topology& t) {
  auto tables = read_tables(ctx, root, "expert_shard");
  if (!tables) return tl::unexpected(tables.error());
  auto engine_tables = read_tables(ctx, root, "engine");  // read before: no error here
  TROUPE_ASSERT(engine_tables && engine_tables->size() == t.engines.size());
  std::vector<expert_shard_spec> shards;
  for (size_t i = 0; i < tables->size(); ++i) {
    const toml::table& table = *(*tables)[i];
    const scope where{"expert_shard #" + std::to_string(i + 1), line_of(table)};
    if (auto ok = check_known_keys(ctx, table, where, {"engine", "node", "experts"}); !ok)
      return tl::unexpected(ok.error());
    expert_shard_spec shard;
    auto engine = read_string(ctx, table, where, "engine");
    if (!engine) return tl::unexpected(engine.error());
    const engine_spec* e = t.find_engine(*engine);
    if (e == nullptr)
      return malformed(ctx, line_of_key(table, "engine"), where.label,
                       "key 'engine' names unknown engine " + in_quotes(*engine));
    shard.engine = *engine;
    auto node = read_node_reference(ctx, table, where, t.nodes);
    if (!node) return tl::unexpected(node.error());
    shard.node = *node;
    if (shard.node != e->node) {
      const engine_spec* runs_engine = t.first_engine_on(shard.node);
      if (runs_engine != nullptr || t.load_balancer.runs_on(shard.node))
        return malformed(ctx, line_of_key(table, "node"), where.label,
                         "node " + in_quotes(shard.node) + " is not engine " + in_quotes(e->name) + "'s node (" +
                             in_quotes(e->node) + ") and runs " +
                             (runs_engine != nullptr ? "engine " + in_quotes(runs_engine->name)
                                                              : std::string("the load balancer")) +
                             ": shards of another node's engine need a shard host, a node with neither");
    }
    auto experts = read_increasing_ints(ctx, table, where, "experts", std::nullopt, 0, model::moe_experts_max - 1,
                                        static_cast<size_t>(model::moe_experts_max));
    if (!experts) return tl::unexpected(experts.error());
    if (experts->empty())
      return malformed(ctx, line_of_key(table, "experts"), where.label, "key 'experts' must name at least one expert");
    shard.experts = std::move(*experts);
    shards.push_back(std::move(shard));
  }
  for (size_t i = 0; i < t.engines.size(); ++i) {
    const engine_spec& e = t.engines[i];
    if (e.expert_window_steps == 0) continue;
    if (std::none_of(shards.begin(), shards.end(), [&](const expert_shard_spec& s) { return s.engine == e.name; }))
      return malformed(ctx, line_of_key(*(*engine_tables)[i], "expert_window_steps"), "engine " + in_quotes(e.name),
                       "key 'expert_window_steps' moves experts between expert shards: the engine has no "
                       "[[expert_shard]] entries");
  }
  return shards;
}

[[nodiscard]] expected<topology> read_topology(const context& ctx, const toml::table& root) {
  if (auto ok = check_known_keys(ctx, root, scope{}, {"cluster", "tls", "limits", "http", "node", "load_balancer", "engine",
                                                         "expert_shard", "gateway"});
      !ok) {
    return tl::unexpected(ok.error());
  }
  topology result;
  if (auto ok = read_cluster(ctx, root, result); !ok) return tl::unexpected(ok.error());
  if (auto ok = read_tls(ctx, root, result); !ok) return tl::unexpected(ok.error());
  if (auto ok = read_limits(ctx, root, result.limits); !ok) return tl::unexpected(ok.error());
  if (auto ok = read_gateway(ctx, root, result.gateway); !ok) return tl::unexpected(ok.error());
  auto nodes = read_nodes(ctx, root, !result.tls_ca.empty());
  if (!nodes) return tl::unexpected(nodes.error());
  result.nodes = std::move(*nodes);
  auto balancer = read_load_balancer(ctx, root, result.nodes);
  if (!balancer) return tl::unexpected(balancer.error());
  result.load_balancer = *balancer;
  auto engines = read_engines(ctx, root, result.nodes);
  if (!engines) return tl::unexpected(engines.error());
  result.engines = std::move(*engines);
  TROUPE_ASSERT(result.find_node(result.load_balancer.node) != nullptr);
  if (auto ok = check_balancer_nodes(ctx, root, result); !ok) return tl::unexpected(ok.error());
  auto shards = read_expert_shards(ctx, root, result);
  if (!shards) return tl::unexpected(shards.error());
  result.expert_shards = std::move(*shards);
  if (auto ok = read_http(ctx, root, result); !ok) return tl::unexpected(ok.error());
  return result;
}

}  // namespace

bool is_loopback(std::string_view address) {
  if (address == "localhost") return true;
  const std::string text(address);  // inet_pton reads a C string, the whole of it
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) != 1) return false;
  return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
}

expected<port_security> check_port_security(const topology& t, bool insecure) {
  if (!t.tls_ca.empty()) return port_security::tls;
  auto elsewhere = std::find_if(t.nodes.begin(), t.nodes.end(), [](const node_spec& n) { return !is_loopback(n.address); });
  if (elsewhere == t.nodes.end()) return port_security::plaintext_loopback;
  if (insecure) return port_security::plaintext_insecure;
  return fail(errc::invalid_argument,
              "node " + in_quotes(elsewhere->name) + " listens on " + elsewhere->address +
                  ", not a loopback address, and the topology has no [tls] table: anyone who reaches the port "
                  "could join the cluster. Add [tls] with a certificate per node (troupe certs makes them; "
                  "docs/security.md), or pass --insecure on a network you trust");
}

std::string security_warning(port_security security) {
  switch (security) {
    case port_security::tls: return "";
    case port_security::plaintext_loopback:
      return "no [tls] in the topology: the CAF port is unauthenticated plaintext (allowed because every node "
             "is on a loopback address; any local process can reach it)";
    case port_security::plaintext_insecure:
      return "INSECURE (--insecure): the CAF port is unauthenticated plaintext on a non-loopback address; anyone "
             "who reaches it can submit requests, read outputs, and kill or impersonate cluster actors";
  }
  return "";
}

expected<topology> parse_topology(std::string_view text, const std::string& source_name,
                                  const std::string& base_dir) {
  const context ctx{source_name, base_dir};
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    // The one place an exception is caught: toml++ reports syntax errors by throwing.
    const toml::source_position begin = e.source().begin;
    return fail(errc::malformed_file, source_name + ":" + std::to_string(begin.line) + ":" +
                                          std::to_string(begin.column) +
                                          ": TOML syntax error: " + std::string(e.description()));
  }
  return read_topology(ctx, root);
}

expected<topology> load_topology(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    return fail(errc::io_error, "cannot read topology file " + in_quotes(path) + ": no such file");
  }
  if (!fs::is_regular_file(status)) {
    return fail(errc::io_error,
                "cannot read topology file " + in_quotes(path) + ": not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) {
    return fail(errc::io_error, "cannot read topology file " + in_quotes(path));
  }
  const fs::path base_dir = fs::absolute(fs::path(path), ec).parent_path();
  if (ec) {
    return fail(errc::io_error,
                "cannot resolve the directory of " + in_quotes(path) + ": " + ec.message());
  }
  return parse_topology(text, path, base_dir.string());
}

}  // namespace troupe::topology
