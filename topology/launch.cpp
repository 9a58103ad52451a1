#include "topology/launch.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/cache_tier_actor.hpp"
#include "actors/system/clock.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/peer_links.hpp"
#include "actors/disk_tier_actor.hpp"
#include "actors/system/door.hpp"
#include "actors/engine_actor.hpp"
#include "actors/expert_placement_actor.hpp"
#include "actors/load_balancer_actor.hpp"
#include "actors/node_actor.hpp"
#include "actors/system/sync_guard.hpp"
#include "runtime/balance/placement.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/model/kv_cache.hpp"
#include "runtime/model/layout_cache.hpp"
#include "runtime/tokenizer/served_template.hpp"
#include "actors/edge/disk_tier.hpp"
#include "topology/load_progress.hpp"

namespace troupe::topology {
namespace {

std::string where(const engine_spec& e) { return "engine '" + e.name + "': "; }

/// The node's shared resources an engine uses.
struct node_resources {
  const node_spec& node;
  std::shared_ptr<transport::ucx_transport> ucx;
  actors::cache_tier_actor host_tier;  ///< none without host_tier_blocks
};

/// The first engine of `node` when the node runs a host tier (host_tier_blocks and an engine:
/// the tier takes that engine's block size), else null.
const engine_spec* host_tier_engine(const topology& t, const node_spec& node) {
  return node.host_tier_blocks == 0 ? nullptr : t.first_engine_on(node.name);
}

/// A node's cache tier actors: the host-memory tier and the disk tier below it, if any.
struct host_tiers {
  actors::cache_tier_actor host;
  actors::disk_tier_actor disk;
};

/// The node's host-memory tier, with the block size its engines share (topology.cpp checks
/// that they do), over a disk tier actor of its own with disk_tier_dir (detached as the
/// executors are: its file I/O then blocks no thread of CAF's scheduler), which the host tier
/// waits for at most 4/5 of the engines' fetch timeout, leaving the rest for what it holds to
/// reach them in time; none when the node has no host_tier_blocks or no engine.
expected<host_tiers> spawn_host_tier(caf::actor_system& sys, const topology& t, const node_spec& node,
                                     bool detached) {
  const engine_spec* engine = host_tier_engine(t, node);
  if (engine == nullptr) return host_tiers{};
  kv::tier_config config;
  config.block_size = engine->config.block_size;
  config.capacity_blocks = node.host_tier_blocks;
  auto store = kv::tier_store::create(config);
  if (!store) return fail(store.error().code, "node '" + node.name + "': host tier: " + store.error().message);
  host_tiers out;
  if (!node.disk_tier_dir.empty()) {
    // On the actor system's clock (the tier actors'): the blocks found start their lifetimes now.
    auto opened = tiers::disk_tier::open({node.disk_tier_dir, int64_t{node.disk_tier_mib} << 20, config.block_size},
                                         actors::ns_since_epoch(sys.clock().now()));
    if (!opened) return fail(opened.error().code, "node '" + node.name + "': disk tier: " + opened.error().message);
    out.disk = actors::spawn_disk_tier(sys, std::make_shared<tiers::disk_tier>(std::move(*opened)), {}, detached);
  }
  // A fetch without a budget (a fixed fetch timeout, or an engine without a calibration) and a
  // stats query wait for the disk tier 4/5 of the engines' bound, leaving the rest for the answer.
  const int64_t bound_ns = engine::unbudgeted_fetch_timeout_ns(int64_t{node.host_tier_fetch_timeout_ms} * 1'000'000);
  const auto disk_timeout = std::chrono::nanoseconds(bound_ns * 4 / 5);
  out.host = actors::spawn_cache_tier(sys, std::move(*store), out.disk, disk_timeout);
  return out;
}

balance::engine_kind kind_of(engine_role role) {
  switch (role) {
    case engine_role::mixed: return balance::engine_kind::mixed;
    case engine_role::prefill: return balance::engine_kind::prefill;
    case engine_role::decode: return balance::engine_kind::decode;
  }
  return balance::engine_kind::mixed;
}

/// Whether engine `e`'s model is read as float32 views (load_options::float32_views): an F32
/// file's experts move between shards only so, and the engine and its shard hosts read it alike.
bool reads_float32_views(const engine_spec& e) { return e.expert_window_steps > 0; }

/// What `node`'s node actor answers to `Atom` (its engines, or the expert shards it hosts: `what`
/// names them in errors), trying until the deadline: the other node may still be starting, or be
/// frozen (then the handshake never completes).
template <class Answer, class Atom>
expected<Answer> ask_node(caf::actor_system& sys, const node_spec& node, int32_t timeout_ms,
                          const std::atomic<bool>* stop, const std::string& what) {
  const std::string endpoint = node.address + ":" + std::to_string(node.port);
  actors::reach_options ro;
  ro.timeout = std::chrono::milliseconds(timeout_ms);
  ro.stop = stop;
  spdlog::info("reaching node '{}' at {} for its {} (up to {} ms)", node.name, endpoint, what, timeout_ms);
  auto remote = actors::reach<actors::node_actor>(sys, node.address, node.port, ro);
  if (!remote && remote.error().code == errc::cancelled)
    return fail(errc::cancelled, "start-up stopped by a signal while reaching node '" + node.name + "' at " + endpoint);
  if (!remote)
    return fail(errc::unavailable, "cannot reach node '" + node.name + "' at " + endpoint + " within " +
                                       std::to_string(timeout_ms) + " ms: " + remote.error().message);
  actors::check_may_block("asking another node for its engines or expert shards");
  caf::scoped_actor self{sys};
  expected<Answer> out = fail(errc::unavailable, "no answer");
  self->request(*remote, std::chrono::milliseconds(timeout_ms), Atom::value)
      .receive([&](Answer& answer) { out = std::move(answer); },
               [&](caf::error& err) {
                 out = fail(errc::unavailable,
                            "node '" + node.name + "' at " + endpoint + " did not list its " + what + ": " + sys.render(err));
               });
  return out;
}

/// The experts `shard` holds: its experts in each of the model's `n_layers` layers.
std::vector<moe::expert_id> experts_of(const expert_shard_spec& shard, int32_t n_layers) {
  std::vector<moe::expert_id> out;
  for (int32_t layer = 0; layer < n_layers; layer++)
    for (int32_t expert : shard.experts) out.push_back({layer, expert});
  return out;
}

/// "expert_shard #i (engine 'e', node 'n')", 1-based as in the topology's errors.
std::string shard_label(const topology& t, size_t index) {
  const expert_shard_spec& s = t.expert_shards[index];
  return "expert_shard #" + std::to_string(index + 1) + " (engine '" + s.engine + "', node '" + s.node + "')";
}

/// The shard's experts exist in `ck`, its engine's model, which must be an MoE.
expected<void> check_shard(const topology& t, size_t index, const model::checkpoint& ck) {
  const expert_shard_spec& s = t.expert_shards[index];
  if (!ck.moe())
    return fail(errc::invalid_argument, shard_label(t, index) + ": the engine's model " + ck.path() +
                                            " is not a mixture of experts (troupe moe-split makes one)");
  if (s.experts.back() >= ck.moe()->n_experts)
    return fail(errc::invalid_argument, shard_label(t, index) + ": expert " + std::to_string(s.experts.back()) +
                                            " does not exist: the model has " +
                                            std::to_string(ck.moe()->n_experts) + " experts (0.." +
                                            std::to_string(ck.moe()->n_experts - 1) + ")");
  return {};
}

/// The shards a shard host runs for other nodes' engines, in topology order (each engine's
/// model loaded once).
expected<actors::expert_shard_list> spawn_hosted_shards(caf::actor_system& sys, const topology& t,
                                                        const std::string& node_name) {
  actors::expert_shard_list out;
  std::map<std::string, model::checkpoint> models;  // by engine
  for (size_t i = 0; i < t.expert_shards.size(); i++) {
    const expert_shard_spec& s = t.expert_shards[i];
    const engine_spec& e = *t.find_engine(s.engine);
    if (s.node != node_name || e.node == node_name) continue;
    auto it = models.find(e.name);
    if (it == models.end()) {
      model::load_options load;
      load.float32_views = reads_float32_views(e);
      auto ck = model::checkpoint::load(e.model_path, load);
      if (!ck) return fail(ck.error().code, shard_label(t, i) + ": " + ck.error().message);
      it = models.emplace(e.name, std::move(*ck)).first;
    }
    if (auto ok = check_shard(t, i, it->second); !ok) return tl::unexpected(ok.error());
    out.push_back(actors::spawn_expert_shard(sys, it->second, experts_of(s, it->second.config().n_layers),
                                             e.config.kernels));
  }
  return out;
}

/// Engine `e`'s expert shard actors in topology order: those on its node spawned here (into
/// `spawned`; going with `owner` if given), those on shard hosts reached through their node
/// actors (up to the balancer's connect_timeout_ms each).
expected<actors::expert_shard_list> find_engine_shards(caf::actor_system& sys, const topology& t, const engine_spec& e,
                                                       const model::checkpoint& ck, const std::atomic<bool>* stop,
                                                       const caf::actor& owner, actors::expert_shard_list& spawned) {
  actors::expert_shard_list shards;
  std::map<std::string, actors::expert_shard_list> hosted;  // by shard host
  std::map<std::string, size_t> next;                       // per shard host: its next shard's index
  for (size_t i = 0; i < t.expert_shards.size(); i++) {
    const expert_shard_spec& s = t.expert_shards[i];
    const size_t index_on_node = s.node == e.node ? 0 : next[s.node]++;  // counts every engine's shards there
    if (s.engine != e.name) continue;
    if (s.node == e.node) {
      shards.push_back(
          actors::spawn_expert_shard(sys, ck, experts_of(s, ck.config().n_layers), e.config.kernels, owner));
      spawned.push_back(shards.back());
      continue;
    }
    auto it = hosted.find(s.node);
    if (it == hosted.end()) {
      auto listed = ask_node<actors::expert_shard_list, actors::expert_shards_atom>(
          sys, *t.find_node(s.node), t.load_balancer.connect_timeout_ms, stop, "expert shards");
      if (!listed) return fail(listed.error().code, shard_label(t, i) + ": " + listed.error().message);
      it = hosted.emplace(s.node, std::move(*listed)).first;
    }
    if (index_on_node >= it->second.size())
      return fail(errc::invalid_argument, shard_label(t, i) + ": node '" + s.node + "' hosts " +
                                              std::to_string(it->second.size()) +
                                              " expert shard(s), fewer than the topology places there: a different "
                                              "topology file?");
    shards.push_back(it->second[index_on_node]);
  }
  return shards;
}

/// Engine `e`'s expert shards (topology [[expert_shard]]), found as find_engine_shards does, the
/// placement they make (every expert must be on some shard), its reassignment options, and how
/// to find them again after a failure (a shard host restarted: its new shards are reached, and
/// the local ones spawned afresh, so that all hold the initial placement again).
expected<void> plug_expert_shards(caf::actor_system& sys, const topology& t, const engine_spec& e,
                                  const std::atomic<bool>* stop, actors::engine_options& o,
                                  actors::expert_shard_list& spawned) {
  const model::checkpoint& ck = *o.checkpoint;
  std::vector<std::vector<int32_t>> holders(static_cast<size_t>(ck.moe() ? ck.moe()->n_experts : 0));  // per expert
  int32_t num_shards = 0, most_held = 0;
  for (size_t i = 0; i < t.expert_shards.size(); i++) {
    const expert_shard_spec& s = t.expert_shards[i];
    if (s.engine != e.name) continue;
    if (auto ok = check_shard(t, i, ck); !ok) return ok;
    for (int32_t expert : s.experts) holders[static_cast<size_t>(expert)].push_back(num_shards);
    most_held = std::max(most_held, static_cast<int32_t>(s.experts.size()));
    num_shards++;
  }
  if (num_shards == 0) return {};
  for (size_t expert = 0; expert < holders.size(); expert++)
    if (holders[expert].empty())
      return fail(errc::invalid_argument, where(e) + "expert " + std::to_string(expert) +
                                              " is on none of its [[expert_shard]] entries: together they must hold "
                                              "all " + std::to_string(holders.size()) + " experts");
  auto local = std::make_shared<actors::expert_shard_list>();  // the engine's shards on its node, now
  auto shards = find_engine_shards(sys, t, e, ck, stop, caf::actor{}, *local);
  if (!shards) return tl::unexpected(shards.error());
  spawned.insert(spawned.end(), local->begin(), local->end());
  const int32_t n_layers = ck.config().n_layers;
  std::vector<std::vector<int32_t>> replicas;
  for (int32_t layer = 0; layer < n_layers; layer++) replicas.insert(replicas.end(), holders.begin(), holders.end());
  if (e.expert_window_steps > 0) {
    if (ck.stored() != nullptr)
      return fail(errc::invalid_argument, where(e) + "expert_window_steps: moving experts needs a float32 mixture; " +
                                              ck.path() + " keeps its experts in their stored types, which do not "
                                              "move between shards (docs/moe.md, \"GGUF mixtures\")");
    moe::reassignment_options r;
    r.window_steps = e.expert_window_steps;
    r.capacity = e.expert_capacity > 0 ? e.expert_capacity : most_held + 1;
    r.moe_lb_max = e.expert_moe_lb_max;
    r.move_steps_max = e.expert_move_steps_max;
    o.expert_reassignment = r;
  }
  // Finding them again runs on the executor's thread; the topology and model are held by value.
  auto find = [&sys, topo = std::make_shared<const topology>(t), name = e.name, model = o.checkpoint,
               local](const caf::actor& owner) -> expected<actors::expert_shard_list> {
    actors::expert_shard_list fresh;
    auto found = find_engine_shards(sys, *topo, *topo->find_engine(name), *model, nullptr, owner, fresh);
    for (const actors::expert_shard_actor& s : found ? *local : fresh) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    if (found) *local = std::move(fresh);
    return found;
  };
  o.experts = std::make_shared<actors::expert_shards>(
      std::make_shared<actors::actor_dispatch>(sys, std::move(*shards), std::chrono::milliseconds(e.expert_timeout_ms)),
      moe::expert_placement::of_replicas(n_layers, ck.moe()->n_experts, num_shards, std::move(replicas)),
      std::move(find));
  return {};
}

/// Warns when `ck`'s weights and engine `e`'s KV pool, full, would not fit in 90% of the memory
/// available: the pool's pages are resident only as blocks are written (page_buffer), so the
/// engine starts, and a busy one would later run the machine out of memory.
void warn_if_memory_short(const engine_spec& e, const model::checkpoint& ck, kv::kv_dtype kv) {
  const int64_t pool = model::kv_cache::bytes_of(ck.config(), e.config.num_kv_blocks, e.config.block_size, kv);
  const int64_t available = memory_available();
  if (available < 0 || ck.resident_bytes() + pool <= available / 10 * 9) return;
  spdlog::warn("engine '{}': its weights ({} MiB) and a full KV pool ({} MiB, {} blocks) exceed 90% of the memory "
               "available ({} MiB): lower kv_blocks (or --ctx-size) before the pool fills",
               e.name, ck.resident_bytes() >> 20, pool >> 20, e.config.num_kv_blocks, available >> 20);
}

/// Engine `e` of `t`, its executor and its expert shards on this node (into `spawned`).
expected<actors::engine_actor> launch_engine(caf::actor_system& sys, const topology& t, const engine_spec& e,
                                   const launch_options& options, std::shared_ptr<const tokenizer>& tok,
                                   const node_resources& shared, uint64_t ucx_tag_base, int32_t& context_tokens,
                                   actors::expert_shard_list& spawned) {
  const auto load_start = std::chrono::steady_clock::now();
  model::load_options load;  // weights pre-faulted: read from disk here
  load.progress = load_progress(e.model_path);
  load.max_context = e.max_context;
  load.layout_cache = e.layout_cache == "off" ? "" : e.layout_cache.empty() ? model::default_layout_cache_dir() : e.layout_cache;
  load.layout_cache_report = [name = e.name](const std::string& note) { spdlog::info("engine '{}': {}", name, note); };
  load.float32_views = reads_float32_views(e);
  auto ck = model::checkpoint::load(e.model_path, load);
  if (!ck) return fail(ck.error().code, where(e) + ck.error().message);
  if (!ck->layout_note().empty()) spdlog::info("engine '{}': {}", e.name, ck->layout_note());
  spdlog::info("engine '{}': loaded {} in {} ms{}", e.name, e.model_path,
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - load_start)
                   .count(),
               ck->q80()   ? " (Q8_0, group size " + std::to_string(ck->q80()->group_size) + ")"
               : ck->moe() ? " (mixture of experts: " + std::to_string(ck->moe()->n_experts) + " experts, top-k " +
                                 std::to_string(ck->moe()->top_k) + ")"
                           : "");
  const kv::kv_dtype kv = e.config.kv_cache_dtype.value_or(model::default_kv_dtype(*ck));
  if (auto ok = model::check_kv_dtype(ck->config(), kv); !ok) return fail(ok.error().code, where(e) + ok.error().message);
  warn_if_memory_short(e, *ck, kv);
  context_tokens = std::max(context_tokens, ck->config().seq_len);
  auto loaded = tokenizer::load(e.tokenizer_path, ck->config().vocab_size);
  if (!loaded) return fail(loaded.error().code, where(e) + loaded.error().message);
  actors::engine_options o;
  o.vocabulary = grammar::vocabulary_of(*loaded, engine::end_token_ids(e.config, loaded->end_ids()));
  if (!tok) tok = std::make_shared<const tokenizer>(std::move(*loaded));
  o.checkpoint = std::make_shared<const model::checkpoint>(std::move(*ck));
  if (e.config.speculation.drafter == spec::drafter_kind::draft_model) {
    auto draft = model::checkpoint::load(e.config.speculation.draft_model);
    if (!draft) return fail(draft.error().code, where(e) + "draft model: " + draft.error().message);
    if (auto ok = engine::step_executor::check_draft_model(o.checkpoint->config(), draft->config()); !ok)
      return fail(ok.error().code, where(e) + ok.error().message);
    if (auto ok = model::check_kv_dtype(draft->config(), kv); !ok)
      return fail(ok.error().code, where(e) + "draft model: " + ok.error().message);
    o.draft_checkpoint = std::make_shared<const model::checkpoint>(std::move(*draft));
  }
  o.end_ids = tok->end_ids();
  o.config = e.config;
  o.config.kv_cache_dtype = kv;  // resolved: the engine prices its blocks' bytes by it
  o.max_waiting = t.load_balancer.max_waiting;
  o.executor_threads = e.executor_threads;
  o.step_log = e.step_log;
  o.detached_executor = options.detached_executors;
  o.kv_sender = shared.ucx;
  o.kv_tag_base = ucx_tag_base;
  o.host_tier = shared.host_tier;
  // Another node's tier may hold a prefix the balancer sends this engine to fetch.
  o.cluster_tiers = std::any_of(t.nodes.begin(), t.nodes.end(), [&](const node_spec& n) {
    return n.name != e.node && host_tier_engine(t, n) != nullptr;
  });
  o.config.tier_fetch_timeout_ns = int64_t{shared.node.host_tier_fetch_timeout_ms} * 1'000'000;
  if (auto ok = plug_expert_shards(sys, t, e, options.stop, o, spawned); !ok) return tl::unexpected(ok.error());
  auto engine = actors::spawn_engine(sys, o);
  if (!engine) return fail(engine.error().code, where(e) + engine.error().message);
  return engine;
}

/// Every engine of the topology for the balancer: this node's, and the other nodes' reached
/// over the network, in topology order.
expected<std::vector<actors::balanced_engine>> cluster_engines(caf::actor_system& sys, const topology& t,
                                                               const std::string& node_name,
                                                               const launched_node& local,
                                                               const std::atomic<bool>* stop) {
  std::map<std::string, size_t> num_placed;  // engines the topology places on each node
  for (const engine_spec& e : t.engines) num_placed[e.node]++;
  std::map<std::string, actors::engine_list> by_node;
  by_node[node_name] = local.engines;
  std::map<std::string, actors::cache_tier_actor> tier_of_node;  // nodes with a host tier
  tier_of_node[node_name] = local.host_tier;
  std::map<std::string, size_t> next;  // per node: the index of its next engine
  std::vector<actors::balanced_engine> out;
  for (const engine_spec& e : t.engines) {
    const node_spec& node = *t.find_node(e.node);
    auto it = by_node.find(e.node);
    if (it == by_node.end()) {
      auto remote = ask_node<actors::engine_list, actors::engines_atom>(sys, node, t.load_balancer.connect_timeout_ms,
                                                                         stop, "engines");
      if (!remote) return tl::unexpected(remote.error());
      if (remote->size() != num_placed[e.node])
        return fail(errc::invalid_argument, "node '" + e.node + "' runs " + std::to_string(remote->size()) +
                                                " engine(s) but the topology places " +
                                                std::to_string(num_placed[e.node]) + " there: a different topology file?");
      it = by_node.emplace(e.node, std::move(*remote)).first;
      if (host_tier_engine(t, node) != nullptr) {
        auto tier = ask_node<actors::cache_tier_actor, actors::host_tier_atom>(sys, node, t.load_balancer.connect_timeout_ms,
                                                                               stop, "host tier");
        if (!tier) return tl::unexpected(tier.error());
        tier_of_node[e.node] = *tier;
      }
    }
    actors::balanced_engine b;
    b.index_on_node = next[e.node]++;
    b.actor = it->second.at(b.index_on_node);
    if (e.node != node_name) {  // another process: reachable again after a restart
      b.node_address = node.address;
      b.node_port = node.port;
    }
    b.name = e.name;
    b.node = e.node;
    b.kind = kind_of(e.role);
    b.max_num_seqs = e.config.scheduler.max_num_seqs;
    b.kv_capacity_tokens = static_cast<int64_t>(e.config.num_kv_blocks) * e.config.block_size;
    b.block_size = e.config.block_size;
    b.kv_address = node.address;
    b.kv_port = node.kv_port;
    b.host_tier = tier_of_node[e.node];
    b.host_tier_blocks = node.host_tier_blocks;
    if (!node.disk_tier_dir.empty())  // a block holds at least its token ids
      b.disk_tier_blocks_max = (int64_t{node.disk_tier_mib} << 20) / (int64_t{e.config.block_size} * 4);
    out.push_back(std::move(b));
  }
  return out;
}

/// This node's UCX transport for KV (kv_transfer = "ucx" and an engine here): payloads within
/// [limits] max_message_mib, from the topology's nodes only (issue 47).
expected<void> open_ucx(const topology& t, const node_spec& node, launched_node& out) {
  if (t.kv_transfer != kv_transfer_kind::ucx || t.first_engine_on(node.name) == nullptr) return {};
  transport::ucx_options ucx_options;
  ucx_options.address = node.address;
  ucx_options.port = node.kv_port;
  ucx_options.max_message_bytes = node_network_limits(t).max_message_bytes;
  for (const node_spec& n : t.nodes) ucx_options.allowed_peers.push_back(n.address);
  auto ucx = transport::ucx_transport::create(ucx_options);
  if (!ucx) return fail(ucx.error().code, "node '" + node.name + "': " + ucx.error().message);
  out.ucx = std::move(*ucx);
  return {};
}

/// The node's host tier and the disk tier below it, if any (into `out`).
expected<void> spawn_tiers(caf::actor_system& sys, const topology& t, const node_spec& node,
                           const launch_options& options, launched_node& out) {
  auto tier = spawn_host_tier(sys, t, node, options.detached_executors);
  if (!tier) return tl::unexpected(tier.error());
  if (!tier->host) return {};
  out.host_tier = tier->host;
  out.disk_tier = tier->disk;
  out.summary.push_back("host cache tier: " + std::to_string(node.host_tier_blocks) + " KV blocks" +
                        (node.disk_tier_dir.empty() ? std::string()
                                                    : ", over a disk tier of " + std::to_string(node.disk_tier_mib) +
                                                          " MiB in " + node.disk_tier_dir));
  return {};
}

/// The expert shards the topology places on this node, for its own engines or another node's
/// (into `out`); returns them, what the node actor lists.
expected<actors::expert_shard_list> spawn_shards(caf::actor_system& sys, const topology& t, const std::string& node_name,
                                                 launched_node& out) {
  auto hosted = spawn_hosted_shards(sys, t, node_name);
  if (!hosted) return hosted;
  out.expert_shards = *hosted;
  for (const expert_shard_spec& s : t.expert_shards) {
    if (s.node != node_name) continue;
    std::string experts;
    for (int32_t x : s.experts) experts += (experts.empty() ? "" : ", ") + std::to_string(x);
    out.summary.push_back("expert shard of engine " + s.engine + ": experts [" + experts + "] of every layer" +
                          (t.find_engine(s.engine)->node == node_name ? "" : " (hosted for another node)"));
  }
  return hosted;
}

/// The node's engines, each with its executor and expert shards (into `out`); returns the
/// largest context of their checkpoints.
expected<int32_t> spawn_engines(caf::actor_system& sys, const topology& t, const node_spec& node,
                                const launch_options& options, launched_node& out) {
  int32_t context_tokens = 0;
  const node_resources shared{node, out.ucx, out.host_tier};
  for (size_t i = 0; i < t.engines.size(); i++) {
    const engine_spec& e = t.engines[i];
    if (e.node != node.name) continue;
    // UCX tags: 40 bits of transfer counter under the engine's topology index, unique cluster-wide.
    auto engine = launch_engine(sys, t, e, options, out.tok, shared, static_cast<uint64_t>(i + 1) << 40,
                                context_tokens, out.expert_shards);
    if (!engine) return tl::unexpected(engine.error());
    out.engines.push_back(*engine);
    out.engine_names.push_back(e.name);
    out.summary.push_back("engine " + e.name + " (" + to_string(e.role) + "): " + e.model_path + ", " +
                          std::to_string(e.config.num_kv_blocks) + " KV blocks of " +
                          std::to_string(e.config.block_size) + " tokens, step executor on its own thread" +
                          (e.executor_threads > 1 ? " with " + std::to_string(e.executor_threads) + " kernel threads" : ""));
  }
  return context_tokens;
}

/// The balancer's tokenizer and context: a local engine's, else (no engine here) the first
/// engine's.
expected<void> load_balancer_tokenizer(const topology& t, launched_node& out) {
  if (out.tok) return {};
  const engine_spec& first = t.engines.front();
  model::load_options load;
  load.max_context = first.max_context;
  auto ck = model::checkpoint::load(first.model_path, load);
  if (!ck) return fail(ck.error().code, ck.error().message);
  auto tok = tokenizer::load(first.tokenizer_path, ck->config().vocab_size);
  if (!tok) return fail(tok.error().code, tok.error().message);
  out.tok = std::make_shared<const tokenizer>(std::move(*tok));
  out.context_tokens = ck->config().seq_len;
  return {};
}

/// The load balancer's options from the topology, over `engines` (every engine of the cluster).
expected<actors::load_balancer_options> balancer_options(const topology& t, const std::string& node_name,
                                                         const launch_options& options, int32_t context_tokens,
                                                         std::vector<actors::balanced_engine> engines,
                                                         const std::shared_ptr<const tokenizer>& tok) {
  actors::load_balancer_options lb;
  lb.engines = std::move(engines);
  lb.tok = tok;
  lb.seed_base = options.seed_base;
  lb.draw_request_id = actors::random_request_id;
  const std::vector<std::string> balancers = t.load_balancer.all_nodes();
  if (balancers.size() > 1) {  // disjoint ids: balancer i's ids are i modulo balancers_max
    const auto index = static_cast<int64_t>(std::find(balancers.begin(), balancers.end(), node_name) - balancers.begin());
    constexpr int64_t low_bits = static_cast<int64_t>(balance::balancers_max) - 1;
    lb.draw_request_id = [index] { return (actors::random_request_id() & ~low_bits) | index; };
  }
  lb.prefill_tier_bounds = t.load_balancer.prefill_tier_bounds;
  lb.router = t.load_balancer.router;
  lb.prefix_weight = t.load_balancer.prefix_weight;
  lb.rate_limit_per_s = t.load_balancer.rate_limit_per_s;
  lb.rate_limit_burst = t.load_balancer.rate_limit_burst;
  lb.report_interval_ms = t.load_balancer.report_interval_ms;
  lb.heartbeat_interval_ms = t.load_balancer.heartbeat_interval_ms;
  lb.heartbeat_timeout_ms = t.load_balancer.heartbeat_timeout_ms;
  lb.rejoin_interval_ms = t.load_balancer.rejoin_interval_ms;
  lb.max_pending_per_client = t.limits.max_pending_per_client;
  jinja_chat_options chat_options = jinja_options_for(*tok, options.template_date);
  if (options.chat_template_jinja) chat_options.source_name = options.chat_template_name;
  auto chat = choose_served_template(t.load_balancer.chat_template, options.chat_template_jinja, *tok,
                                     std::move(chat_options));
  if (!chat) return tl::unexpected(chat.error());  // names the template (the model's, a file, a built-in)
  lb.chat = std::move(*chat);
  lb.tags = serve::output_tags::of(*tok);
  // Engines on other nodes may have a longer context than those loaded here: then the bound is
  // the largest context any checkpoint may declare.
  const bool all_local = std::all_of(t.engines.begin(), t.engines.end(),
                                     [&](const engine_spec& e) { return e.node == node_name; });
  lb.context_tokens = all_local ? context_tokens : 0;
  return lb;
}

/// On the balancer's node: every engine of the cluster (reaching the other nodes), then the
/// load balancer and its front (into `out`).
expected<void> spawn_balancer(caf::actor_system& sys, const topology& t, const std::string& node_name,
                              const launch_options& options, int32_t context_tokens, launched_node& out) {
  auto engines = cluster_engines(sys, t, node_name, out, options.stop);
  if (!engines) return tl::unexpected(engines.error());
  if (auto ok = load_balancer_tokenizer(t, out); !ok) return ok;
  auto lb = balancer_options(t, node_name, options, context_tokens, std::move(*engines), out.tok);
  if (!lb) return tl::unexpected(lb.error());
  out.chat = std::make_shared<const served_template>(lb->chat);
  if (context_tokens > 0) out.context_tokens = context_tokens;
  const size_t num_engines = lb->engines.size();
  out.summary.push_back("chat template: " + lb->chat.description());
  out.load_balancer = actors::spawn_load_balancer(sys, std::move(*lb));
  out.front = actors::spawn_balancer_front(sys, out.load_balancer);
  out.summary.push_back("load_balancer over " + std::to_string(num_engines) + " engine(s) (" +
                        std::to_string(num_engines - out.engines.size()) + " on other nodes)");
  return {};
}

/// An engine node's direct connections to the engine nodes after it in the topology (each pair
/// once: a connection carries both ways), other than balancer nodes, which reach every engine
/// node themselves (actors/system/peer_links.hpp).
void link_peers(caf::actor_system& sys, const topology& t, const node_spec& node, launched_node& out) {
  actors::peer_link_options o;
  const auto self = std::find_if(t.nodes.begin(), t.nodes.end(), [&](const node_spec& n) { return n.name == node.name; });
  for (auto n = self == t.nodes.end() ? self : std::next(self); n != t.nodes.end(); ++n)
    if (t.first_engine_on(n->name) != nullptr && !t.load_balancer.runs_on(n->name)) o.peers.emplace_back(n->address, n->port);
  if (o.peers.empty()) return;
  o.attempt_timeout = std::chrono::milliseconds(t.load_balancer.connect_timeout_ms);
  o.retry_interval = std::chrono::milliseconds(t.load_balancer.rejoin_interval_ms > 0 ? t.load_balancer.rejoin_interval_ms
                                                                                       : 1000);
  out.peer_links = actors::spawn_peer_links(sys, std::move(o));
}

/// Every actor `t` places on `node` (into `out`, also when a step fails): tiers, expert shards,
/// engines, then the load balancer or the node actor.
expected<void> spawn_node(caf::actor_system& sys, const topology& t, const node_spec& node,
                          const launch_options& options, launched_node& out) {
  if (auto ok = spawn_tiers(sys, t, node, options, out); !ok) return ok;
  auto hosted = spawn_shards(sys, t, node.name, out);
  if (!hosted) return tl::unexpected(hosted.error());
  auto context_tokens = spawn_engines(sys, t, node, options, out);
  if (!context_tokens) return tl::unexpected(context_tokens.error());
  if (t.load_balancer.runs_on(node.name)) return spawn_balancer(sys, t, node.name, options, *context_tokens, out);
  out.node_actor = actors::spawn_node_actor(sys, {node.name, out.engines, *hosted, out.host_tier, options.drain});
  if (!out.engines.empty()) link_peers(sys, t, node, out);
  return {};
}

}  // namespace

