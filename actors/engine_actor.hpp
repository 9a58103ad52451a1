#pragma once

/// The engine actor: one replica's scheduler. It is a dispatcher over an engine::engine_policy
/// (runtime/engine/engine_policy.hpp), which owns the engine_core and every decision below: each
/// handler turns a message into a policy call and performs the effects it returns, in order. The
/// actor keeps only actor handles (request actors by request id, decode engines, the executor,
/// the balancer) and its monitors; KV hand-offs over UCX go through actors/kv_transfers.hpp.
/// Before the policy, engine::intake (runtime/engine/intake.hpp) drops a request that arrives
/// twice and holds one while its grammar compiles (actors/grammar_actor.hpp). The executor
/// gets at most two plans in flight — step N+1 is planned and sent while N runs, so scheduling
/// hides behind execution — and each new token is streamed to its request actor.
///
/// Disaggregation: a prefill engine takes `submit_prefill`, computes the prompt's KV (all but
/// the last token), tells the request actor (`prefilled`) and sends the request with its KV
/// to the decode engine (`kv_handoff`, Cap'n Proto payload inline or over UCX), which
/// continues it like any request (engine_core::add_prefilled). Given `report_to`, the engine
/// sends its balancer `load_report`s, at most one per interval and only after a change
/// (an idle engine sets no timer); a cluster with several balancer nodes gets each report at
/// every balancer that asked (up to four; one that goes down is dropped).
///
/// Host tier: given `host_tier`, blocks the pool evicts go to it (`tier_put`, answers not
/// awaited) and a pool miss asks it — or the tier of another node the request's placement
/// names (engine::request::cache_tier, an index of the balancer's list in report_to; an index
/// it does not know is ignored) — (`tier_fetch`, a request with a timeout whose answer is a
/// message like any other): the engine never blocks on the tier (actors/system/sync_guard.hpp).
///
/// Failure: if the executor fails (it replies with an error or dies), every unfinished request
/// gets `rejected{internal}` (its KV is gone), the core is rebuilt empty and a new executor is
/// spawned: the engine stays up for new work.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include <caf/fwd.hpp>
#include <caf/timespan.hpp>

#include "actors/system/cluster_messages.hpp"
#include "actors/executor_actor.hpp"
#include "actors/system/protocols.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "runtime/engine/engine_core.hpp"
#include "actors/kv_sender.hpp"

namespace troupe::actors {

class network_model;  // actors/system/network_model.hpp

/// Makes the step executor of an engine (the simulator plugs its cost-model executor in here).
using executor_factory = std::function<executor_actor(caf::actor_system& sys, const engine_actor& engine)>;

struct engine_options {
  std::shared_ptr<const model::checkpoint> checkpoint;  ///< the model; may be null with make_executor
  /// The draft model of a draft_model drafter (config.speculation), checked against the model.
  std::shared_ptr<const model::checkpoint> draft_checkpoint;
  model::model_config model;        ///< the model's shape when there is no checkpoint (simulation)
  executor_factory make_executor;   ///< empty: the real step executor on `checkpoint`
  /// Check the engine core's invariants (block conservation, refcounts, queues) after every
  /// Nth completed step; 0 = never (production), 1 = every step (the simulator's default).
  int32_t check_invariants_every = 0;
  /// The vocabulary's end-of-generation ids (tokenizer::end_ids()); llama2.c's BOS and EOS.
  std::vector<int32_t> end_ids{1, 2};
  engine::engine_config config;     ///< max_steps_in_flight is forced to 2
  int32_t max_waiting = 1024;       ///< queued requests at most; beyond: rejected{overloaded}
  int32_t executor_threads = 1;     ///< kernel threads of the step executor
  std::string step_log;             ///< the executor logs every step here (calibration); "" = off
  bool detached_executor = true;    ///< false under the deterministic test scheduler
  /// Disaggregation: with a KV transport (UCX, wired in by topology/launch), prefilled KV is
  /// sent over it (tags start at `kv_tag_base`, which must be unique per engine in the cluster)
  /// and received from it; without one, KV travels inside the CAF handoff message.
  std::shared_ptr<transport::kv_sender> kv_sender;
  uint64_t kv_tag_base = 0;
  /// The node's host-memory cache tier (issue 14, docs/kv-tiers.md); none: no tier. With one,
  /// cached blocks the pool evicts are demoted to it and a request whose prompt the pool lacks
  /// waits for the tier's blocks (then recomputes what is missing) as long as its fetch pays
  /// (engine_config::tier_fetch_timeout_ns; engine_core::plan_fetch).
  cache_tier_actor host_tier;
  /// Whether other nodes of the cluster have cache tiers: then, with or without its own, the
  /// engine fetches a request's prefix from the tier its placement names (the balancer's list,
  /// msg::report_to::cache_tiers; engine::request::cache_tier), waited for as above.
  bool cluster_tiers = false;
  /// Grammar-constrained decoding: the tokens' bytes (grammar::vocabulary_of the model's
  /// tokenizer). Without it, a request with a grammar is rejected.
  std::shared_ptr<const grammar::vocabulary> vocabulary;
  /// The simulator's network (actors/system/network_model.hpp): what this engine sends to other nodes
  /// (tokens, hand-offs and forwards with their KV, load reports) arrives when it says. Null in
  /// production.
  std::shared_ptr<network_model> network;
  /// An MoE checkpoint's experts on shard actors (executor_settings::experts; the executor must
  /// be detached), shared by the engine's successive executors; null: in-process shards. With
  /// `expert_reassignment`, the executor moves them when a window of steps proposes a better
  /// placement (docs/moe.md), and the engine reports the windows' moe_lb and the moves.
  std::shared_ptr<expert_shards> experts;
  std::optional<moe::reassignment_options> expert_reassignment;
};

/// The settings of the real step executor `options` describe (what a wrapping executor, such
/// as a test's failing one, spawns inside).
[[nodiscard]] executor_settings executor_settings_of(const engine_options& options);

/// Spawns an engine and its executor. Fails (as a value) if the options are invalid or the
/// step_log file cannot be opened for appending (io_error naming it).
[[nodiscard]] expected<engine_actor> spawn_engine(caf::actor_system& sys, const engine_options& options);

/// Blocking query of an engine's counters (tests, benchmarks, `troupe serve` on exit, the HTTP
/// gateway's /metrics), waiting `timeout` at most (an error naming it after).
[[nodiscard]] expected<msg::engine_report> query_engine(caf::actor_system& sys, const engine_actor& engine,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// The engine's current executor (tests send it commands when they plugged in their own).
[[nodiscard]] expected<executor_actor> query_executor(caf::actor_system& sys, const engine_actor& engine);

}  // namespace troupe::actors
