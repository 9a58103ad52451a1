// The disk tier actor under CAF's test coordinator, over the real disk tier in a directory of
// the build tree: puts, fetches and its report answered exactly, LRU and TTL on the actor
// system's virtual clock, bad blocks and classes refused with an error while it serves on, a
// block too big for the tier refused as an answer, and a read cost answering a fetch that much
// later on the clock while it serves other messages.
#include "actors/disk_tier_actor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/system/clock.hpp"
#include "messages/disk_tier.hpp"
#include "messages/kv_block.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/ask_later.hpp"
#include "tests/support/kv_blocks.hpp"
#include "tests/support/other_node.hpp"
#include "actors/edge/disk_tier.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

constexpr int32_t block_size = 4;

class DiskTierActor : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_{dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())};
  const std::vector<int32_t> tokens_ = token_range(13, 1);  // 3 full blocks and 1 token
  std::shared_ptr<tiers::disk_tier> disk_;
  actors::disk_tier_actor actor_;

  const std::string dir_ = std::string(TROUPE_BUILD_DIR) + "/tests/tmp/disk_tier_actor_test/" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();

  /// The actor over a disk tier of `capacity_bytes`, reads costing `read_cost` if given, at home
  /// on `home` (empty: this process).
  void start(int64_t capacity_bytes, actors::lower_read_cost read_cost = {}, const caf::node_id& home = {}) {
    sched_.clock().current_time += 1h;  // away from 0
    std::filesystem::remove_all(dir_);
    auto opened = tiers::disk_tier::open({dir_, capacity_bytes, block_size}, actors::ns_since_epoch(sched_.clock().now()));
    ASSERT_TRUE(opened.has_value()) << opened.error().message;
    disk_ = std::make_shared<tiers::disk_tier>(std::move(*opened));
    actor_ = actors::spawn_disk_tier(sys_, disk_, std::move(read_cost), false, home);
    sched_.run();
  }

  void TearDown() override {
    if (actor_) caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
    sched_.run();
    std::filesystem::remove_all(dir_);
  }

  template <class T>
  using answer = later_answer<T>;

  /// Sends `m` without running anything: its answer, or the error's text, once it comes.
  template <class T, class M>
  answer<T> ask_later(M m) {
    return testing::ask_later<T>(sys_, actor_, std::move(m));
  }

  /// Sends `m` and runs until nothing is left: the answer, or the error's text.
  template <class T, class M>
  std::variant<T, std::string> ask(M m) {
    return ask_now<T>(sys_, sched_, actor_, std::move(m));
  }

  kv::kv_block block(int32_t i) const { return block_of(tokens_, i, block_size); }
  uint64_t hash(int32_t i) const { return block(i).hash; }
  msg::disk_stored put(int32_t i, kv::cache_class cls = kv::cache_class::chat) {
    return std::get<msg::disk_stored>(ask<msg::disk_stored>(msg::disk_put{block(i), cls}));
  }
  std::vector<kv::kv_block> fetch(const std::vector<uint64_t>& hashes) {
    return std::get<msg::disk_blocks>(ask<msg::disk_blocks>(msg::disk_fetch{hashes})).blocks;
  }
  msg::disk_report report() { return std::get<msg::disk_report>(ask<msg::disk_report>(actors::stats_atom::value)); }
  int64_t block_bytes() const { return static_cast<int64_t>(msg::encode_kv_block(block(0)).size()); }
};

// Only the host tier above it, on its own node, may use it; before issue 47 an actor of any node
// holding its handle could store, read and list blocks (each ask below was answered).
TEST_F(DiskTierActor, ServesOnlyActorsOfItsOwnNode) {
  start(2 * block_bytes(), {}, other_node());
  ASSERT_TRUE(disk_->put(block(0), kv::cache_class::chat, actors::ns_since_epoch(sched_.clock().now())));
  const std::string refused = " from ";  // "disk tier: refused <what> from <actor> on node <node>: only ..."
  const auto expect_refused = [&](const auto& answer, const std::string& what) {
    ASSERT_TRUE(std::holds_alternative<std::string>(answer)) << what << " was answered";
    const std::string& why = std::get<std::string>(answer);
    EXPECT_NE(why.find("disk tier: refused " + what + refused), std::string::npos) << why;
    EXPECT_NE(why.find(": only actors of its own node may send it"), std::string::npos) << why;
  };
  expect_refused(ask<msg::disk_stored>(msg::disk_put{block(1), kv::cache_class::chat}), "disk_put");
  expect_refused(ask<msg::disk_blocks>(msg::disk_fetch{{hash(0)}}), "disk_fetch");
  expect_refused(ask<msg::disk_report>(actors::stats_atom::value), "stats");
  expect_refused(ask_now<msg::tier_events>(sys_, sched_, actor_, actors::report_atom::value, true), "report");
  EXPECT_EQ(disk_->num_blocks(), 1);  // nothing stored, and it serves on
}