int64_t memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}


expected<launched_node> launch_node(caf::actor_system& sys, const topology& t, const std::string& node_name,
                                    const launch_options& options) {
  const node_spec* node = t.find_node(node_name);
  if (!node) return fail(errc::not_found, "the topology has no node '" + node_name + "'");
  launched_node out;
  if (auto ok = open_ucx(t, *node, out); !ok) return tl::unexpected(ok.error());
  if (auto ok = spawn_node(sys, t, *node, options, out); !ok) {
    shutdown_node(sys, out);  // whatever was spawned before the step that failed
    return tl::unexpected(ok.error());
  }
  return out;
}

expected<uint16_t> publish_node(caf::actor_system& sys, const topology& t, const std::string& node_name,
                                const launched_node& node) {
  const node_spec* spec = t.find_node(node_name);
  TROUPE_ASSERT(spec != nullptr);
  TROUPE_ASSERT(actors::uses_tls(sys) == !t.tls_ca.empty());
  // The balancer's front where it runs, else the node actor; each with its typed interface.
  auto port = node.front ? actors::publish_actor(sys, node.front, spec->port, spec->address)
                         : actors::publish_actor(sys, node.node_actor, spec->port, spec->address);
  if (!port)
    return fail(errc::io_error, "cannot listen on " + spec->address + ":" + std::to_string(spec->port) + ": " +
                                    port.error().message);
  return *port;
}

