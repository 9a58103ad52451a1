// What each node publishes, as a peer sees it over a real loopback connection (issue 21, point
// 2): the balancer's node publishes a front that accepts exactly `submit_completion`; a node
// without the balancer publishes a node actor that accepts exactly `engines_atom`. The test
// compares the interface CAF hands a connecting peer (actors::reach_any) with the typed
// protocol's message set, element for element, and checks that a client cannot reach the whole
// balancer's interface there. The behaviour of what is published (forged messages dropped,
// owners only) is tested under the deterministic coordinator in actors_test. And a launch that
// fails halfway leaves no actor running.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/system/connect.hpp"
#include "actors/system/tls.hpp"
#include "tests/support/actor_harness.hpp"
#include "topology/launch.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

/// Two actor systems with the io middleman: `server` runs and publishes a node, `peer` reaches it.
class PublishedSurface : public ::testing::Test {
 protected:
  caf::actor_system_config server_cfg_;
  caf::actor_system_config peer_cfg_;
  std::unique_ptr<caf::actor_system> server_;
  std::unique_ptr<caf::actor_system> peer_;
  topology::launched_node node_;

  void SetUp() override {
    for (caf::actor_system_config* cfg : {&server_cfg_, &peer_cfg_}) {
      configure(*cfg, /*deterministic=*/false);
      ASSERT_TRUE(actors::configure_network(*cfg, actors::tls_credentials{}).has_value());
    }
    server_ = std::make_unique<caf::actor_system>(server_cfg_);
    peer_ = std::make_unique<caf::actor_system>(peer_cfg_);
  }

  void TearDown() override {
    peer_.reset();
    topology::shutdown_node(*server_, node_);
  }

  /// A topology of node "n0" (the balancer) and node "n1" (the bundled model's engine).
  static topology::topology two_nodes() {
    const std::string models = TROUPE_MODELS_DIR;
    topology::topology t = topology::single_node(models + "/stories260K.bin", models + "/tok512.bin");
    topology::node_spec n1 = t.nodes.front();
    n1.name = "n1";
    t.nodes.push_back(n1);
    t.engines.front().node = "n1";
    t.load_balancer.node = "n0";
    t.nodes.front().name = "n0";
    return t;
  }

  /// Launches and publishes `name` of a one-node topology (the engine there too) or of
  /// two_nodes(); returns what a peer reaches at its port.
  actors::reached_actor publish_and_reach(const topology::topology& t, const std::string& name) {
    auto launched = topology::launch_node(*server_, t, name, topology::launch_options{});
    EXPECT_TRUE(launched.has_value()) << launched.error().message;
    if (!launched) return {};
    node_ = std::move(*launched);
    auto port = topology::publish_node(*server_, t, name, node_);
    EXPECT_TRUE(port.has_value()) << port.error().message;
    if (!port) return {};
    actors::reach_options once;
    once.retry = false;
    auto reached = actors::reach_any(*peer_, "127.0.0.1", *port, once);
    EXPECT_TRUE(reached.has_value()) << reached.error().message;
    return reached.value_or(actors::reached_actor{});
  }
};

TEST_F(PublishedSurface, TheBalancersNodePublishesOnlySubmitCompletion) {
  const std::string models = TROUPE_MODELS_DIR;
  const topology::topology t = topology::single_node(models + "/stories260K.bin", models + "/tok512.bin");
  const actors::reached_actor reached = publish_and_reach(t, "local");
  ASSERT_TRUE(reached.actor);
  // Exactly one message type, the client's: no placement, load report, heartbeat or engine list.
  // (CAF names each signature by the types' registered names, actors/system/type_ids.cpp.)
  const std::set<std::string> client_surface = {"caf::replies_to<troupe::submit_completion>::with<troupe::request_actor>"};
  EXPECT_EQ(peer_->message_types<actors::balancer_client_actor>(), client_surface);
  EXPECT_EQ(reached.interface, client_surface);
  EXPECT_FALSE(peer_->assignable(reached.interface, peer_->message_types<actors::balancer_actor>()));
  EXPECT_FALSE(peer_->assignable(reached.interface, peer_->message_types<actors::node_actor>()));
  EXPECT_FALSE(peer_->assignable(reached.interface, peer_->message_types<actors::engine_actor>()));
  // What the node publishes is the front, not the balancer itself.
  EXPECT_EQ(reached.actor->id(), node_.front.id());
  EXPECT_NE(reached.actor->id(), node_.load_balancer.id());
}

