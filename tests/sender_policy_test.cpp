// Who may send what to a cache tier, a disk tier or an expert shard (issue 47): the pure rules
// of runtime/common/sender_policy.hpp, message kind by message kind. The actors' use of them is
// in cache_tier_actor_test (the tiers) and moe_test (the shards).
#include "runtime/common/sender_policy.hpp"

#include <gtest/gtest.h>

#include <string>

namespace troupe {
namespace {

const sender_info nobody{};
const sender_info local{true, true, "home", "1@home"};
const sender_info balancer{true, false, "b", "7@b"};
const sender_info balancers_neighbour{true, false, "b", "8@b"};
const sender_info engine_node{true, false, "e", "3@e"};
const sender_info stranger{true, false, "x", "9@x"};

std::string refusal(sender_policy& p, sender_need need, const sender_info& from, bool pin = false) {
  auto ok = p.check("msg", need, from, pin);
  return ok ? "honoured" : ok.error().message;
}

TEST(SenderPolicy, OwnNodeMessagesAreHonouredOnlyFromTheOwningNode) {
  sender_policy p("cache tier");
  EXPECT_EQ(refusal(p, sender_need::own_node, local), "honoured");
  EXPECT_EQ(refusal(p, sender_need::own_node, nobody), "cache tier: refused msg without a sender");
  EXPECT_EQ(refusal(p, sender_need::own_node, stranger),
            "cache tier: refused msg from 9@x on node x: only actors of its own node may send it");
  // Not even the partner: a balancer reads hashes, never blocks (tier_get was how a stranger
  // read the plaintext tokens of others' prompts).
  EXPECT_EQ(refusal(p, sender_need::partner, balancer, true), "honoured");
  EXPECT_EQ(refusal(p, sender_need::own_node, balancer),
            "cache tier: refused msg from 7@b on node b: only actors of its own node may send it");
}

TEST(SenderPolicy, TheFirstPinningSenderIsThePartnerUntilItGoesAway) {
  sender_policy p("cache tier");
  EXPECT_EQ(refusal(p, sender_need::partner, stranger), "cache tier: refused msg from 9@x on node x: only its "
                                                         "partner or actors of its own node may send it");
  EXPECT_FALSE(p.has_partner());  // only a pinning message pins
  EXPECT_EQ(refusal(p, sender_need::partner, balancer, true), "honoured");
  EXPECT_EQ(p.partner_actor(), "7@b");
  EXPECT_EQ(p.partner_node(), "b");
  EXPECT_EQ(refusal(p, sender_need::partner, balancer, true), "honoured");  // again: the same partner
  EXPECT_EQ(refusal(p, sender_need::partner, stranger, true),
            "cache tier: refused msg from 9@x on node x: only 7@b or actors of its own node may send it");
  EXPECT_EQ(refusal(p, sender_need::partner, balancers_neighbour, true),
            "cache tier: refused msg from 8@b on node b: only 7@b or actors of its own node may send it");
  EXPECT_EQ(refusal(p, sender_need::partner, local, true), "honoured");
  p.drop_partner();
  EXPECT_EQ(refusal(p, sender_need::partner, stranger, true), "honoured");  // the next one pins
  EXPECT_EQ(p.partner_actor(), "9@x");
}

TEST(SenderPolicy, UpToMaxPartnersPinEachUntilItGoesAway) {
  sender_policy p("cache tier", 2);
  EXPECT_EQ(refusal(p, sender_need::partner, balancer, true), "honoured");
  EXPECT_EQ(refusal(p, sender_need::partner, stranger, true), "honoured");  // a second balancer
  EXPECT_EQ(p.num_partners(), 2u);
  EXPECT_TRUE(p.is_partner("9@x"));
  EXPECT_EQ(refusal(p, sender_need::partner, balancers_neighbour, true),
            "cache tier: refused msg from 8@b on node b: only 7@b, 9@x or actors of its own node may send it");
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node),
            "cache tier: refused msg from 3@e on node e: only actors of its own node, of 7@b, 9@x's node or of a "
            "node they named may send it");
  p.set_partner_nodes({"e"});
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node), "honoured");
  EXPECT_EQ(refusal(p, sender_need::partner_node, balancers_neighbour), "honoured");  // 7@b's node
  p.drop_partner("7@b");
  EXPECT_FALSE(p.is_partner("7@b"));
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node), "honoured");  // 9@x still vouches
  EXPECT_EQ(refusal(p, sender_need::partner, balancers_neighbour, true), "honoured");  // the freed place
  p.drop_partner("8@b");
  p.drop_partner("9@x");
  EXPECT_FALSE(p.has_partner());
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node),  // the last one took its nodes along
            "cache tier: refused msg from 3@e on node e: only actors of its own node may send it");
}

TEST(SenderPolicy, AnActorOfTheOwningNodePinsSoThatNoRemoteOneTakesItsPlace) {
  sender_policy p("expert shard");
  EXPECT_EQ(refusal(p, sender_need::partner_node, local, true), "honoured");
  EXPECT_EQ(p.partner_node(), "home");
  EXPECT_EQ(refusal(p, sender_need::partner_node, stranger, true),
            "expert shard: refused msg from 9@x on node x: only actors of its own node, of 1@home's node or of a "
            "node it named may send it");
}

TEST(SenderPolicy, PartnerNodeMessagesComeFromThePartnersNodeOrTheNodesItNamed) {
  sender_policy p("cache tier");
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node),
            "cache tier: refused msg from 3@e on node e: only actors of its own node may send it");
  EXPECT_EQ(refusal(p, sender_need::partner_node, local), "honoured");
  ASSERT_EQ(refusal(p, sender_need::partner, balancer, true), "honoured");
  p.set_partner_nodes({"e"});
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node), "honoured");
  EXPECT_EQ(refusal(p, sender_need::partner_node, balancers_neighbour), "honoured");
  EXPECT_EQ(refusal(p, sender_need::partner_node, stranger),
            "cache tier: refused msg from 9@x on node x: only actors of its own node, of 7@b's node or of a node "
            "it named may send it");
  EXPECT_EQ(refusal(p, sender_need::partner_node, nobody), "cache tier: refused msg without a sender");
  p.drop_partner();  // and the nodes it named with it
  EXPECT_EQ(refusal(p, sender_need::partner_node, engine_node),
            "cache tier: refused msg from 3@e on node e: only actors of its own node may send it");
}

}  // namespace
}  // namespace troupe
