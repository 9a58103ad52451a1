#include "topology/launch.hpp"

#include <caf/all.hpp>

#include "actors/engine_actor.hpp"
#include "actors/load_balancer_actor.hpp"

namespace troupe::topology {
namespace {

std::string where(const engine_spec& e) { return "engine '" + e.name + "': "; }

expected<caf::actor> launch_engine(caf::actor_system& sys, const engine_spec& e, int32_t max_waiting,
                                   const launch_options& options,
                                   std::shared_ptr<const tokenizer>& tok) {
  auto ck = model::checkpoint::load(e.model_path);
  if (!ck) return fail(ck.error().code, where(e) + ck.error().message);
  auto t = tokenizer::load(e.tokenizer_path, ck->config().vocab_size);
  if (!t) return fail(t.error().code, where(e) + t.error().message);
  if (!tok) tok = std::make_shared<const tokenizer>(std::move(*t));
  actors::engine_options o;
  o.checkpoint = std::make_shared<const model::checkpoint>(std::move(*ck));
  o.bos_id = tok->bos_id();
  o.eos_id = tok->eos_id();
  o.config = e.config;
  o.max_waiting = max_waiting;
  o.executor_threads = e.executor_threads;
  o.step_log = e.step_log;
  o.detached_executor = options.detached_executors;
  auto engine = actors::spawn_engine(sys, o);
  if (!engine) return fail(engine.error().code, where(e) + engine.error().message);
  return engine;
}

}  // namespace

expected<launched_node> launch_node(caf::actor_system& sys, const topology& t, const std::string& node_name,
                                    const launch_options& options) {
  const node_spec* node = t.find_node(node_name);
  if (!node) return fail(errc::not_found, "the topology has no node '" + node_name + "'");
  launched_node out;
  for (const engine_spec& e : t.engines) {
    if (e.node != node_name) continue;
    auto engine = launch_engine(sys, e, t.load_balancer.max_waiting, options, out.tok);
    if (!engine) {
      shutdown_node(sys, out);
      return tl::unexpected(engine.error());
    }
    out.engines.push_back(*engine);
    out.engine_names.push_back(e.name);
    out.summary.push_back("engine " + e.name + " (" + to_string(e.role) + "): " + e.model_path + ", " +
                          std::to_string(e.config.num_kv_blocks) + " KV blocks of " +
                          std::to_string(e.config.block_size) + " tokens, step executor on its own thread" +
                          (e.executor_threads > 1 ? " with " + std::to_string(e.executor_threads) + " kernel threads" : ""));
  }
  if (t.load_balancer.node == node_name) {
    if (out.engines.empty()) {
      shutdown_node(sys, out);
      return fail(errc::invalid_argument, "node '" + node_name +
                                              "' runs the load balancer but no engine; balancing over other "
                                              "nodes' engines is not supported yet");
    }
    actors::load_balancer_options lb;
    lb.engines = out.engines;
    lb.tok = out.tok;
    lb.seed_base = options.seed_base;
    out.load_balancer = actors::spawn_load_balancer(sys, std::move(lb));
    out.summary.push_back("load_balancer over " + std::to_string(out.engines.size()) + " engine(s)");
  }
  return out;
}

void shutdown_node(caf::actor_system& sys, const launched_node& node) {
  if (node.load_balancer) caf::anon_send_exit(node.load_balancer, caf::exit_reason::user_shutdown);
  for (const caf::actor& e : node.engines) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  sys.await_all_actors_done();
}

topology single_node(const std::string& model_path, const std::string& tokenizer_path) {
  topology t;
  t.cluster_name = "local";
  t.nodes.push_back(node_spec{"local", "127.0.0.1", 0});
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