actors::tls_credentials node_credentials(const topology& t, const std::string& node_name) {
  const node_spec* spec = t.find_node(node_name);
  TROUPE_ASSERT(spec != nullptr);
  if (t.tls_ca.empty()) return {};
  return {t.tls_ca, spec->certificate, spec->key};
}

actors::peer_rules node_peer_rules(const topology& t, const std::string& node_name) {
  actors::peer_rules rules;
  for (const node_spec& n : t.nodes) rules.node_names.push_back(n.name);
  rules.accept_clients = t.load_balancer.runs_on(node_name);
  return rules;
}

int32_t node_compute_threads(const topology& t, const std::string& node_name) {
  int32_t n = 0;
  for (const engine_spec& e : t.engines)
    if (e.node == node_name) n += e.executor_threads;
  return n;
}

actors::network_limits node_network_limits(const topology& t) {
  actors::network_limits out;
  out.max_message_bytes = static_cast<uint32_t>(t.limits.max_message_mib) << 20;
  out.idle_timeout_ms = t.limits.idle_timeout_ms;
  out.tls_handshake_timeout_ms = t.limits.tls_handshake_timeout_ms;
  out.max_connections = t.limits.max_connections;
  out.max_connections_per_address = t.limits.max_connections_per_address;
  return out;
}

