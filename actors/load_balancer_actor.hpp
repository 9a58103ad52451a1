#pragma once

/// The load balancer: the routing entry point that clients talk to. For each
/// `submit_completion` (which names its client in the payload) it assigns an id and a seed (when
/// the client gave none) and spawns the request actor on its own node, answering the client with
/// that actor. A request that names no client (no `reply_to` and no sender) is refused with a
/// log line before anything is spawned. The request actor
/// tokenizes the prompt and asks back where to run it (`place_request`); the answer follows
/// runtime/balance/placement.hpp: prompt-length tiers over prefill engines, and decode engines
/// balanced on request count and KV tokens, chosen among by the configured router (with
/// `prefix_affinity`, the request actor sends its prompt's chain hashes along, and the policy's
/// prefix directory weighs each engine's cached prefix in).
///
/// Its bookkeeping is a balance::balancer_policy (runtime/balance/balancer_policy.hpp); the actor
/// keeps the engine and request-actor handles and spawns the request actors.
///
/// Cache tiers: the engines' nodes' host tiers (balanced_engine::host_tier), each once, are
/// numbered in engine order; every engine gets that list with its report_to. With a router that
/// uses prefixes, each tier of the directory's block size is asked to report its hashes
/// (msg::tier_report_to; taken only from the tier they name) and monitored (a dead tier holds
/// nothing); a placement may name the tier its computing engine is to fetch the prefix from.
///
/// What it knows about engines: the live requests it placed (exact: it monitors every request
/// actor) and each engine's load reports (every `report_interval_ms` at most, so token counts
/// lag by one interval plus a network hop; what it placed since a report is added on top). It
/// monitors every engine: a lost engine (its node died or became unreachable) gets no new work.
///
/// Heartbeat (when `heartbeat_interval_ms` > 0): a frozen node keeps its connection open, so no
/// DOWN message ever comes. The balancer pings every live engine each interval; an engine that
/// neither answers nor reports for `heartbeat_timeout_ms` is lost (runtime/balance/liveness.hpp)
/// exactly as on a DOWN message. Either way every request placed on a lost engine is told
/// (`msg::engine_lost`) and fails with an error naming the engine.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/system/protocols.hpp"
#include "runtime/balance/placement.hpp"
#include "runtime/serve/output_channels.hpp"
#include "runtime/tokenizer/served_template.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::actors {

class network_model;  // actors/system/network_model.hpp

/// One engine the balancer may place requests on.
struct balanced_engine {
  engine_actor actor;
  std::string name = "engine";
  std::string node = "local";
  balance::engine_kind kind = balance::engine_kind::mixed;
  int32_t max_num_seqs = 256;
  int64_t kv_capacity_tokens = 16384;
  int32_t block_size = 16;  ///< its KV pool's (the prefix directory's blocks: balancer_policy.hpp)
  std::string kv_address;  ///< its node's UCX listener (kv_transfer = "ucx")
  uint16_t kv_port = 0;
  /// Where its node publishes its node actor (`node_port` 0: nowhere, e.g. the balancer's own
  /// node), and its place in that node's engine list: once lost, the balancer reaches that
  /// address again every `rejoin_interval_ms` and takes a restarted node's engine into service.
  std::string node_address;
  uint16_t node_port = 0;
  size_t index_on_node = 0;
  /// Its node's host-memory cache tier (none: invalid) and that tier's capacity in blocks (of
  /// `block_size`). Engines of one node share it; the balancer's prefix directory keeps its
  /// hashes and a placement may name it for an engine on another node (balancer_policy.hpp).
  cache_tier_actor host_tier;
  int64_t host_tier_blocks = 0;
  int64_t disk_tier_blocks_max = 0;  ///< at most this many blocks in the disk tier below it (0: none)
};

/// Mixed engines with equal default capacities (one-node setups, the simulator).
[[nodiscard]] std::vector<balanced_engine> mixed_engines(const engine_list& actors);

struct load_balancer_options {
  std::vector<balanced_engine> engines;
  std::shared_ptr<const tokenizer> tok;
  uint64_t seed_base = 0;  ///< request i without a seed gets child_seed(seed_base, i + 1)
  /// The id of each new request. Empty: 0, 1, 2, … (the simulator, whose event log must not
  /// depend on the machine, and tests that assert exact ids). Serving passes
  /// `random_request_id`: an id is what lets an engine's release name a request, so it must be
  /// unguessable.
  std::function<int64_t()> draw_request_id;
  std::vector<int32_t> prefill_tier_bounds = {128, 512, 2048};
  /// The routing policy (runtime/balance/router.hpp), one of balance::router_names(); a
  /// randomised one is seeded with child_seed(seed_base, 0), which no request's seed uses.
  std::string router = "auto";
  double prefix_weight = 0.5;  ///< prefix_affinity's weight (balance::router_options)
  /// Admission by rate (runtime/balance/admission.hpp): on average at most this many requests
  /// per second, bursts of up to `rate_limit_burst`; one more is answered `overloaded`. 0 = off.
  double rate_limit_per_s = 0;
  int32_t rate_limit_burst = 16;
  int32_t report_interval_ms = 20;  ///< engines' load reports at most this often
  int32_t heartbeat_interval_ms = 0;   ///< ping every engine this often; 0 = no heartbeat
  int32_t heartbeat_timeout_ms = 5000;  ///< an engine silent this long is lost (> 0)
  /// How often a lost engine's node (balanced_engine::node_port) is reached for again; a try
  /// gives up after as long. 0 = lost engines stay lost.
  int32_t rejoin_interval_ms = 1000;
  int32_t context_tokens = 0;       ///< bounds text prompts' bytes (request_policy_options::context_tokens)
  served_template chat;     ///< renders chat requests (request_policy_options::chat)
  serve::output_tags tags;  ///< split chat answers (request_policy_options::tags)
  /// Requests in flight per client process other than the balancer's own ([limits]
  /// max_pending_per_client): one more is refused with an error naming the limit.
  int32_t max_pending_per_client = 256;
  /// The simulator's network (actors/system/network_model.hpp), handed to every request actor;
  /// the heartbeat pings only the engines it can reach. Null in production.
  std::shared_ptr<network_model> network;
};

balancer_actor spawn_load_balancer(caf::actor_system& sys, load_balancer_options options);

/// A request id from the kernel's CSPRNG (actors/system/random.hpp), all 64 bits.
[[nodiscard]] int64_t random_request_id();

/// The balancer's client surface: what a node publishes where the balancer runs. It accepts
/// only `submit_completion` and delegates it to `balancer` (the answer, the request actor, goes
/// from the balancer straight to the client, and the balancer sees the client as the sender).
/// Load reports, placement, the heartbeat and control messages sent to it are dropped with a
/// log line at debug level (a flood of them must not fill the log), and a request among them
/// is answered with CAF's `unexpected_message` error. It is a door (actors/system/door.hpp): exits and
/// links are dropped too, so no client can stop it; end it with close_door. docs/security.md
/// says what this surface does not prevent.
[[nodiscard]] balancer_client_actor spawn_balancer_front(caf::actor_system& sys, balancer_actor balancer);

}  // namespace troupe::actors
