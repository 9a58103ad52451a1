#pragma once

/// The cost-model step executor: the same protocol as the real executor (exec_plan ->
/// exec_result), but each result arrives after virtual time = the cost model's prediction for
/// the plan. Plans are served one after another (a step starts when the previous one ended).
/// A real executor's KV pool is faulted in as it is first written (runtime/common/page_buffer.hpp):
/// each pool block a plan is the first to name (a chunk's block table, an import) adds its
/// pages (`kv_bytes_per_block` / 4096) at cost_params::first_touch_page_ns. An executor started
/// after a crash has a fresh pool again.
/// Tokens are synthetic (made up; requests then end by length) or real (the bundled model
/// really runs, instantly in virtual time).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/system/protocols.hpp"

#include "runtime/cost/cost_model.hpp"
#include "runtime/cost/roofline.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/plan/kv_dtype.hpp"
#include "runtime/spec/spec_config.hpp"
#include "sim/event_log.hpp"
#include "sim/moe_traffic.hpp"
#include "sim/records.hpp"

namespace troupe::sim {

/// The price of the blocks a step moves between the pool and the host tier (demotions read
/// out, promoted blocks written): `latency_ns` once per step that moves any, plus their bytes
/// over the bandwidth. Zero bytes per block: no tier, nothing priced.
struct tier_transfer_cost {
  double bytes_per_block = 0;
  double bandwidth_gb_s = 1;  ///< 10^9 bytes/s = bytes per ns
  int64_t latency_ns = 0;
  int32_t n_layers = 1;  ///< the model's
  /// As troupe's executor does (engine_config::copy_stream_min_bytes): a step whose moves take
  /// at least this many bytes runs them on its copy stream, layer by layer beside the forward
  /// pass, and takes max(compute, copies) + min / n_layers; a step moving fewer bytes (or any,
  /// with -1) adds its copies to its compute.
  int64_t stream_min_bytes = -1;

  [[nodiscard]] int64_t price_ns(int64_t num_blocks) const;
  /// How long a step of `compute_ns` that moves `num_blocks` blocks takes.
  [[nodiscard]] int64_t step_ns(int64_t compute_ns, int64_t num_blocks) const;
};

/// Seeded executor crashes of one engine (sim_options::executor_crashes), shared by every
/// executor the engine has had: the plan numbered `crash_at[i]` among all they received (from 1)
/// fails instead of running, as if the executor's process had died; the engine starts a new
/// executor and resumes its requests by recompute.
struct executor_faults {
  std::vector<int64_t> crash_at;  ///< sorted
  /// Crashes only before this virtual time (actors::ns_since_epoch): a plan due to crash later
  /// runs (sim_options::faults_until_ns).
  int64_t until_ns = INT64_MAX;
  int64_t num_plans = 0;
  int64_t num_crashes = 0;
  /// Tests only (sim_options::planted_restart_bug): the first plan an executor runs after a crash
  /// hands its first sampled row the next token id instead of its own, a bug only faults show.
  bool planted_restart_bug = false;
};

struct cost_executor_options {
  std::string name;                                      ///< in the event log, e.g. "engine0"
  cost::cost_params cost;
  int32_t vocab_size = 0;
  std::shared_ptr<const model::checkpoint> checkpoint;   ///< set: real tokens
  int32_t num_kv_blocks = 0;                             ///< the KV pool's blocks
  int32_t block_size = 16;
  event_log* log = nullptr;                              ///< borrowed; single-threaded simulation
  int32_t replica = 0;                                   ///< in step records and samples
  int64_t origin_ns = 0;                                 ///< the simulation's start (actors::ns_since_epoch)
  std::vector<step_record>* steps = nullptr;             ///< borrowed: every step is appended
  /// Borrowed: at its first step in each interval of `sample_every_ns`, the executor asks its
  /// engine for its counters (a read-only query) and appends them. Null or 0: no samples.
  std::vector<replica_sample>* samples = nullptr;
  int64_t sample_every_ns = 0;
  std::optional<cost::roofline_model> roofline;          ///< set: prices the steps instead of `cost`
  /// Tests only (sim_options::planted_batch_bug): a step of three or more sampled rows hands
  /// its first two rows each other's samples, a bug that makes tokens depend on the batch.
  bool planted_batch_bug = false;
  tier_transfer_cost tier;
  /// The engines' speculation (the real executor's drafter with real tokens) and how the
  /// simulator models it (sim_topology.hpp, `[speculation]`).
  spec::speculation_config speculation;
  double acceptance = 0.7;
  double draft_token_ns = 0;
  std::shared_ptr<executor_faults> faults;  ///< null: no crashes
  /// [moe]: the replica's MoE layers, shared by every executor it has had (their placement and
  /// windows outlive a crash); each step's MoE time is added to its price. Null: a dense model.
  std::shared_ptr<moe_traffic> moe;
  std::optional<kv::kv_dtype> kv_cache_dtype;  ///< real tokens: the KV pool's type (engine_config's)
  double kv_bytes_per_block = 0;               ///< a pool block's keys and values, every layer
};

actors::executor_actor spawn_cost_executor(caf::actor_system& sys, const actors::engine_actor& engine,
                                           cost_executor_options options);

}  // namespace troupe::sim
