#pragma once

/// A node id that is not this process's: an actor told it is its home (spawn_cache_tier,
/// spawn_disk_tier, spawn_expert_shard) counts every actor of the test as remote, so that one
/// process exercises the sender checks of issue 47 deterministically.

#include <caf/node_id.hpp>
#include <gtest/gtest.h>

namespace troupe::testing {

inline caf::node_id other_node() {
  auto id = caf::make_node_id(4242, "0123456789abcdef0123456789abcdef01234567");
  EXPECT_TRUE(static_cast<bool>(id));
  return id ? *id : caf::node_id{};
}

}  // namespace troupe::testing
