#pragma once

/// Topology files: which nodes exist, where each node's actors are published, which engines
/// run on which node, and where the load balancer lives. This header is plain data plus the
/// parser's entry points; it knows nothing of CAF (launching a node is in launch.hpp) and
/// nothing of TOML (toml++ stays inside topology.cpp).
///
/// Schema (full example and error list: docs/topology.md):
///
///   [cluster]                          # optional table
///   name = "single-node"               #   optional string, default "troupe"
///   kv_transfer = "caf"                #   optional: caf (default) | ucx: how prefill engines
///                                      #   ship KV to decode engines (CAF messages or UCX)
///   drain_grace_ms = 30000             #   optional, 0..3600000, default 30000: on SIGTERM a
///                                      #   node's engines take no new work and their requests
///                                      #   run on this long, then go to other engines
///
///   [limits]                           # optional table (docs/security.md "Limits")
///   max_message_mib = 64               #   optional, 1..4095, default 64: the largest CAF message
///                                      #   a peer may announce; a bigger one closes its connection
///   max_pending_per_client = 256       #   optional, > 0, default 256: requests in flight per
///                                      #   client process (the balancer's own node is exempt)
///   idle_timeout_ms = 30000            #   optional, 0 (never) or 1000..3600000, default 30000: a
///                                      #   CAF connection that receives nothing this long is closed
///   tls_handshake_timeout_ms = 5000    #   optional, 100..600000, default 5000: an accepted TLS
///                                      #   connection still handshaking this long is closed
///   max_connections = 1024             #   optional, > 0, default 1024: connections a node
///                                      #   accepts at its port; one more is closed at once
///   max_connections_per_host = 64      #   optional, > 0, default 64: the same from one address
///
///   [gateway]                          # optional table: what one client may make the HTTP and
///                                      #   msgpack gateways hold (docs/security.md "Limits at the
///                                      #   edges"); each key optional, default the gateway's;
///                                      #   `troupe serve --gateway-*` flags win over it
///   max_connections = 512              #   1..2^20: open connections in all
///   max_connections_per_address = 64   #   1..2^20: from one client address
///   max_in_flight_per_connection = 64  #   1..2^20: msgpack requests in flight on a connection
///   output_mib = 16                    #   1..4096: output left unread before the connection closes
///   idle_timeout_ms = 60000            #   1..86400000: nothing in flight, silent this long: closed
///   header_timeout_ms = 10000          #   1..3600000: an HTTP head / msgpack frame from its first byte
///   body_timeout_ms = 30000            #   1..3600000: an HTTP body from its head
///   write_timeout_ms = 30000           #   1..3600000: a write without progress closes the connection
///   priority_min = 0                   #   any int32: a request's priority below it is raised to it
///
///   [http]                             # optional table: the HTTP gateway (docs/http.md) on the
///                                      #   load balancer's node; `--http-port` overrides it
///   port = 8000                        #   required, 0..65535 (0: any free port, printed); not
///                                      #   the balancer node's port or kv_port on the same host
///   host = "127.0.0.1"                 #   optional, default 127.0.0.1: a host name or address
///   drain_timeout_ms = 30000           #   optional, 1..600000, default 30000: how long a
///                                      #   stopping node waits for HTTP requests in flight
///
///   [[node]]                           # one or more
///   name = "node0"                     #   required, unique, non-empty
///   host = "127.0.0.1"                 #   required, non-empty
///   port = 7100                        #   required, 1..65535
///   kv_port = 8100                     #   optional, 1..65535, default port + 1000: the UCX
///                                      #   listener (kv_transfer = "ucx"); every (address, port)
///                                      #   and (address, kv_port) is unique across all nodes
///   host_tier_blocks = 0               #   optional, >= 0, default 0 (none): a host-memory KV
///                                      #   cache tier of this many blocks, shared by the node's
///                                      #   engines (which must then run one model and block size)
///   host_tier_fetch_timeout_ms = 0     #   optional, 0..60000, default 0: fetch or recompute by
///                                      #   cost (docs/kv-tiers.md); > 0: fetch every block and
///                                      #   wait this long at most before recomputing them
///   disk_tier_dir = "kv-cache"         #   optional (with disk_tier_mib and host_tier_blocks): a
///   disk_tier_mib = 1024               #   disk tier below the host tier, relative to the file
///
///   [load_balancer]                    # required table
///   node = "node0"                     #   required (or `nodes`), names a [[node]]
///   nodes = ["lb0", "lb1"]             #   instead of `node`: 1 to 4 nodes that each run a load
///                                      #   balancer over every engine, with its gateways (two
///                                      #   active: clients use any, --connect takes several);
///                                      #   with 2 or more, those nodes run no engine, no tier
///                                      #   and no expert shard
///   max_waiting = 1024                 #   optional, > 0, default 1024: queued requests per
///                                      #   engine before the balancer answers 'overloaded'
///   prefill_tiers = [128, 512, 2048]   #   optional, default shown: strictly increasing prompt
///                                      #   lengths >= 1, at most 16; N bounds make N + 1 tiers
///                                      #   ([] = one tier)
///   router = "auto"                    #   optional, default shown: auto | least_loaded |
///                                      #   round_robin | power_of_two | prefix_affinity
///                                      #   (docs/topology.md; auto: prefix_affinity with
///                                      #   more than one engine or a cache tier)
///   prefix_weight = 0.5                #   optional, 0..1e6, default 0.5: prefix_affinity's
///                                      #   weight of a cached prefix against load
///   rate_limit_per_s = 0               #   optional, 0..1e9, default 0 (off): admit at most this
///                                      #   many requests per second on average; one more is
///                                      #   answered 'overloaded' (HTTP 429)
///   rate_limit_burst = 16              #   optional, 1..1e6, default 16: requests admitted at once
///   chat_template = "auto"             #   optional, default shown: how chat requests become
///                                      #   prompts: auto (the model's own Jinja template, else
///                                      #   bare) | bare | plain | chatml | llama2 | llama3
///   report_interval_ms = 20            #   optional, 1..60000, default 20: engine load reports
///   connect_timeout_ms = 10000         #   optional, 1..600000, default 10000: how long a node
///                                      #   keeps trying to reach the nodes it needs at start-up
///   heartbeat_interval_ms = 1000       #   optional, 1..60000, default 1000: how often the
///                                      #   balancer pings every engine
///   heartbeat_timeout_ms = 5000        #   optional, 1..600000, > heartbeat_interval_ms,
///                                      #   default 5000: an engine silent this long is lost
///   rejoin_interval_ms = 1000          #   optional, 0..600000, default 1000: how often the
///                                      #   balancer reaches a lost engine's node again (a
///                                      #   restarted node's engines rejoin); 0 = never
///
///   [[engine]]                         # one or more
///   name = "engine0"                   #   required, unique, non-empty
///   node = "node0"                     #   required, names a [[node]]
///   role = "mixed"                     #   optional: mixed (default) | prefill | decode
///   model = "../models/stories260K.bin"  # required; relative paths resolve against the
///   tokenizer = "../models/tok512.bin"   #   topology file's directory; must be regular files
///   kv_blocks = 1024                   #   optional, > 0, default 1024
///   block_size = 16                    #   optional, 1..1024, default 16
///   max_num_batched_tokens = 512       #   optional, > 0, default 512
///   max_num_seqs = 256                 #   optional, > 0, default 256
///   step_time_budget_ms = 2.5          #   optional, 0 (default, off) or 0.000001..1000000:
///                                      #   prefill chunks cut to this predicted step time
///   calibration = "calibration-cpu.toml" # required with a budget: `troupe calibrate` output
///                                      #   that prices the steps (resolved like model)
///   kv_watermark = 0.05                #   optional, 0..0.5, default 0 (off): share of the KV
///                                      #   pool admission keeps free (no-thrash admission)
///   prefix_cache_slack_tokens = 6      #   optional, 0..1048576, default 0: trailing prompt
///                                      #   tokens never served from the prefix cache (the hit
///                                      #   rule's slack, runtime/kv/hit_rule.hpp)
///   scheduler = "priority"             #   optional: priority (default) | fcfs | sjf — the
///                                      #   order sequences are served in (runtime/sched/policy.hpp)
///   sjf_aging_tokens = 256             #   optional, 1..1048576, default 256: sjf's weight of
///                                      #   one later arrival, in tokens of predicted work
///   executor_threads = 1               #   optional, 1..64, default 1
///   preemption = "swap"                #   optional: recompute (default) | swap | cost — a
///                                      #   readmitted victim fetches the blocks it lost from
///                                      #   the node's host tier (cost: when cheaper by the
///                                      #   calibration; swap_bandwidth_gb_s, default 8, prices it)
///   expert_timeout_ms = 10000          #   optional, 1..600000, default 10000: how long an MoE
///                                      #   layer waits for its expert shards' answers
///   expert_window_steps = 0            #   optional, 0..1000000, default 0 (off): with expert
///                                      #   shards, move experts when a window of this many steps
///                                      #   is imbalanced (docs/moe.md "Reassignment")
///   expert_capacity = 0                #   optional, 0..1024, default 0 (the most experts any of
///                                      #   its shards holds, plus one): experts per layer a
///                                      #   shard may hold after a move
///   expert_moe_lb_max = 1.15           #   optional, 1..1000, default 1.15: move only for a
///                                      #   window whose moe_lb is above it
///   expert_move_steps_max = 4          #   optional, 1..1000000, default 4: steps a move's copy
///                                      #   may take before the executor waits for it
///   grammar_rules_max = 10000          #   optional, 1..1000000, default 10000: rules a
///                                      #   request's grammar may compile to (elements: 10x)
///   grammar_stacks_per_state_max = 65536  # optional, 1..16777216, default 65536: stack tops
///                                      #   to build one grammar-automaton state
///   grammar_matcher_mib = 256          #   optional, 1..65536, default 256: one grammar
///                                      #   matcher's automaton and masks
///   grammar_cache_mib = 64             #   optional, 0..65536, default 64: compiled grammars
///                                      #   the engine's grammar actor keeps (docs/grammars.md)
///
///   [[expert_shard]]                   # zero or more (docs/moe.md): expert-shard actors that
///                                      #   compute an MoE engine's experts; without any, the
///                                      #   engine computes them in its own process
///   engine = "engine0"                 #   required, names an [[engine]] (its model must be an
///                                      #   MoE: checked at launch)
///   node = "node0"                     #   required: the engine's node (the shard runs in its
///                                      #   process) or a shard host, a node that runs no engine
///                                      #   and not the load balancer
///   experts = [0, 1]                   #   required, strictly increasing, each 0..1023 (and below
///                                      #   the model's expert count): the experts it holds in
///                                      #   every layer; an expert on several shards has replicas.
///                                      #   An engine's shards together hold every expert
///
/// Unknown keys are errors everywhere (a typo must not silently fall back to a default). At
/// least one engine must be able to prefill (mixed or prefill), and prefill engines need a
/// mixed or decode engine to hand their requests to.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/engine/engine_config.hpp"