TEST_F(DiskTierActor, TellsTheHashesItStartedAndStoppedHoldingOrAllOfThem) {
  start(2 * block_bytes());
  const auto events = [&](bool snapshot) {
    return std::get<msg::tier_events>(ask_now<msg::tier_events>(sys_, sched_, actor_, actors::report_atom::value, snapshot));
  };
  const auto sorted = [](std::vector<uint64_t> h) {
    std::sort(h.begin(), h.end());
    return h;
  };
  (void)put(0);
  (void)put(1);
  msg::tier_events e = events(false);
  EXPECT_TRUE(e.lower);
  EXPECT_FALSE(e.snapshot);
  EXPECT_EQ(e.added, sorted({hash(0), hash(1)}));
  EXPECT_TRUE(e.removed.empty());
  (void)put(2);  // evicts 0
  e = events(false);
  EXPECT_EQ(e.added, std::vector<uint64_t>{hash(2)});
  EXPECT_EQ(e.removed, std::vector<uint64_t>{hash(0)});
  EXPECT_TRUE(events(false).added.empty());  // nothing since
  e = events(true);
  EXPECT_TRUE(e.snapshot);
  EXPECT_EQ(e.added, sorted({hash(1), hash(2)}));
  EXPECT_TRUE(e.removed.empty());
}

TEST_F(DiskTierActor, AnswersPutsFetchesAndItsReportExactly) {
  start(2 * block_bytes());  // room for two block files
  const msg::disk_stored first = put(0);
  EXPECT_TRUE(first.stored);
  EXPECT_EQ(first.num_evicted, 0);
  EXPECT_EQ(put(1).num_evicted, 0);
  const msg::disk_stored third = put(2);  // evicts 0, the least recently used
  EXPECT_TRUE(third.stored);
  EXPECT_EQ(third.num_evicted, 1);
  EXPECT_FALSE(std::filesystem::exists(disk_->path_of(hash(0))));
  const std::vector<kv::kv_block> got = fetch({hash(1), hash(2)});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(same_block(got[0], block(1)));
  EXPECT_TRUE(same_block(got[1], block(2)));
  EXPECT_EQ(fetch({hash(0), hash(1)}).size(), 0u);  // the leading run only: 0 is gone
  EXPECT_EQ(fetch({hash(2), hash(0), hash(1)}).size(), 1u);
  EXPECT_EQ(fetch({}).size(), 0u);
  const msg::disk_report r = report();
  EXPECT_EQ(r.num_blocks, 2);
  EXPECT_EQ(r.num_stored, 3);
  EXPECT_EQ(r.num_refused, 0);
  EXPECT_EQ(r.num_hits, 3);
  EXPECT_EQ(r.num_expirations, 0);
  disk_->check_invariants();
}

TEST_F(DiskTierActor, BlocksExpireByTheirClassOnTheActorSystemsClock) {
  start(1 << 20);
  EXPECT_TRUE(put(0, kv::cache_class::agent).stored);
  EXPECT_TRUE(put(1, kv::cache_class::chat).stored);
  sched_.clock().current_time += 3 * 24h - 1ns;
  EXPECT_EQ(fetch({hash(0)}).size(), 1u);  // a use: the agent block lives 3 days from now
  sched_.clock().current_time += 3 * 24h;
  const msg::disk_report r = report();  // the report drops what has expired first
  EXPECT_EQ(r.num_blocks, 1);
  EXPECT_EQ(r.num_expirations, 1);
  EXPECT_EQ(fetch({hash(1)}).size(), 1u);  // chat: 7 days from its put
  EXPECT_EQ(fetch({hash(0)}).size(), 0u);
}

TEST_F(DiskTierActor, RefusesBadBlocksAndClassesWithAnErrorAndServesOn) {
  start(1 << 20);
  kv::kv_block short_values = block(0);
  short_values.values.pop_back();
  const auto bad = ask<msg::disk_stored>(msg::disk_put{short_values, kv::cache_class::chat});
  ASSERT_TRUE(std::holds_alternative<std::string>(bad));
  EXPECT_NE(std::get<std::string>(bad).find("dimensions do not match its data"), std::string::npos)
      << std::get<std::string>(bad);
  const auto wrong_size = ask<msg::disk_stored>(msg::disk_put{block_of(token_range(8, 1), 0, 8), kv::cache_class::chat});
  ASSERT_TRUE(std::holds_alternative<std::string>(wrong_size));
  EXPECT_NE(std::get<std::string>(wrong_size).find("a KV block must hold 4 tokens, got 8"), std::string::npos)
      << std::get<std::string>(wrong_size);
  kv::kv_block renamed = block(1);
  renamed.hash ^= 1;  // a name that is not its chain hash
  const auto bad_hash = ask<msg::disk_stored>(msg::disk_put{renamed, kv::cache_class::chat});
  ASSERT_TRUE(std::holds_alternative<std::string>(bad_hash));
  EXPECT_NE(std::get<std::string>(bad_hash).find("its hash is not its tokens' chain hash"), std::string::npos);
  const auto bad_class = ask<msg::disk_stored>(msg::disk_put{block(0), static_cast<kv::cache_class>(7)});
  ASSERT_TRUE(std::holds_alternative<std::string>(bad_class));
  EXPECT_NE(std::get<std::string>(bad_class).find("not a cache_class"), std::string::npos);
  EXPECT_TRUE(put(0).stored);  // still serving
  EXPECT_EQ(fetch({hash(0)}).size(), 1u);
  const msg::disk_report r = report();
  EXPECT_EQ(r.num_blocks, 1);
  EXPECT_EQ(r.num_stored, 1);
  EXPECT_EQ(r.num_refused, 0);  // bad input is an error, not a refusal
  EXPECT_EQ(disk_->num_blocks(), 1);
}