drain_counts drain_node(caf::actor_system& sys, const launched_node& node, int32_t grace_ms,
                        const std::function<bool()>& stop_now) {
  drain_counts out;
  if (node.engines.empty()) return out;
  actors::check_may_block("draining a node");
  caf::scoped_actor self{sys};
  for (const actors::engine_actor& e : node.engines) self->send(e, actors::drain_atom::value, grace_ms);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms) + std::chrono::seconds(10);
  size_t pending = node.engines.size();
  while (pending > 0 && !stop_now() && std::chrono::steady_clock::now() < deadline) {
    // The engines answer the drain (sent, not requested) with an asynchronous message.
    self->receive(
        [&](int32_t n, int32_t with_kv) {
          out.forwarded += n;
          out.with_kv += with_kv;
          pending--;
        },
                  [&](caf::error& err) {
                    spdlog::warn("an engine did not drain: {}", sys.render(err));
                    pending--;
                  },
                  caf::after(std::chrono::milliseconds(100)) >> [] {});
  }
  if (pending > 0) spdlog::warn("{} engine(s) still had requests when the node stopped", pending);
  return out;
}

void shutdown_node(caf::actor_system& sys, const launched_node& node) {
  // The published doors, and the actors behind them.
  actors::close_door(caf::actor_cast<caf::strong_actor_ptr>(node.front));
  actors::close_door(caf::actor_cast<caf::strong_actor_ptr>(node.node_actor));
  if (node.load_balancer) caf::anon_send_exit(node.load_balancer, caf::exit_reason::user_shutdown);
  if (node.peer_links) caf::anon_send_exit(node.peer_links, caf::exit_reason::user_shutdown);
  for (const actors::engine_actor& e : node.engines) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  if (node.host_tier) caf::anon_send_exit(node.host_tier, caf::exit_reason::user_shutdown);
  if (node.disk_tier) caf::anon_send_exit(node.disk_tier, caf::exit_reason::user_shutdown);
  for (const actors::expert_shard_actor& s : node.expert_shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  sys.await_all_actors_done();
}

topology single_node(const std::string& model_path, const std::string& tokenizer_path) {
  topology t;
  t.cluster_name = "local";
  node_spec node;
  node.name = "local";
  node.address = "127.0.0.1";
  t.nodes.push_back(node);
  engine_spec e;
  e.name = "engine0";
  e.node = "local";
  e.model_path = model_path;
  e.tokenizer_path = tokenizer_path;
  t.engines.push_back(e);
  t.load_balancer.node = "local";
  return t;
}

}  // namespace troupe::topology