namespace troupe::topology {

/// One process of the cluster and the address its actors are published at.
struct node_spec {
  std::string name;
  std::string address;
  uint16_t port = 0;
  uint16_t kv_port = 0;  ///< UCX listener on `address` (kv_transfer = ucx); parsed default port + 1000
  std::string certificate;  ///< PEM, absolute; set exactly when the topology has [tls]
  std::string key;          ///< the certificate's private key (PEM, absolute); set with `certificate`
  /// The node's host-memory cache tier (docs/kv-tiers.md): capacity in KV blocks, shared by the
  /// node's engines; 0 = none.
  int32_t host_tier_blocks = 0;
  /// A fixed bound on how long a request waits for the host tier's blocks before it recomputes
  /// them (engine_config::tier_fetch_timeout_ns); 0 = fetch or recompute by cost.
  int32_t host_tier_fetch_timeout_ms = 0;
  /// The disk tier below the host tier (actors/edge/disk_tier.hpp): its directory (absolute) and
  /// capacity; "" = none.
  std::string disk_tier_dir;
  int32_t disk_tier_mib = 0;
};

/// How a prefill engine ships a request's KV cache to the decode engine that continues it.
enum class kv_transfer_kind { caf, ucx };

[[nodiscard]] const char* to_string(kv_transfer_kind kind);

/// What an engine does with a request: all of it, only the prompt, or only the generation.
enum class engine_role { mixed, prefill, decode };

[[nodiscard]] const char* to_string(engine_role role);

/// One engine replica: its node, its model files and its engine configuration.
struct engine_spec {
  std::string name;
  std::string node;
  engine_role role = engine_role::mixed;
  std::string model_path;      ///< absolute, lexically normalized; an existing regular file
  std::string tokenizer_path;  ///< absolute, lexically normalized; an existing regular file
  engine::engine_config config;
  int32_t executor_threads = 1;
  /// The longest context it serves (model::load_options::max_context): 0 = the model's.
  int32_t max_context = 0;
  std::string step_log;        ///< the executor logs every step here (troupe calibrate --log); "" = off
  /// The layout cache's directory (model::load_options::layout_cache): "" = the user's
  /// (model::default_layout_cache_dir), "off" = none.
  std::string layout_cache;
  int32_t expert_timeout_ms = 10000;  ///< how long an MoE layer waits for its expert shards
  /// Reassignment of its expert shards' experts (moe::reassignment_options): off with 0 window
  /// steps; capacity 0 = the most experts any of its shards holds, plus one.
  int32_t expert_window_steps = 0;
  int32_t expert_capacity = 0;
  double expert_moe_lb_max = 1.15;
  int32_t expert_move_steps_max = 4;
};

/// An expert-shard actor holding some experts of an MoE engine's model, in every layer.
struct expert_shard_spec {
  std::string engine;            ///< names an engine_spec
  std::string node;              ///< the engine's node, or a shard host (no engines, not the balancer's)
  std::vector<int32_t> experts;  ///< strictly increasing, >= 0; below the model's count (checked at launch)
};

/// Where the load balancer runs, how much it queues, and how the cluster reports to it.
struct load_balancer_spec {
  std::string node;  ///< the (first) balancer's node
  /// With `nodes = [...]`: every node that runs a balancer, `node` first (at most
  /// balance::balancers_max, each without engines, tiers or expert shards); empty: `node` alone.
  std::vector<std::string> nodes;
  /// Whether node `name` runs a balancer (and its gateways and request actors).
  [[nodiscard]] bool runs_on(std::string_view name) const {
    return name == node || std::find(nodes.begin(), nodes.end(), name) != nodes.end();
  }
  /// Every balancer node, `node` first.
  [[nodiscard]] std::vector<std::string> all_nodes() const {
    return nodes.empty() ? std::vector<std::string>{node} : nodes;
  }
  int32_t max_waiting = 1024;  ///< queued requests per engine before 'overloaded'
  /// Prompt-length tier bounds, strictly increasing, each >= 1, at most 16: N bounds make N + 1
  /// tiers (tier i = prompts of <= bounds[i] tokens, the last tier = longer); empty = one tier.
  std::vector<int32_t> prefill_tier_bounds = {128, 512, 2048};
  std::string router = "auto";  ///< one of balance::router_names()
  double prefix_weight = 0.5;           ///< prefix_affinity's weight of a cached prefix vs load
  int32_t rate_limit_per_s = 0;   ///< admission: requests per second on average, 0 = no limit
  int32_t rate_limit_burst = 16;  ///< admission: requests at once after a quiet period
  std::string chat_template = "auto";  ///< "auto" or a chat_template name (checked at launch)
  int32_t report_interval_ms = 20;     ///< how often each engine sends its load report
  int32_t connect_timeout_ms = 10000;  ///< how long a node keeps trying to reach its peers
  int32_t heartbeat_interval_ms = 1000;  ///< how often the balancer pings every engine
  int32_t heartbeat_timeout_ms = 5000;   ///< an engine silent this long is lost (> the interval)
  int32_t rejoin_interval_ms = 1000;     ///< how often a lost engine's node is reached again; 0 = never
};

/// [limits]: what a peer of the CAF port can make a node hold (docs/security.md "Limits").
struct limits_spec {
  int32_t max_message_mib = 64;          ///< the largest CAF message a peer may announce, 1..4095
  int32_t max_pending_per_client = 256;  ///< requests in flight per client process, >= 1
  int32_t idle_timeout_ms = 30000;       ///< a silent cluster connection is closed; 0 = never, else >= 1000
  int32_t tls_handshake_timeout_ms = 5000;  ///< an accepted TLS handshake still pending is closed
  int32_t max_connections = 1024;         ///< connections a node accepts in all, >= 1
  int32_t max_connections_per_address = 64;  ///< connections a node accepts from one address, >= 1
};

/// [gateway]: what one client may make the HTTP and msgpack gateways hold (gateway::edge_limits,
/// docs/security.md "Limits at the edges"). A key left out keeps the gateway's default.
struct gateway_spec {
  std::optional<int32_t> max_connections;
  std::optional<int32_t> max_connections_per_address;
  std::optional<int32_t> max_in_flight_per_connection;
  std::optional<int32_t> output_mib;
  std::optional<int32_t> idle_timeout_ms;
  std::optional<int32_t> header_timeout_ms;
  std::optional<int32_t> body_timeout_ms;
  std::optional<int32_t> write_timeout_ms;
  std::optional<int32_t> priority_min;
};

/// [http]: the OpenAI-compatible HTTP gateway on the load balancer's node (docs/http.md).
/// The most names [http] served_model_names gives, and the most bytes of each.
inline constexpr size_t served_model_names_max = 16;
inline constexpr size_t served_model_name_bytes_max = 256;

struct http_spec {
  std::string address = "127.0.0.1";     ///< a host name or IP address
  uint16_t port = 0;                   ///< 0: any free port (the bound one is printed)
  int32_t drain_timeout_ms = 30000;    ///< how long a stop waits for the requests in flight
  /// The model's names in the HTTP API (`--served-model-name` wins): the first is the id
  /// responses report, every one is accepted in `model`; empty: the model file's name.
  std::vector<std::string> served_model_names;
  /// Who may use the gateways (docs/security.md "Access to the gateways"); the flags of `serve`
  /// add to or override them. Files are absolute; "" = none.
  std::string api_keys_file;    ///< one API key per line
  std::string ssl_certfile;     ///< HTTPS (and TLS on the msgpack gateway), with ssl_keyfile
  std::string ssl_keyfile;
  std::string allowed_origins;  ///< CORS: comma-separated origins, or "*"
};

/// A validated topology file: every name it references exists, in file order.
struct topology {
  std::string cluster_name = "troupe";
  kv_transfer_kind kv_transfer = kv_transfer_kind::caf;
  int32_t drain_grace_ms = 30000;  ///< a stopping node's grace period before it forwards requests
  std::vector<node_spec> nodes;
  std::vector<engine_spec> engines;
  std::vector<expert_shard_spec> expert_shards;  ///< in file order
  load_balancer_spec load_balancer;
  std::string tls_ca;  ///< [tls] ca: the cluster CA certificate (PEM, absolute); "" = no [tls]
  limits_spec limits;
  gateway_spec gateway;
  std::optional<http_spec> http;  ///< [http]; none: no HTTP gateway unless `--http-port` asks

