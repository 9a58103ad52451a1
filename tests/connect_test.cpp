// Reaching a published actor as a typed interface (actors/system/connect.hpp): the published actor's
// interface is checked, so a client pointed at a node that runs no balancer is told so instead
// of sending messages nobody handles.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/system/connect.hpp"
#include "actors/system/protocols.hpp"
#include "tests/support/actor_config.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

/// One process's system with the io middleman (real threads: the middleman needs them).
std::unique_ptr<caf::actor_system> networked(caf::actor_system_config& cfg) {
  configure(cfg, /*deterministic=*/false);
  cfg.load<caf::io::middleman>();
  return std::make_unique<caf::actor_system>(cfg);
}

TEST(Connect, ReachChecksThePublishedInterface) {
  caf::actor_system_config server_cfg;
  auto server = networked(server_cfg);
  // A node actor, as a node without the balancer publishes it.
  const actors::node_actor node = server->spawn([]() -> actors::node_actor::behavior_type {
    return {[](actors::engines_atom) { return actors::engine_list{}; },
            [](actors::expert_shards_atom) { return actors::expert_shard_list{}; },
            [](actors::host_tier_atom) { return actors::cache_tier_actor{}; },
            [](actors::drain_atom, const std::string&, int32_t) { return int32_t{0}; }};
  });
  auto port = actors::publish_actor(*server, node, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;

  caf::actor_system_config client_cfg;
  auto client = networked(client_cfg);
  actors::reach_options once;
  once.retry = false;
  once.timeout = 10s;
  auto as_balancer = actors::reach<actors::balancer_client_actor>(*client, "127.0.0.1", *port, once);
  ASSERT_FALSE(as_balancer.has_value());
  EXPECT_EQ(as_balancer.error().code, errc::invalid_argument);
  EXPECT_EQ(as_balancer.error().message,
            "the actor published there has another interface (another kind of troupe process, or another version)");
  auto as_node = actors::reach<actors::node_actor>(*client, "127.0.0.1", *port, once);
  ASSERT_TRUE(as_node.has_value()) << as_node.error().message;

  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::testing
