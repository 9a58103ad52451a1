// `troupe serve`: launch one node of a topology (a file, or one generated from --model and
// friends), publish its load balancer, run until SIGINT or SIGTERM, then shut down cleanly.
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/connect.hpp"
#include "actors/system/tls.hpp"
#include "actors/system/type_ids.hpp"
#include "apps/troupe/commands.hpp"
#include "apps/troupe/logging.hpp"
#include "apps/troupe/signals.hpp"
#include "actors/edge/http_gateway.hpp"
#include "actors/edge/msgpack_gateway.hpp"
#include "runtime/model/checkpoint.hpp"
#include "topology/launch.hpp"

namespace troupe::cli {
namespace {

/// What one client may make the HTTP and msgpack gateways hold (gateway::edge_limits): the
/// defaults, the topology's [gateway] over them, the flags given over that; requests in flight
/// per address are the topology's [limits] max_pending_per_client.
struct gateway_flags {
  /// One integer flag: the key of [gateway] it overrides and how it sets the limits.
  struct flag {
    const char* name;
    const char* description;
    int64_t min, max;
    std::optional<int32_t> topology::gateway_spec::*key;
    void (*set)(gateway::edge_limits&, int64_t);
    int64_t value = 0;  ///< the flag's, or the default (shown in --help)
    CLI::Option* option = nullptr;
  };
  std::vector<flag> flags;

