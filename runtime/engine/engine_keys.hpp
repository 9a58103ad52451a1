#pragma once

/// The engine keys of configuration files, defined once: each key's name, where the simulator's
/// file holds it, its type, its range and how its value goes into an engine_config. Both TOML
/// readers walk this table (topology/topology.cpp for `[[engine]]`, sim/sim_topology.cpp for
/// `[engine]` and `[speculation]`), so that they accept and reject the same values; each words
/// its errors in its own file's style. A key absent from a file keeps engine_config's default.

#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/engine/engine_config.hpp"

namespace troupe::engine {

/// How a key's value is written: a whole number, any number, or text.
enum class key_type { integer, number, text };

struct engine_key {
  std::string_view name;      ///< as a topology file's `[[engine]]` table spells it
  std::string_view section;   ///< the simulator's table that holds it ("engine", "speculation")
  /// Its name in that table; empty: the simulator does not read it (kv_blocks follows from
  /// `[hardware] kv_memory_gib`; the n-gram and grammar bounds are not modelled).
  std::string_view sim_name;
  key_type type;
  double min = 0;  ///< integer and number keys: the accepted range, both ends included
  double max = 0;
  /// Writes an in-range number into `config`; an error's message is what follows the key's
  /// name in a reader's message (e.g. " must be 0 (off) or at least 0.000001").
  expected<void> (*set_number)(engine_config& config, double value) = nullptr;
  /// Writes a text value into `config`; an error as above (e.g. ": unknown drafter 'x' ...").
  expected<void> (*set_text)(engine_config& config, const std::string& value) = nullptr;
  std::string_view doc;  ///< one line: what the key sets
};

/// Every engine key, in the order the readers apply them (ngram_min before ngram_max).
[[nodiscard]] const std::vector<engine_key>& engine_keys();

/// The key named `name` in topology files; nullptr if none.
[[nodiscard]] const engine_key* find_engine_key(std::string_view name);

/// The key the simulator's table `section` holds as `sim_name`; nullptr if none.
[[nodiscard]] const engine_key* find_sim_engine_key(std::string_view section, std::string_view sim_name);

}  // namespace troupe::engine