TEST_F(PublishedSurface, ANodeWithoutTheBalancerPublishesOnlyItsEngineShardAndTierListsAndItsDrain) {
  const actors::reached_actor reached = publish_and_reach(two_nodes(), "n1");
  ASSERT_TRUE(reached.actor);
  const std::set<std::string> node_surface = {"caf::replies_to<drain,@str,@i32>::with<@i32>",
                                              "caf::replies_to<engines>::with<troupe::engine_list>",
                                              "caf::replies_to<hosttier>::with<troupe::cache_tier_actor>",
                                              "caf::replies_to<xshards>::with<troupe::expert_shard_list>"};
  EXPECT_EQ(peer_->message_types<actors::node_actor>(), node_surface);
  EXPECT_EQ(reached.interface, node_surface);
  EXPECT_FALSE(peer_->assignable(reached.interface, peer_->message_types<actors::balancer_client_actor>()));
  EXPECT_FALSE(node_.load_balancer);
  EXPECT_FALSE(node_.front);
}

// What a node publishes is a door (actors/system/door.hpp): a peer's kill, a link to it from an actor
// that then dies, and a request outside the interface leave it serving. (Before, one
// `anon_send_exit(front, kill)` from any client stopped the node accepting completions.)
TEST_F(PublishedSurface, NoPeerCanStopTheFrontWithAKillOrALink) {
  const std::string models = TROUPE_MODELS_DIR;
  const topology::topology t = topology::single_node(models + "/stories260K.bin", models + "/tok512.bin");
  const actors::reached_actor reached = publish_and_reach(t, "local");
  ASSERT_TRUE(reached.actor);
  const auto front = caf::actor_cast<actors::balancer_client_actor>(reached.actor);
  caf::anon_send_exit(front, caf::exit_reason::kill);
  auto doomed = peer_->spawn([front](caf::event_based_actor* self) -> caf::behavior {
    self->link_to(front);
    return {[](int) {}};
  });
  caf::anon_send_exit(doomed, caf::exit_reason::kill);  // dies linked to the front
  caf::scoped_actor self{*peer_};
  bool refused = false;
  self->request(caf::actor_cast<caf::actor>(front), 10s, actors::engines_atom::value)
      .receive([](actors::engine_list&) {}, [&](caf::error& e) { refused = e == caf::sec::unexpected_message; if (!refused) ADD_FAILURE() << peer_->render(e); });
  EXPECT_TRUE(refused) << "a request outside the interface is answered with unexpected_message";
  // The front still hands completions to the balancer.
  const msg::completion_request r = make_completion("Once upon a time", 20, 3, 0.0f);
  auto out = actors::complete(*peer_, front, r);
  ASSERT_TRUE(out.has_value()) << out.error().message;
  model::transformer oracle{*bundled_shared().ck};
  EXPECT_EQ(out->tokens, reference(oracle, r).tokens);
}

TEST_F(PublishedSurface, NoPeerCanStopTheNodeActorWithAKill) {
  const actors::reached_actor reached = publish_and_reach(two_nodes(), "n1");
  ASSERT_TRUE(reached.actor);
  const auto node = caf::actor_cast<actors::node_actor>(reached.actor);
  caf::anon_send_exit(node, caf::exit_reason::kill);
  caf::scoped_actor self{*peer_};
  size_t num_engines = 0;
  self->request(node, 10s, actors::engines_atom::value)
      .receive([&](actors::engine_list& l) { num_engines = l.size(); }, [](caf::error&) {});
  EXPECT_EQ(num_engines, 1u);
}

// A launch that fails after it spawned actors (the node's host tier and first engine; the
// second engine's model is missing) stops every one of them before it returns the error, so a
// failed start leaves nothing serving (topology/launch.cpp: every step's error goes through
// shutdown_node).
TEST_F(PublishedSurface, ALaunchThatFailsHalfwayLeavesNoActorRunning) {
  const std::string models = TROUPE_MODELS_DIR;
  topology::topology t = topology::single_node(models + "/stories260K.bin", models + "/tok512.bin");
  t.nodes.front().host_tier_blocks = 16;
  topology::engine_spec second = t.engines.front();
  second.name = "engine1";
  second.model_path = models + "/no-such-model.bin";
  t.engines.push_back(second);
  auto launched = topology::launch_node(*server_, t, "local", topology::launch_options{});
  ASSERT_FALSE(launched.has_value());
  EXPECT_NE(launched.error().message.find("engine 'engine1'"), std::string::npos) << launched.error().message;
  EXPECT_EQ(server_->registry().running(), 0u);
}

}  // namespace
}  // namespace troupe::testing
