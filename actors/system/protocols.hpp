#pragma once

/// The typed interface of every actor kind: each is a `caf::typed_actor` listing exactly the
/// messages it accepts and what it answers, so sending an actor a message it cannot handle is a
/// compile error — not a silent drop on another node. Every spawn, send, request, publish and
/// remote_actor goes through these handles (docs/DESIGN.md, "Typed protocols").
///
/// The messages are in messages/ (plain structs, no CAF) and actors/system/cluster_messages.hpp (those
/// that carry actor handles, which are these typed handles). An interface may list messages
/// the actor sends itself (a timer): CAF's typed actors accept only what their interface names.
///
/// Narrow views: a handle converts implicitly to an interface with fewer messages, so each
/// party holds only what it may send — a request actor holds its client as a
/// `stream_receiver_actor`, a client holds the balancer as a `balancer_client_actor`.

#include <cstdint>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/system/atoms.hpp"
#include "messages/client.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/cache_tier.hpp"
#include "messages/disk_tier.hpp"
#include "messages/executor.hpp"
#include "messages/expert.hpp"
#include "runtime/grammar/constraint.hpp"

namespace troupe::msg {
// Defined in actors/system/cluster_messages.hpp (included at the end): they carry the handles declared here.
struct submit_completion;
struct place_request;
struct placement;
struct submit_prefill;
struct prefilled;
struct kv_handoff;
struct kv_arrived;
struct report_to;
struct tier_report_to;
struct load_report;
struct engine_lost;
struct forwarded;
}  // namespace troupe::msg

