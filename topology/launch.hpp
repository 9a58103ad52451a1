#pragma once

/// Launching a topology node: load its engines' models, spawn engine + executor actors (with a
/// UCX transport for KV when the topology says kv_transfer = "ucx") and, if the load balancer
/// is placed there, the load balancer — after reaching every other node that runs engines
/// (CAF's io middleman, or its OpenSSL module under [tls]: each node publishes its node actor, or
/// the balancer, at its port).

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "actors/system/protocols.hpp"
#include "actors/system/tls.hpp"
#include "runtime/jinja/options.hpp"
#include "runtime/tokenizer/served_template.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "actors/edge/ucx_transport.hpp"
#include "topology/topology.hpp"

namespace troupe::topology {

struct launch_options {
  bool detached_executors = true;  ///< and disk tier actor; false under the deterministic test scheduler
  uint64_t seed_base = 0;          ///< the load balancer's seed base (see load_balancer_options)
  const std::atomic<bool>* stop = nullptr;  ///< set (a signal): stop reaching other nodes, fail `cancelled`
  /// A node without the balancer: `troupe drain` asked it to drain with this grace period (ms;
  /// -1: the topology's). Returns the grace period it drains with, or why it does not. Called on
  /// an actor thread; empty: the node actor refuses drain requests.
  std::function<expected<int32_t>(int32_t grace_ms)> drain = nullptr;
  /// The balancer's chat template, when given (`serve --chat-template FILE`): the file's Jinja
  /// text, named `chat_template_name`; it replaces the model's own and [load_balancer] chat_template.
  std::optional<std::string> chat_template_jinja;
  std::string chat_template_name;
  /// The date chat templates' strftime_now formats (`serve --template-date`): the caller's,
  /// since topology/ reads no clock for it.
  jinja::civil_date template_date;
};

/// What a node runs.
struct launched_node {
  actors::engine_list engines;         ///< in topology order
  std::vector<std::string> engine_names;
  actors::balancer_actor load_balancer;  ///< invalid if the balancer is placed elsewhere; never published
  actors::balancer_client_actor front;   ///< the balancer's client surface: published where the balancer runs
  actors::node_actor node_actor;       ///< answers engines_atom with `engines`; published where the balancer is not
  std::shared_ptr<transport::ucx_transport> ucx;  ///< KV transport of this node's engines, if any
  actors::cache_tier_actor host_tier;  ///< the node's host-memory KV tier ([[node]] host_tier_blocks), if any
  actors::disk_tier_actor disk_tier;   ///< the disk tier below it ([[node]] disk_tier_dir), if any
  /// Every expert shard it runs ([[expert_shard]]): a shard host's for other nodes' engines, in
  /// topology order (what its node actor lists), then those of its own engines.
  actors::expert_shard_list expert_shards;
  /// On an engine node without a balancer: its direct connections to the engine nodes after it
  /// in the topology (actors/system/peer_links.hpp); none elsewhere.
  caf::actor peer_links;
  std::shared_ptr<const tokenizer> tok;
  /// On the balancer's node: the chat template the balancer renders chats with (the HTTP
  /// gateway's /tokenize renders with it too), and the context of the node's engines (the
  /// largest; the first engine's when the node runs none): /v1/models' max_model_len.
  std::shared_ptr<const served_template> chat;
  int32_t context_tokens = 0;
  std::vector<std::string> summary;    ///< one line per spawned actor, for `troupe serve`

  /// What the node publishes at its address: the balancer's front where it runs, else the node
  /// actor.
  [[nodiscard]] caf::actor entry() const {
    return front ? caf::actor_cast<caf::actor>(front) : caf::actor_cast<caf::actor>(node_actor);
  }
};

/// Spawns everything `t` places on `node_name`. Errors: unknown node, unreadable model or
/// tokenizer, a tokenizer that does not fit its model, invalid engine settings, a UCX listener
/// that cannot bind, and — on the balancer's node — another node with engines that cannot be
/// reached within the topology's connect_timeout_ms (the error names it; a frozen node that
/// accepts the connection but never answers counts as unreachable) or that runs a different
/// topology, and `cancelled` when `options.stop` is set meanwhile. On an error, whatever it
/// spawned before is stopped (shutdown_node). Reaching other nodes needs the io middleman loaded in `sys`.
[[nodiscard]] expected<launched_node> launch_node(caf::actor_system& sys, const topology& t,
                                                  const std::string& node_name,
                                                  const launch_options& options);

/// Publishes the node's entry point at its address: the balancer's front (submit_completion
/// only) where it runs, the node actor elsewhere; over TLS when `sys` was configured with the node's credentials. Returns the bound
/// port. Error: io_error naming the address.
[[nodiscard]] expected<uint16_t> publish_node(caf::actor_system& sys, const topology& t, const std::string& node_name,
                                              const launched_node& node);

/// The node's TLS files from the topology ([tls] ca, the node's certificate and key); disabled
/// when the topology has no [tls].
[[nodiscard]] actors::tls_credentials node_credentials(const topology& t, const std::string& node_name);

/// Whom node `node_name` accepts on its TLS connections (actors::set_peer_rules): node
/// certificates named after the topology's nodes, and client certificates only on the
/// balancer's node (clients submit there; every other node is reached by nodes alone).
[[nodiscard]] actors::peer_rules node_peer_rules(const topology& t, const std::string& node_name);

/// The topology's [limits] for the CAF port (configure_network applies them process-wide).
[[nodiscard]] actors::network_limits node_network_limits(const topology& t);

/// The cores the node's step executors keep busy: the sum of its engines' executor_threads
/// (actors::configure_real_time sizes the actor scheduler around them).
[[nodiscard]] int32_t node_compute_threads(const topology& t, const std::string& node_name);

/// Drains `node`'s engines before it stops: they take no new work (the balancer learns it from
/// their next load report), their requests run on for `grace_ms`, and what is left then goes
/// back to its request actors, which place it on other engines (with its KV where it has some:
/// engine::engine_policy::forward_all). Returns the requests forwarded, when every engine is
/// empty; or earlier, when `stop_now()` turns true (a second signal), or `grace_ms` + 10 s
/// passed (an engine that never answers).
struct drain_counts {
  int64_t forwarded = 0;
  int64_t with_kv = 0;  ///< of them, forwarded with their KV (the rest are recomputed)
};
drain_counts drain_node(caf::actor_system& sys, const launched_node& node, int32_t grace_ms,
                        const std::function<bool()>& stop_now);

/// Sends every actor of `node` an exit and waits until the system has no actors left.
void shutdown_node(caf::actor_system& sys, const launched_node& node);

/// MemAvailable of /proc/meminfo in bytes, or -1 where it cannot be read.
[[nodiscard]] int64_t memory_available();

/// A one-node topology running `model_path` with defaults (`troupe generate`).
[[nodiscard]] topology single_node(const std::string& model_path, const std::string& tokenizer_path);

}  // namespace troupe::topology