TEST_F(DiskTierActor, ABlockTooBigForTheTierIsRefusedAsAnAnswer) {
  start(1);  // no block fits even in the empty tier
  const msg::disk_stored refused = put(0);
  EXPECT_FALSE(refused.stored);
  EXPECT_EQ(refused.num_evicted, 0);
  EXPECT_FALSE(put(1).stored);
  const msg::disk_report r = report();
  EXPECT_EQ(r.num_refused, 2);
  EXPECT_EQ(r.num_stored, 0);
  EXPECT_EQ(r.num_blocks, 0);
}

TEST_F(DiskTierActor, AReadCostAnswersAFetchThatMuchLaterWhileItServesOn) {
  start(1 << 20, [](int64_t num_blocks) { return caf::timespan(num_blocks * 1000); });  // 1 us a block
  EXPECT_TRUE(put(0).stored);
  EXPECT_TRUE(put(1).stored);
  const auto slow = ask_later<msg::disk_blocks>(msg::disk_fetch{{hash(0), hash(1)}});
  sched_.run();
  EXPECT_FALSE(slow->has_value());  // two blocks read: answered 2 us later
  EXPECT_TRUE(put(2).stored);       // meanwhile it serves on
  EXPECT_EQ(report().num_hits, 2);
  const auto miss = ask_later<msg::disk_blocks>(msg::disk_fetch{{hash(0) ^ 1}});
  sched_.run();
  ASSERT_TRUE(miss->has_value());  // nothing read: answered at once
  EXPECT_EQ(std::get<msg::disk_blocks>(**miss).blocks.size(), 0u);
  sched_.advance_time(2us - 1ns);
  sched_.run();
  EXPECT_FALSE(slow->has_value());
  sched_.advance_time(1ns);
  sched_.run();
  ASSERT_TRUE(slow->has_value());
  EXPECT_EQ(std::get<msg::disk_blocks>(**slow).blocks.size(), 2u);
}

TEST_F(DiskTierActor, ABudgetStopsTheReadsBeforeTheFirstThatWouldEndAfterItAndBadBudgetsAreRefused) {
  start(1 << 20, [](int64_t num_blocks) { return caf::timespan(num_blocks * 1000); });  // 1 us a block
  for (int32_t i = 0; i < 3; i++) EXPECT_TRUE(put(i).stored);
  const std::vector<uint64_t> all = {hash(0), hash(1), hash(2)};
  const auto cut = ask_later<msg::disk_blocks>(msg::disk_fetch{all, 2500});  // 2 reads end by 2 us, a third at 3
  sched_.run();
  sched_.advance_time(2us);
  sched_.run();
  ASSERT_TRUE(cut->has_value());
  const std::vector<kv::kv_block>& two = std::get<msg::disk_blocks>(**cut).blocks;
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].hash, hash(1));
  EXPECT_EQ(report().num_hits, 2);  // the third was not read: not a use
  const auto exact = ask_later<msg::disk_blocks>(msg::disk_fetch{all, 3000});
  sched_.run();
  sched_.advance_time(3us);
  sched_.run();
  ASSERT_TRUE(exact->has_value());
  EXPECT_EQ(std::get<msg::disk_blocks>(**exact).blocks.size(), 3u);
  EXPECT_TRUE(std::get<msg::disk_blocks>(ask<msg::disk_blocks>(msg::disk_fetch{all, 999})).blocks.empty());
  for (const int64_t bad : {int64_t{-1}, msg::tier_fetch_budget_max_ns + 1}) {
    const auto refused = ask<msg::disk_blocks>(msg::disk_fetch{all, bad});
    ASSERT_TRUE(std::holds_alternative<std::string>(refused)) << bad;
    EXPECT_NE(std::get<std::string>(refused).find("disk_fetch: budget_ns " + std::to_string(bad) +
                                                  " is outside 0..60000000000"),
              std::string::npos)
        << std::get<std::string>(refused);
  }
  EXPECT_EQ(report().num_hits, 5);
}

}  // namespace
}  // namespace troupe::testing