namespace troupe::actors {

/// The step executor: runs the plans it is sent, in order, each with the compiled grammars its
/// chunks name by id (in-process: an executor runs beside its engine).
using executor_actor =
    caf::typed_actor<caf::replies_to<engine::exec_plan, grammar::grammar_table>::with<engine::exec_result>>;

/// A cache tier (issue 14; actors/cache_tier_actor.hpp): the longest prefix it holds, store a
/// block (answered with the number of blocks evicted), read one back, fetch the blocks that
/// follow an engine's own prefix, its counters; report its hashes to the balancer's prefix
/// directory (`report_atom` is its own report timer).
using cache_tier_actor = caf::typed_actor<caf::replies_to<msg::tier_lookup>::with<int32_t>,
                                          caf::replies_to<msg::tier_put>::with<int64_t>,
                                          caf::replies_to<msg::tier_get>::with<msg::tier_got>,
                                          caf::replies_to<msg::tier_fetch>::with<msg::tier_blocks>,
                                          caf::replies_to<stats_atom>::with<msg::tier_report>,
                                          caf::reacts_to<msg::tier_report_to>, caf::reacts_to<report_atom>>;

/// The disk tier below a host tier (issue 14; actors/disk_tier_actor.hpp): keep a block the
/// host tier evicted, read back the leading run of the blocks named, its counters, the hashes
/// it started and stopped holding since it was last asked (all it holds: a snapshot, when
/// asked for one or when its log overflowed), which its host tier relays to the balancer.
using disk_tier_actor = caf::typed_actor<caf::replies_to<msg::disk_put>::with<msg::disk_stored>,
                                         caf::replies_to<msg::disk_fetch>::with<msg::disk_blocks>,
                                         caf::replies_to<stats_atom>::with<msg::disk_report>,
                                         caf::replies_to<report_atom, bool>::with<msg::tier_events>>;

/// An expert shard (issue 18; actors/expert_shard_actor.hpp): computes the rows one MoE layer of
/// a step routed to its experts; sends copies of its experts' weights, takes more, drops some
/// (answered with the number it holds).
using expert_shard_actor = caf::typed_actor<caf::replies_to<moe::expert_request>::with<moe::expert_reply>,
                                            caf::replies_to<msg::fetch_experts>::with<msg::expert_set>,
                                            caf::replies_to<msg::expert_set>::with<int32_t>,
                                            caf::replies_to<msg::drop_experts>::with<int32_t>>;

/// What a completion's stream is sent to (the client, as the request actor sees it).
using stream_receiver_actor = caf::typed_actor<caf::reacts_to<msg::completion_chunk>,
                                               caf::reacts_to<msg::completion_end>,
                                               caf::reacts_to<msg::completion_error>>;

/// The client actor (actors/client.hpp): receives one stream; the program that spawned it may
/// cancel the request. `timeout_atom` is its own deadline timer.
using client_actor = stream_receiver_actor::extend<caf::reacts_to<msg::cancel_request>,
                                                   caf::reacts_to<timeout_atom, int64_t>>;

/// The request actor: one request's tokens from its engines, its cancel from its client, the
/// loss of an engine from the balancer.
using request_actor = caf::typed_actor<caf::reacts_to<msg::sampled>, caf::reacts_to<msg::sampled_batch>,
                                       caf::reacts_to<msg::rejected>, caf::reacts_to<msg::prefilled>,
                                       caf::reacts_to<msg::engine_lost>, caf::reacts_to<msg::cancel_request>,
                                       caf::reacts_to<msg::forwarded>>;

/// The engine: work from request actors and prefill engines, KV from the UCX thread, release
/// and reporting orders, queries. `report_atom` is its own report timer.
using engine_actor = caf::typed_actor<
    caf::reacts_to<msg::submit>, caf::reacts_to<msg::submit_prefill>, caf::reacts_to<msg::kv_handoff>,
    caf::reacts_to<msg::kv_arrived>, caf::reacts_to<msg::release>, caf::reacts_to<msg::report_to>,
    caf::reacts_to<report_atom>, caf::replies_to<stats_atom>::with<msg::engine_report>,
    caf::replies_to<executor_atom>::with<executor_actor>, caf::replies_to<ping_atom>::with<pong_atom>,
    caf::replies_to<drain_atom, int32_t>::with<int32_t, int32_t>, caf::reacts_to<drain_atom>>;

using engine_list = std::vector<engine_actor>;
using expert_shard_list = std::vector<expert_shard_actor>;

/// The node actor of a node without the balancer: lists its engines for the balancer's node, and
/// drains the node when asked by `troupe drain` (the node's name, a grace period in ms or -1 for
/// the topology's; answered with the grace period it drains with). What such a node publishes:
/// a surface for cluster members (docs/security.md). A shard host lists its expert shards
/// (topology [[expert_shard]], docs/moe.md) for the nodes of their engines. A node with a host
/// tier names it for the balancer's prefix directory (an invalid handle: none).
using node_actor = caf::typed_actor<caf::replies_to<engines_atom>::with<engine_list>,
                                    caf::replies_to<expert_shards_atom>::with<expert_shard_list>,
                                    caf::replies_to<host_tier_atom>::with<cache_tier_actor>,
                                    caf::replies_to<drain_atom, std::string, int32_t>::with<int32_t>>;

/// The load balancer as clients see it: submit a completion, get its request actor. The only
/// interface a node publishes where the balancer runs (spawn_balancer_front in
/// actors/load_balancer_actor.hpp forwards it to the balancer).
using balancer_client_actor =
    caf::typed_actor<caf::replies_to<msg::submit_completion>::with<request_actor>>;

/// The whole load balancer: placement for request actors, load reports from engines and cache
/// tiers, its heartbeat timer. Never published: it checks the sender of each of these messages.
using balancer_actor = balancer_client_actor::extend<caf::replies_to<msg::place_request>::with<msg::placement>,
                                                     caf::reacts_to<msg::load_report>,
                                                     caf::reacts_to<msg::tier_events>,
                                                     caf::reacts_to<heartbeat_atom>,
                                                     caf::reacts_to<rejoin_atom>>;

}  // namespace troupe::actors

// Compiled grammars are shared in-process, never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::grammar::grammar_table)

// The messages that carry these handles, complete for every user of the handles.
#include "actors/system/cluster_messages.hpp"  // IWYU pragma: export