  /// The node called `name`, or nullptr.
  [[nodiscard]] const node_spec* find_node(std::string_view name) const;
  /// The first engine the topology places on node `node`, or nullptr (a node without engines).
  [[nodiscard]] const engine_spec* first_engine_on(std::string_view node) const;
  /// The engine called `name`, or nullptr.
  [[nodiscard]] const engine_spec* find_engine(std::string_view name) const;
};

/// How a topology's CAF ports are protected, given whether `--insecure` was passed.
enum class port_security {
  tls,                 ///< [tls]: mutual TLS on every node-to-node and client connection
  plaintext_loopback,  ///< no [tls], every node on a loopback address: only local processes reach it
  plaintext_insecure,  ///< no [tls], some node elsewhere, started with --insecure
};

/// Whether `address` is a loopback address: an IPv4 address in 127.0.0.0/8, ::1 (or an IPv4-mapped
/// ::ffff:127.x.y.z), or the name localhost. Parsed as an address: "127.evil.example" is not.
[[nodiscard]] bool is_loopback(std::string_view address);

/// The rule for starting a node (or `up`): TLS when the topology has [tls]; without it,
/// plaintext only when every node's host is a loopback address or `insecure` is set. Error
/// (invalid_argument): the first node that listens elsewhere, and what to do.
[[nodiscard]] expected<port_security> check_port_security(const topology& t, bool insecure);

/// What a node logs about plaintext (a warning on loopback, a loud error line with
/// --insecure); "" for TLS.
[[nodiscard]] std::string security_warning(port_security security);

/// Reads and validates the topology file at `path`; relative model paths resolve against the
/// file's directory. An unreadable file is io_error; anything wrong inside it is
/// malformed_file with a message `path:line: what: detail`.
[[nodiscard]] expected<topology> load_topology(const std::string& path);

/// Parses and validates topology text. `source_name` prefixes every error message;
/// `base_dir` is what relative model/tokenizer paths resolve against. Errors: malformed_file.
[[nodiscard]] expected<topology> parse_topology(std::string_view text,
                                                const std::string& source_name,
                                                const std::string& base_dir);

}  // namespace troupe::topology