  gateway_flags() {
    using g = topology::gateway_spec;
    using l = gateway::edge_limits;
    using ms = std::chrono::milliseconds;
    const int64_t int32_min = std::numeric_limits<int32_t>::min(), int32_max = std::numeric_limits<int32_t>::max();
    flags = {
        {"--gateway-max-connections", "open connections in all", 1, 1 << 20, &g::max_connections,
         [](l& x, int64_t v) { x.max_connections = static_cast<int32_t>(v); }},
        {"--gateway-max-connections-per-address", "open connections from one client address", 1, 1 << 20,
         &g::max_connections_per_address, [](l& x, int64_t v) { x.max_connections_per_address = static_cast<int32_t>(v); }},
        {"--gateway-max-in-flight-per-connection", "msgpack requests in flight on one connection", 1, 1 << 20,
         &g::max_in_flight_per_connection, [](l& x, int64_t v) { x.max_in_flight_per_connection = static_cast<int32_t>(v); }},
        {"--gateway-output-mib", "output a client leaves unread before its requests are cancelled and it is closed", 1,
         4096, &g::output_mib, [](l& x, int64_t v) { x.output_bytes_max = v << 20; }},
        {"--gateway-idle-timeout-ms", "a connection with nothing in flight closes after this", 1, 86400000,
         &g::idle_timeout_ms, [](l& x, int64_t v) { x.idle_timeout = ms(v); }},
        {"--gateway-header-timeout-ms", "an HTTP request head (a msgpack frame) must arrive within this of its first byte",
         1, 3600000, &g::header_timeout_ms, [](l& x, int64_t v) { x.header_timeout = ms(v); }},
        {"--gateway-body-timeout-ms", "an HTTP request body must arrive within this of its head", 1, 3600000,
         &g::body_timeout_ms, [](l& x, int64_t v) { x.body_timeout = ms(v); }},
        {"--gateway-write-timeout-ms", "a write to a client that makes no progress this long closes its connection", 1,
         3600000, &g::write_timeout_ms, [](l& x, int64_t v) { x.write_timeout = ms(v); }},
        {"--gateway-priority-min", "the most urgent priority a client may ask for; a smaller one is raised to it",
         int32_min, int32_max, &g::priority_min, [](l& x, int64_t v) { x.priority_min = static_cast<int32_t>(v); }},
    };
    const l defaults;
    const int64_t shown[] = {defaults.max_connections, defaults.max_connections_per_address,
                             defaults.max_in_flight_per_connection, defaults.output_bytes_max >> 20,
                             defaults.idle_timeout.count(), defaults.header_timeout.count(),
                             defaults.body_timeout.count(), defaults.write_timeout.count(), defaults.priority_min};
    for (size_t i = 0; i < flags.size(); i++) flags[i].value = shown[i];
  }
  void add_to(CLI::App* cmd) {
    for (flag& f : flags)
      f.option = cmd->add_option(f.name, f.value, std::string(f.description) + " (overrides the topology's [gateway])")
                     ->check(CLI::Range(f.min, f.max))
                     ->capture_default_str()
                     ->group("Gateway limits (per gateway; docs/security.md)");
  }
  /// The limits for topology `t`.
  [[nodiscard]] gateway::edge_limits resolve(const topology::topology& t) const {
    gateway::edge_limits l;
    for (const flag& f : flags) {
      const std::optional<int32_t>& key = t.gateway.*f.key;
      if (f.option && f.option->count() > 0)
        f.set(l, f.value);
      else if (key)
        f.set(l, *key);
    }
    l.max_in_flight_per_address = t.limits.max_pending_per_client;
    return l;
  }
};

struct serve_options {
  std::string topology = default_topology_path();
  std::string node;
  bool generated = false;  ///< serve a one-node topology built from the fields below, not a file
  std::string model = default_model_path();
  std::string tokenizer;  ///< "": the GGUF model's own, else the bundled one (tokenizer_path_for)
  std::string address = "127.0.0.1";
  uint16_t port = 7100;  ///< 0 = any free port (the bound one is printed)
  engine_flags engine;   ///< the generated engine's
  int32_t http_port = -1;  ///< the HTTP gateway's port: -1 = the topology's [http], 0 = any free one (printed)
  std::string http_address;   ///< "" = the topology's [http] host, else 127.0.0.1
  int32_t msgpack_port = -1;  ///< the msgpack gateway's port: -1 = none, 0 = any free one (printed)
  std::string msgpack_address = "127.0.0.1";
  bool insecure = false;  ///< allow plaintext on a non-loopback address (topology without [tls])
  int32_t drain_grace_ms = -1;  ///< -1 = the topology's [cluster] drain_grace_ms
  speculation_flags speculation;  ///< the generated node's
  gateway_flags gateway;          ///< both gateways' limits
  chat_template_flags chat;       ///< the balancer's chat template and its date
  // Who may use the gateways (docs/security.md "Access to the gateways"), over [http]'s keys.
  std::vector<std::string> api_keys;  ///< besides TROUPE_API_KEY and [http] api_keys_file
  bool metrics_public = false;
  std::string ssl_certfile, ssl_keyfile;
  std::vector<std::string> allowed_origins;
  /// The HTTP API's model names: the first is the id it reports, every one is accepted in a
  /// request's `model`; none: the model file's name without extension.
  std::vector<std::string> served_model_names;
  /// /v1/embeddings' pooling where a request names none: last, mean or cls (docs/http.md).
  std::string pooling = "last";
};

/// Who may use the gateways: the API keys of --api-key, TROUPE_API_KEY and [http]
/// api_keys_file together; the certificate and the origins of the flags, else of [http].
expected<gateway::access_options> resolve_access(const serve_options& o, const topology::topology& t) {
  const topology::http_spec table = t.http.value_or(topology::http_spec{});
  std::vector<std::string> keys = o.api_keys;
  if (const char* env = std::getenv("TROUPE_API_KEY"); env && *env) keys.emplace_back(env);
  if (!table.api_keys_file.empty()) {
    auto listed = gateway::api_keys::read_file(table.api_keys_file);
    if (!listed) return tl::unexpected(listed.error());
    keys.insert(keys.end(), listed->begin(), listed->end());
  }
  gateway::access_options access;
  auto accepted = gateway::api_keys::make(keys);
  if (!accepted) return tl::unexpected(accepted.error());
  access.keys = std::move(*accepted);
  access.metrics_public = o.metrics_public;
  auto origins = gateway::cors_origins::make(o.allowed_origins.empty() && !table.allowed_origins.empty()
                                                 ? std::vector<std::string>{table.allowed_origins}
                                                 : o.allowed_origins);
  if (!origins) return fail(errc::invalid_argument, "--allowed-origins: " + origins.error().message);
  access.origins = std::move(*origins);
  const bool flags = !o.ssl_certfile.empty() || !o.ssl_keyfile.empty();
  if (flags && (o.ssl_certfile.empty() || o.ssl_keyfile.empty()))
    return fail(errc::invalid_argument, "--ssl-certfile and --ssl-keyfile go together");
  const std::string& cert = flags ? o.ssl_certfile : table.ssl_certfile;
  const std::string& key = flags ? o.ssl_keyfile : table.ssl_keyfile;
  if (!cert.empty()) {
    auto tls = gateway::make_tls_context(cert, key);
    if (!tls) return tl::unexpected(tls.error());
    access.tls = std::move(*tls);
  }
  return access;
}

/// A gateway at `address` reachable from other hosts says what it lacks: TLS (keys and prompts
/// cross the network in clear) and keys (anyone who reaches it may use it).
void log_access(const char* what, const std::string& address, const gateway::access_options& access) {
  if (topology::is_loopback(address)) return;
  if (!access.tls)
    spdlog::warn("{} on {} without TLS: API keys, prompts and answers cross the network in clear (--ssl-certfile, "
                 "--ssl-keyfile)", what, address);
  if (access.keys.empty())
    spdlog::warn("{} on {} without API keys: anyone who reaches it may use it (--api-key)", what, address);
}

/// The chat template flags into `lo`: the file's text and the date (today's unless given).
expected<void> apply_chat_flags(const chat_template_flags& flags, topology::launch_options& lo) {
  auto jinja = flags.read_file();
  if (!jinja) return tl::unexpected(jinja.error());
  auto date = flags.resolve_date();
  if (!date) return fail(date.error().code, "--template-date: " + date.error().message);
  lo.chat_template_jinja = std::move(*jinja);
  lo.chat_template_name = "chat template '" + flags.file + "'";
  lo.template_date = *date;
  return {};
}

/// The topology to serve: the file, or the one-node topology `troupe generate` runs, published
/// at address:port.
expected<topology::topology> serve_topology(const serve_options& o) {
  if (!o.generated) return topology::load_topology(o.topology);
  topology::topology t = topology::single_node(o.model, tokenizer_path_for(o.tokenizer, o.model));
  t.nodes[0].address = o.address;
  t.nodes[0].port = o.port;
  o.engine.apply(t.engines[0]);
  if (auto ok = o.speculation.apply(t.engines[0].config.speculation); !ok) return tl::unexpected(ok.error());
  return t;
}

/// The topology's balancer nodes, quoted: 'node0' or 'lb0', 'lb1'.
std::string balancer_nodes(const topology::topology& t) {
  std::string out;
  for (const std::string& n : t.load_balancer.all_nodes()) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

/// Where this node serves HTTP, if it does: the topology's [http] with the flags over it (flags
/// win), on the load balancer's node only.
expected<std::optional<topology::http_spec>> http_endpoint(const serve_options& o, const topology::topology& t,
                                                          const std::string& node_name) {
  const bool balancer_node = t.load_balancer.runs_on(node_name);
  if (o.http_port < 0 && !o.http_address.empty() && !t.http)
    return fail(errc::invalid_argument, "--http-host needs --http-port or an [http] table in the topology");
  if (o.http_port >= 0 && !balancer_node)
    return fail(errc::invalid_argument, "--http-port needs a load balancer's node (" + balancer_nodes(t) + ")");
  if (o.http_port < 0 && (!t.http || !balancer_node)) return std::nullopt;
  topology::http_spec http = t.http.value_or(topology::http_spec{});
  if (o.http_port >= 0) http.port = static_cast<uint16_t>(o.http_port);
  if (!o.http_address.empty()) http.address = o.http_address;
  if (o.served_model_names.empty()) return http;
  // The bounds of the table's served_model_names.
  const std::vector<std::string>& names = o.served_model_names;
  if (names.size() > topology::served_model_names_max)
    return fail(errc::invalid_argument, "--served-model-name gives " + std::to_string(names.size()) +
                                            " names; at most " + std::to_string(topology::served_model_names_max));
  for (auto it = names.begin(); it != names.end(); ++it)
    if (std::find(names.begin(), it, *it) != it)
      return fail(errc::invalid_argument, "--served-model-name gives '" + echo(*it) + "' twice");
  http.served_model_names = names;
  return http;
}

/// The HTTP gateway at `http` (null if none), listening before the node is launched: /health
/// says "starting" until `serve` hands it the balancer. /metrics reports this node's engines.
expected<std::unique_ptr<gateway::http_gateway>> start_http(caf::actor_system& sys, const serve_options& o,
                                                            const std::optional<topology::http_spec>& http,
                                                            const topology::topology& t, const std::string& node_name,
                                                            const gateway::access_options& access) {
  if (!http) return nullptr;
  log_access("the HTTP gateway", http->address, access);
  gateway::gateway_options g;
  g.address = http->address;
  g.port = http->port;
  g.limits = o.gateway.resolve(t);
  g.access = access;
  g.model = {std::filesystem::path(t.engines.front().model_path).stem().string(), system_fingerprint(),
             std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()};
  const std::vector<std::string>& names = http->served_model_names;
  if (!names.empty()) {
    g.model.id = names.front();
    g.model.aliases.assign(names.begin() + 1, names.end());
  }
  for (const topology::engine_spec& e : t.engines) {
    if (e.node != node_name) continue;
    g.kv_cache.num_blocks += e.config.num_kv_blocks;
    g.kv_cache.block_size = e.config.block_size;
  }
  g.access_log = access_log_settings();
  g.pooling = engine::parse_pooling(o.pooling).value_or(engine::pooling_mode::last);  // checked by its flag
  auto header = model::read_header(t.engines.front().model_path);
  if (!header) return tl::unexpected(header.error());
  g.embedding_dim = header->config.dim;
  return gateway::http_gateway::start(sys, std::move(g));
}

/// On a stop, both gateways at once: the HTTP gateway drains (503s for new completions, those
/// in flight end within the drain timeout) and stops; the msgpack gateway reads no new frames
/// and its requests in flight end within the same timeout.
void stop_gateways(std::unique_ptr<gateway::http_gateway>& http, const std::optional<topology::http_spec>& address,
                   std::unique_ptr<gateway::msgpack_gateway>& msgpack) {
  std::thread msgpack_stop([&msgpack] { msgpack.reset(); });
  if (http && !http->drain(std::chrono::milliseconds(address->drain_timeout_ms)))
    spdlog::warn("http: the drain timeout ({} ms) passed: the requests left were cancelled", address->drain_timeout_ms);
  http.reset();
  msgpack_stop.join();
}

/// The msgpack gateway `o` asks for (null if none), in front of this node's balancer.
expected<std::unique_ptr<gateway::msgpack_gateway>> start_msgpack(caf::actor_system& sys, const serve_options& o,
                                                                  const topology::topology& t,
                                                                  const topology::launched_node& node,
                                                                  const gateway::access_options& access) {
  if (o.msgpack_port < 0) return nullptr;
  log_access("the msgpack gateway", o.msgpack_address, access);
  if (!node.load_balancer)
    return fail(errc::invalid_argument, "--msgpack-port needs a load balancer's node (" + balancer_nodes(t) + ")");
  gateway::msgpack_options m;
  m.address = o.msgpack_address;
  m.port = static_cast<uint16_t>(o.msgpack_port);
  m.limits = o.gateway.resolve(t);
  m.access = access;
  m.access_log = access_log_settings();
  m.drain_timeout = std::chrono::milliseconds(t.http.value_or(topology::http_spec{}).drain_timeout_ms);
  return gateway::msgpack_gateway::start(sys, node.load_balancer, std::move(m));
}

/// A plaintext node says so: a warning on loopback, an error line with --insecure.
void log_security(topology::port_security security) {
  const std::string warning = topology::security_warning(security);
  if (security == topology::port_security::plaintext_loopback) spdlog::warn("{}", warning);
  if (security == topology::port_security::plaintext_insecure) spdlog::error("{}", warning);
}

int run_serve(const serve_options& o) {
  auto t = serve_topology(o);
  if (!t) return fail_with(t.error());
  const std::string node_name = o.node.empty() ? t->load_balancer.node : o.node;
  const topology::node_spec* node = t->find_node(node_name);
  if (!node) return fail_with(error{errc::not_found, "the topology has no node '" + node_name + "'"});
  auto security = topology::check_port_security(*t, o.insecure);
  if (!security) return fail_with(security.error());
  topology::launch_options lo;
  lo.seed_base = draw_seed_base();
  if (auto ok = apply_chat_flags(o.chat, lo); !ok) return fail_with(ok.error());
  signal_waiter signals;
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, topology::node_compute_threads(*t, node_name));
  actors::set_peer_rules(topology::node_peer_rules(*t, node_name));  // applies once TLS is on
  if (auto ok = actors::configure_network(cfg, topology::node_credentials(*t, node_name),
                                           topology::node_network_limits(*t));
      !ok)
    return fail_with(ok.error());
  auto http_at = http_endpoint(o, *t, node_name);
  if (!http_at) return fail_with(http_at.error());
  auto access = resolve_access(o, *t);
  if (!access) return fail_with(access.error());
  log_security(*security);
  caf::actor_system sys{cfg};
  keep_stdout_for_text(sys);
  auto http = start_http(sys, o, *http_at, *t, node_name, *access);
  if (!http) return leave(sys, fail_with(http.error()));
  const std::string http_endpoint = *http ? (*http_at)->address + ":" + std::to_string((*http)->port()) : "";
  const char* http_scheme = access->tls ? "https://" : "http://";
  if (*http) {
    std::printf("%s: HTTP gateway starting on %s (GET /health: 503 until the engines are up)\n", node_name.c_str(),
                http_endpoint.c_str());
    std::fflush(stdout);
  }
  const int32_t default_grace_ms = o.drain_grace_ms >= 0 ? o.drain_grace_ms : t->drain_grace_ms;
  lo.stop = &signals.stopped();
  lo.drain = [&signals, default_grace_ms](int32_t grace_ms) -> expected<int32_t> {
    if (!signals.request_drain(grace_ms)) return fail(errc::invalid_argument, "the node is stopping already");
    return grace_ms >= 0 ? grace_ms : default_grace_ms;
  };
  auto launched = topology::launch_node(sys, *t, node_name, lo);
  if (!launched && launched.error().code == errc::cancelled) {  // SIGINT/SIGTERM during start-up
    spdlog::warn("{}", launched.error().message);
    return leave(sys, 0);
  }
  if (!launched) return leave(sys, fail_with(launched.error()));
  auto port = topology::publish_node(sys, *t, node_name, *launched);
  if (!port) {
    topology::shutdown_node(sys, *launched);
    return leave(sys, fail_with(port.error()));
  }
  launched->summary.push_back(std::string(launched->load_balancer ? "load balancer" : "node actor") +
                              " listening on " + node->address + ":" + std::to_string(*port) +
                              (*security == topology::port_security::tls ? " (mutual TLS)" : " (plaintext)"));
  if (*http) {
    (*http)->serve(launched->load_balancer, launched->engines, launched->tok, launched->context_tokens,
                   launched->chat);
    launched->summary.push_back(std::string("HTTP gateway listening on ") + http_scheme + http_endpoint);
  }
  auto msgpack = start_msgpack(sys, o, *t, *launched, *access);
  if (!msgpack) {
    http->reset();
    topology::shutdown_node(sys, *launched);
    return leave(sys, fail_with(msgpack.error()));
  }
  if (*msgpack)
    launched->summary.push_back("msgpack gateway listening on " + o.msgpack_address + ":" +
                                std::to_string((*msgpack)->port()) + (access->tls ? " (TLS)" : ""));
  if (launched->ucx)
    launched->summary.push_back("KV transport: UCX on " + node->address + ":" + std::to_string(launched->ucx->port()));
  for (const std::string& line : launched->summary) std::printf("%s: %s\n", node_name.c_str(), line.c_str());
  std::fflush(stdout);
  spdlog::info("serving topology '{}' node {}; Ctrl-C to stop", t->cluster_name, node_name);
  const int sig = signals.wait();
  // First the gateways (they refuse new requests with 503 "draining" and let theirs finish),
  // then the engines (requests of other clients: run on for the grace period, then forwarded).
  stop_gateways(*http, *http_at, *msgpack);
  const std::optional<int32_t> requested = signals.requested_grace_ms();  // by `troupe drain`
  const int32_t grace_ms = requested && *requested >= 0 ? *requested : default_grace_ms;
  if (!launched->engines.empty() && grace_ms > 0) {
    spdlog::info("{}: draining: this node takes no new work; its requests run on for up to {} ms, then go "
                 "to other engines (a second signal stops at once)",
                 requested ? "troupe drain" : "signal " + std::to_string(sig), grace_ms);
    const topology::drain_counts n = topology::drain_node(sys, *launched, grace_ms, [&] { return signals.again(); });
    std::printf("%s: drained: %lld request(s) forwarded to other engines, %lld with their KV\n", node_name.c_str(),
                static_cast<long long>(n.forwarded), static_cast<long long>(n.with_kv));
    std::fflush(stdout);
  } else {
    spdlog::info("signal {}: shutting down", sig);
  }
  actors::unpublish_actor(sys, launched->entry().address(), *port);
  topology::shutdown_node(sys, *launched);
  return 0;
}

/// The flags of `serve` that replace the topology file by a generated one-node topology.
std::vector<CLI::Option*> add_generated_topology(CLI::App* cmd, serve_options& o) {
  std::vector<CLI::Option*> flags{
      cmd->add_option("--model,-m", o.model, "llama2.c checkpoint or GGUF model"),
      cmd->add_option("--tokenizer,-z", o.tokenizer, tokenizer_flag_help()),
      cmd->add_option("--host", o.address, "address to listen on"),
      cmd->add_option("--port", o.port, "port to listen on; 0 = any free one (printed)"),
  };
  for (CLI::Option* flag : o.engine.add_to(cmd)) flags.push_back(flag);
  const char* group = "Instead of --topology: serve one generated node";
  for (CLI::Option* flag : flags) flag->capture_default_str()->group(group);
  for (CLI::Option* flag : o.speculation.add_to(cmd, group)) flags.push_back(flag);
  return flags;
}

/// The flags of who may use the gateways (vLLM's names).
void add_access_flags(CLI::App* cmd, serve_options& o) {
  const char* group = "Access to the gateways (docs/security.md)";
  cmd->add_option("--api-key", o.api_keys,
                  "an API key clients must send (HTTP: Authorization: Bearer KEY; msgpack: an auth frame); repeat for "
                  "several; also TROUPE_API_KEY and [http] api_keys_file")
      ->group(group);
  cmd->add_flag("--metrics-public", o.metrics_public, "serve GET /metrics without a key")->group(group);
  cmd->add_option("--ssl-certfile", o.ssl_certfile, "serve HTTPS (and TLS msgpack) with this PEM certificate chain")
      ->check(CLI::ExistingFile)
      ->group(group);
  cmd->add_option("--ssl-keyfile", o.ssl_keyfile, "the PEM private key of --ssl-certfile")->check(CLI::ExistingFile)->group(group);
  cmd->add_option("--allowed-origins", o.allowed_origins,
                  "origins (scheme://host[:port], or *) whose browser pages may call the HTTP API (CORS); repeat or "
                  "separate with commas; default none")
      ->group(group);
}

/// `serve` (defaults: the bundled one-node topology, the balancer's node; or a generated node
/// with --model and friends) and `node` (both required) run the same thing.
action add_serving(CLI::App& app, const char* name, const char* description, bool required) {
  auto o = std::make_shared<serve_options>();
  CLI::App* cmd = app.add_subcommand(name, description);
  CLI::Option* topology = cmd->add_option("--topology,-T", o->topology, "topology file (TOML)");
  CLI::Option* node = cmd->add_option("--node", o->node, required ? "the node to run" : "node to run (default: the load balancer's)");
  cmd->add_option("--http-port", o->http_port,
                  "serve the OpenAI-compatible HTTP API on this port (0 = any free one, printed); overrides the "
                  "topology's [http] port")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--http-host", o->http_address,
                  "address of the HTTP API (default: the topology's [http] host, else 127.0.0.1)");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "the model's names in the HTTP API (repeatable, or several after one flag): the first is the id "
                  "responses and /v1/models report, every one is accepted in a request's model (default: the model "
                  "file's name without extension; overrides the topology's [http] served_model_names)")
      ->check([](const std::string& name) {
        return name.empty() || name.size() > topology::served_model_name_bytes_max
                   ? "a model name has 1 to " + std::to_string(topology::served_model_name_bytes_max) + " bytes"
                   : std::string();
      });
  cmd->add_option("--pooling", o->pooling,
                  "how /v1/embeddings pools the final hidden states where a request names none: last (the "
                  "default, vLLM's for decoder models: the only position that saw the whole input), mean or cls")
      ->check(CLI::IsMember({"last", "mean", "cls"}));
  cmd->add_option("--msgpack-port", o->msgpack_port,
                  "serve the msgpack protocol (docs/msgpack.md) on this port (0 = any free one, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--msgpack-host", o->msgpack_address, "address of the msgpack protocol")->capture_default_str();
  cmd->add_flag("--insecure", o->insecure,
                "allow an unauthenticated plaintext CAF port on a non-loopback address (a topology without [tls])");
  cmd->add_option("--drain-grace-ms", o->drain_grace_ms,
                  "on SIGINT/SIGTERM, let this node's requests run this long before they go to other engines "
                  "(default: the topology's [cluster] drain_grace_ms, 30000; 0 = stop at once)")
      ->check(CLI::Range(0, 3600000));
  add_access_flags(cmd, *o);
  o->gateway.add_to(cmd);
  o->chat.add_to(cmd);
  if (required) {
    topology->required();
    node->required();
    return [o] { return run_serve(*o); };
  }
  topology->capture_default_str();
  const std::vector<CLI::Option*> generated = add_generated_topology(cmd, *o);
  for (CLI::Option* flag : generated) flag->excludes(topology);
  return [o, generated] {
    o->generated =
        std::any_of(generated.begin(), generated.end(), [](const CLI::Option* f) { return f->count() > 0; });
    return run_serve(*o);
  };
}

}  // namespace

action add_serve(CLI::App& app) {
  return add_serving(app, "serve", "Run one node of a topology (default: the bundled model, one node)", false);
}

action add_node(CLI::App& app) {
  return add_serving(app, "node", "Run one named node of a multi-node topology (troupe up runs them all)", true);
}

}  // namespace troupe::cli
