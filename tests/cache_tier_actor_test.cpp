// The host-memory cache tier actor under CAF's test coordinator: lookups, puts and gets as
// typed messages, LRU eviction through the actor, TTL expiry on the actor system's virtual
// clock, and bad blocks refused at the door while the tier serves on; over a disk tier, the
// evicted blocks written there, the disk tier's own LRU and TTL on the same clock, and a disk
// tier too small for a block refusing while the tier serves on.
#include "actors/cache_tier_actor.hpp"

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
#include "actors/disk_tier_actor.hpp"
#include "messages/cache_tier.hpp"
#include "messages/kv_block.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/ask_later.hpp"
#include "actors/edge/disk_tier.hpp"
#include "tests/support/kv_blocks.hpp"
#include "tests/support/other_node.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

constexpr int32_t block_size = 4;

/// What a disk tier actor that never answers was sent (a stalled disk, or one on a partitioned
/// node), and the answers it holds back.
struct silent_disk {
  std::vector<uint64_t> puts;                 // the blocks' hashes
  std::vector<std::vector<uint64_t>> fetches;  // the hashes asked for
  int32_t num_stats = 0;
  std::vector<caf::response_promise> held;
};

actors::disk_tier_actor spawn_silent_disk(caf::actor_system& sys, std::shared_ptr<silent_disk> log) {
  return sys.spawn([log](actors::disk_tier_actor::pointer self) -> actors::disk_tier_actor::behavior_type {
    return {
        [=](msg::disk_put& p) -> caf::result<msg::disk_stored> {
          log->puts.push_back(p.block.hash);
          log->held.push_back(self->make_response_promise());
          return caf::delegated<msg::disk_stored>{};
        },
        [=](msg::disk_fetch& f) -> caf::result<msg::disk_blocks> {
          log->fetches.push_back(f.hashes);
          log->held.push_back(self->make_response_promise());
          return caf::delegated<msg::disk_blocks>{};
        },
        [=](actors::stats_atom) -> caf::result<msg::disk_report> {
          log->num_stats++;
          log->held.push_back(self->make_response_promise());
          return caf::delegated<msg::disk_report>{};
        },
        [=](actors::report_atom, bool) -> caf::result<msg::tier_events> {
          log->held.push_back(self->make_response_promise());
          return caf::delegated<msg::tier_events>{};
        },
    };
  });
}

class CacheTierActor : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_{dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())};
  const std::vector<int32_t> tokens_ = token_range(13, 1);  // 3 full blocks and 1 token
  actors::cache_tier_actor tier_;
  std::shared_ptr<tiers::disk_tier> disk_;  // the tier's lower tier, if any (read by the tests)
  actors::disk_tier_actor disk_tier_;       // the actor owning it (or a stand-in)

  const std::string dir_ = std::string(TROUPE_BUILD_DIR) + "/tests/tmp/cache_tier_actor_test/" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();

  caf::node_id home_;        // the tier's home node (empty: this process)
  int32_t num_held_ = 0;     // blocks 0.. the store holds when the tier starts

  /// A tier of `capacity_blocks`, over a disk tier of `disk_bytes` if > 0.
  void start(int64_t capacity_blocks, int64_t disk_bytes = 0) {
    sched_.clock().current_time += 1h;  // away from 0
    auto store = kv::tier_store::create({block_size, capacity_blocks, 7 * kv::day_ns, 3 * kv::day_ns});
    ASSERT_TRUE(store.has_value());
    for (int32_t i = 0; i < num_held_; i++)
      (void)store->put(block(i), kv::cache_class::chat, actors::ns_since_epoch(sched_.clock().now()));
    if (disk_bytes > 0) {
      std::filesystem::remove_all(dir_);
      const int64_t now_ns = actors::ns_since_epoch(sched_.clock().now());
      auto opened = tiers::disk_tier::open({dir_, disk_bytes, block_size}, now_ns);
      ASSERT_TRUE(opened.has_value()) << opened.error().message;
      disk_ = std::make_shared<tiers::disk_tier>(std::move(*opened));
      disk_tier_ = actors::spawn_disk_tier(sys_, disk_);
    }
    tier_ = actors::spawn_cache_tier(sys_, std::move(*store), disk_tier_, std::chrono::milliseconds(40), home_);
    sched_.run();
  }

  /// A tier of `capacity_blocks` over `disk`, waiting for it the default 40 ms.
  void start_over(int64_t capacity_blocks, actors::disk_tier_actor disk) {
    disk_tier_ = std::move(disk);
    start(capacity_blocks);
  }

  void TearDown() override {
    if (tier_) caf::anon_send_exit(tier_, caf::exit_reason::user_shutdown);
    if (disk_tier_) caf::anon_send_exit(disk_tier_, caf::exit_reason::user_shutdown);
    sched_.run();
    std::filesystem::remove_all(dir_);
  }

  template <class T>
  using answer = later_answer<T>;

  /// Sends `m` without running anything: its answer, or the error's text, once it comes.
  template <class T, class M>
  answer<T> ask_later(M m) {
    return testing::ask_later<T>(sys_, tier_, std::move(m));
  }

  /// Sends `m` and runs until nothing is left: the answer, or the error's text.
  template <class T, class M>
  std::variant<T, std::string> ask(M m) {
    return ask_now<T>(sys_, sched_, tier_, std::move(m));
  }

  int32_t lookup() { return std::get<int32_t>(ask<int32_t>(msg::tier_lookup{tokens_})); }
  int64_t put(int32_t i, kv::cache_class cls = kv::cache_class::chat) {
    return std::get<int64_t>(ask<int64_t>(msg::tier_put{block_of(tokens_, i, block_size), cls}));
  }
  std::vector<kv::kv_block> fetch(int32_t first, int32_t max) {
    return std::get<msg::tier_blocks>(ask<msg::tier_blocks>(msg::tier_fetch{tokens_, first, max})).blocks;
  }
  msg::tier_report report() { return std::get<msg::tier_report>(ask<msg::tier_report>(actors::stats_atom::value)); }
  kv::kv_block block(int32_t i) const { return block_of(tokens_, i, block_size); }
  msg::tier_got get(int32_t i) { return std::get<msg::tier_got>(ask<msg::tier_got>(msg::tier_get{block_of(tokens_, i, block_size).hash})); }
};

TEST_F(CacheTierActor, ServesLookupsPutsAndGetsAndEvictsTheLeastRecentlyUsed) {
  start(2);
  EXPECT_EQ(lookup(), 0);
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 0);
  EXPECT_EQ(lookup(), 2);
  const msg::tier_got got = get(0);  // a use: block 1 is now the least recent
  ASSERT_TRUE(got.found);
  EXPECT_TRUE(same_block(got.block, block_of(tokens_, 0, block_size)));
  EXPECT_EQ(put(2), 1);  // evicts block 1
  EXPECT_EQ(lookup(), 1);
  EXPECT_FALSE(get(1).found);
  EXPECT_TRUE(get(2).found);
}

TEST_F(CacheTierActor, BlocksExpireByClassOnTheActorSystemsClock) {
  start(8);
  EXPECT_EQ(put(0, kv::cache_class::agent), 0);
  EXPECT_EQ(put(1, kv::cache_class::chat), 0);
  sched_.clock().current_time += 3 * 24h - 1ns;
  EXPECT_EQ(lookup(), 2);
  sched_.clock().current_time += 1ns;  // the agent block's 3 days are over
  EXPECT_EQ(lookup(), 0);
  EXPECT_FALSE(get(0).found);
  EXPECT_TRUE(get(1).found);  // chat: 7 days, and now used again
  sched_.clock().current_time += 7 * 24h - 1ns;
  EXPECT_TRUE(get(1).found);
  sched_.clock().current_time += 7 * 24h;
  EXPECT_FALSE(get(1).found);
}

TEST_F(CacheTierActor, ReportsItsHashesToTheBalancerASnapshotFirstThenTheChangesAtMostEveryInterval) {
  start(2);
  EXPECT_EQ(put(0), 0);
  const auto log = std::make_shared<std::vector<msg::tier_events>>();
  const caf::actor balancer = sys_.spawn([log]() -> caf::behavior {
    return {[log](msg::tier_events& e) { log->push_back(std::move(e)); }};
  });
  const auto report_to = [&](int32_t interval_ms) {
    caf::send_as(balancer, tier_, msg::tier_report_to{caf::actor_cast<actors::balancer_actor>(balancer), 5, interval_ms});
    sched_.run();
  };
  const auto hash = [&](int32_t i) { return block_of(tokens_, i, block_size).hash; };
  const auto sorted = [](std::vector<uint64_t> h) {
    std::sort(h.begin(), h.end());
    return h;
  };
  const auto expect_events = [&](size_t i, uint64_t seq, bool snapshot, const std::vector<uint64_t>& added,
                                 const std::vector<uint64_t>& removed) {
    ASSERT_GT(log->size(), i);
    const msg::tier_events& e = (*log)[i];
    EXPECT_EQ(e.tier_index, 5);
    EXPECT_EQ(e.seq, seq);
    EXPECT_EQ(e.snapshot, snapshot);
    EXPECT_EQ(e.added, added);
    EXPECT_EQ(e.removed, removed);
  };
  report_to(0);  // no interval: ignored
  report_to(60001);
  EXPECT_TRUE(log->empty());
  report_to(20);
  ASSERT_EQ(log->size(), 1u);
  expect_events(0, 1, true, {hash(0)}, {});
  // Changes within the interval wait for its end, then go as one net change.
  EXPECT_EQ(put(1), 0);
  EXPECT_EQ(put(2), 1);  // evicts block 0
  EXPECT_EQ(log->size(), 1u);
  sched_.advance_time(20ms);
  sched_.run();
  ASSERT_EQ(log->size(), 2u);
  expect_events(1, 2, false, sorted({hash(1), hash(2)}), {hash(0)});
  // Uses are no change: nothing is sent.
  EXPECT_TRUE(get(1).found);
  sched_.advance_time(20ms);
  sched_.run();
  EXPECT_EQ(log->size(), 2u);
  // Asked again (the balancer lost track): a snapshot, numbered on.
  report_to(20);
  ASSERT_EQ(log->size(), 3u);
  expect_events(2, 3, true, sorted({hash(1), hash(2)}), {});
  caf::anon_send_exit(balancer, caf::exit_reason::user_shutdown);
}

// Issue 47: any actor holding the tier's handle could ask it to report its hashes, then read the
// blocks (the tokens of others' prompts) with tier_get, and store any KV with tier_put. Now its
// blocks serve its own node's engines only, its hashes go to the first balancers that ask for
// themselves alone (a cluster's balancer nodes, at most 4), and fetches come from their nodes or
// the engine nodes they name. The tier's home is another node here, so every actor of the test
// is remote.
TEST_F(CacheTierActor, ServesOtherNodesOnlyItsBalancersReportsAndTheirNodesFetches) {
  home_ = other_node();
  num_held_ = 2;
  start(4);
  const auto expect_refused = [](const auto& answer, const std::string& why) {
    ASSERT_TRUE(std::holds_alternative<std::string>(answer)) << "answered; expected: " << why;
    EXPECT_NE(std::get<std::string>(answer).find(why), std::string::npos) << std::get<std::string>(answer);
  };
  const std::string own_only = ": only actors of its own node may send it";
  expect_refused(ask<msg::tier_got>(msg::tier_get{block(0).hash}), own_only);  // before: found, with its tokens
  expect_refused(ask<int64_t>(msg::tier_put{block(2), kv::cache_class::chat}), own_only);
  expect_refused(ask<int32_t>(msg::tier_lookup{tokens_}), own_only);
  expect_refused(ask<msg::tier_report>(actors::stats_atom::value), own_only);
  expect_refused(ask<msg::tier_blocks>(msg::tier_fetch{tokens_, 0, 4}), own_only);  // no balancer yet

  using log_t = std::vector<msg::tier_events>;
  const auto spawn_balancer = [&](std::shared_ptr<log_t> log) {
    return caf::actor_cast<actors::balancer_actor>(sys_.spawn([log]() -> caf::behavior {
      return {[log](msg::tier_events& e) { log->push_back(std::move(e)); }};
    }));
  };
  const auto first_log = std::make_shared<log_t>(), second_log = std::make_shared<log_t>();
  const actors::balancer_actor first = spawn_balancer(first_log), second = spawn_balancer(second_log);
  const auto report_to = [&](const actors::balancer_actor& from, const actors::balancer_actor& to) {
    caf::send_as(from, tier_, msg::tier_report_to{to, 0, 20});
    sched_.run();
  };
  caf::anon_send(tier_, msg::tier_report_to{first, 0, 20});  // no sender: dropped
  report_to(second, first);  // for another actor: dropped (nobody redirects the hashes)
  sched_.run();
  EXPECT_TRUE(first_log->empty());
  report_to(first, first);  // the first to ask for itself: reported to, and kept
  ASSERT_EQ(first_log->size(), 1u);
  EXPECT_EQ((*first_log)[0].added.size(), 2u);
  report_to(second, second);  // another balancer (a cluster's second): reported to as well
  ASSERT_EQ(second_log->size(), 1u);
  EXPECT_TRUE((*second_log)[0].snapshot);
  ASSERT_EQ(first_log->size(), 2u);  // a snapshot for every balancer: one stream, numbered on
  EXPECT_TRUE((*first_log)[1].snapshot);
  EXPECT_EQ((*first_log)[1].seq, (*second_log)[0].seq);
  // Two more balancers are taken; a fifth is refused (a cluster has at most 4 balancer nodes).
  std::vector<std::shared_ptr<log_t>> more_logs;
  std::vector<actors::balancer_actor> more;
  for (int i = 0; i < 3; i++) {
    more_logs.push_back(std::make_shared<log_t>());
    more.push_back(spawn_balancer(more_logs.back()));
    report_to(more.back(), more.back());
  }
  EXPECT_EQ(more_logs[0]->size(), 2u);  // its snapshot, then the fourth's (every balancer gets it)
  EXPECT_EQ(more_logs[1]->size(), 1u);
  EXPECT_TRUE(more_logs[2]->empty());
  for (const actors::balancer_actor& b : more) caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
  sched_.run();
  const size_t first_seen = first_log->size(), second_seen = second_log->size();
  // Fetches from the first balancer's node (this process) are served now.
  const auto fetched = ask<msg::tier_blocks>(msg::tier_fetch{tokens_, 0, 4});
  ASSERT_TRUE(std::holds_alternative<msg::tier_blocks>(fetched)) << std::get<std::string>(fetched);
  EXPECT_EQ(std::get<msg::tier_blocks>(fetched).blocks.size(), 2u);
  expect_refused(ask<msg::tier_got>(msg::tier_get{block(0).hash}), own_only);  // blocks by hash: never
  // The first balancer goes down: the second alone is reported to (asked again: a snapshot).
  caf::anon_send_exit(first, caf::exit_reason::user_shutdown);
  sched_.run();
  report_to(second, second);
  ASSERT_EQ(second_log->size(), second_seen + 1);
  EXPECT_TRUE(second_log->back().snapshot);
  EXPECT_EQ(first_log->size(), first_seen);
  caf::anon_send_exit(second, caf::exit_reason::user_shutdown);
}

TEST_F(CacheTierActor, RefusesBadBlocksAtTheDoorAndServesOn) {
  start(8);
  kv::kv_block short_values = block_of(tokens_, 0, block_size);
  short_values.values.pop_back();
  const auto bad = ask<int64_t>(msg::tier_put{short_values, kv::cache_class::chat});
  ASSERT_TRUE(std::holds_alternative<std::string>(bad));
  EXPECT_NE(std::get<std::string>(bad).find("dimensions do not match its data"), std::string::npos)
      << std::get<std::string>(bad);
  const auto wrong_size = ask<int64_t>(msg::tier_put{block_of(token_range(8, 1), 0, 8), kv::cache_class::chat});
  ASSERT_TRUE(std::holds_alternative<std::string>(wrong_size));
  EXPECT_NE(std::get<std::string>(wrong_size).find("a KV block must hold 4 tokens, got 8"), std::string::npos)
      << std::get<std::string>(wrong_size);
  const auto bad_class = ask<int64_t>(msg::tier_put{block_of(tokens_, 0, block_size), static_cast<kv::cache_class>(7)});
  ASSERT_TRUE(std::holds_alternative<std::string>(bad_class));
  EXPECT_NE(std::get<std::string>(bad_class).find("not a cache_class"), std::string::npos);
  EXPECT_EQ(put(0), 0);  // still serving
  EXPECT_EQ(lookup(), 1);
}

TEST_F(CacheTierActor, FetchesTheBlocksAfterAGivenOneAndRefusesNegativeCounts) {
  start(8);
  for (int32_t i = 0; i < 3; i++) EXPECT_EQ(put(i), 0);
  const std::vector<kv::kv_block> got = fetch(1, 8);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(same_block(got[0], block_of(tokens_, 1, block_size)));
  EXPECT_TRUE(same_block(got[1], block_of(tokens_, 2, block_size)));
  EXPECT_EQ(fetch(0, 1).size(), 1u);
  const auto bad = ask<msg::tier_blocks>(msg::tier_fetch{tokens_, -1, 2});
  ASSERT_TRUE(std::holds_alternative<std::string>(bad));
  EXPECT_NE(std::get<std::string>(bad).find("first_block -1 and num_blocks_max 2 must be >= 0"), std::string::npos);
  for (const int64_t budget : {int64_t{-1}, msg::tier_fetch_budget_max_ns + 1}) {
    const auto bad_budget = ask<msg::tier_blocks>(msg::tier_fetch{tokens_, 0, 2, budget});
    ASSERT_TRUE(std::holds_alternative<std::string>(bad_budget)) << budget;
    EXPECT_NE(std::get<std::string>(bad_budget).find("tier_fetch: budget_ns " + std::to_string(budget) +
                                                     " is outside 0..60000000000"),
              std::string::npos);
  }
  const msg::tier_report r = report();
  EXPECT_EQ(r.num_blocks, 3);
  EXPECT_EQ(r.num_hits, 3);
  EXPECT_EQ(r.num_disk_blocks, 0);
}

TEST_F(CacheTierActor, EvictionsGoToTheDiskTierAndAFetchReadsThemBack) {
  start(2, /*disk_bytes=*/1 << 20);
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 0);
  EXPECT_EQ(put(2), 1);  // block 0 goes down to disk
  EXPECT_EQ(lookup(), 0);  // the host tier alone lacks block 0
  const std::vector<kv::kv_block> got = fetch(0, 3);
  ASSERT_EQ(got.size(), 3u);  // 0 from disk, 1 and 2 from memory
  for (int32_t i = 0; i < 3; i++) EXPECT_TRUE(same_block(got[static_cast<size_t>(i)], block_of(tokens_, i, block_size)));
  const msg::tier_report r = report();
  EXPECT_EQ(r.num_evictions, 1);
  EXPECT_EQ(r.num_disk_blocks, 1);
  EXPECT_EQ(r.num_disk_puts, 1);
  EXPECT_EQ(r.num_disk_hits, 1);
  EXPECT_EQ(r.num_disk_refused, 0);
}

TEST_F(CacheTierActor, AFullDiskTierEvictsItsLeastRecentlyUsedBlock) {
  const auto block_bytes = static_cast<int64_t>(msg::encode_kv_block(block_of(tokens_, 0, block_size)).size());
  start(1, /*disk_bytes=*/2 * block_bytes);  // room for two blocks on disk
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 1);  // 0 goes down
  EXPECT_EQ(put(2), 1);  // 1 goes down: the disk tier is full
  EXPECT_EQ(put(0), 1);  // 2 goes down: the disk tier evicts 0, its least recently used
  EXPECT_EQ(disk_->lru_order(), (std::vector<uint64_t>{block_of(tokens_, 1, block_size).hash,
                                                       block_of(tokens_, 2, block_size).hash}));
  EXPECT_FALSE(std::filesystem::exists(disk_->path_of(block_of(tokens_, 0, block_size).hash)));
  EXPECT_EQ(disk_->num_evictions(), 1);
  EXPECT_EQ(fetch(0, 3).size(), 3u);  // 0 from memory, 1 and 2 from disk
  const msg::tier_report r = report();
  EXPECT_EQ(r.num_disk_blocks, 2);
  EXPECT_EQ(r.num_disk_puts, 3);
  EXPECT_EQ(r.num_disk_hits, 2);
  EXPECT_EQ(r.num_disk_refused, 0);
}

TEST_F(CacheTierActor, DemotedBlocksExpireOnTheDiskTierByTheirClass) {
  start(1, /*disk_bytes=*/1 << 20);
  EXPECT_EQ(put(0, kv::cache_class::agent), 0);
  EXPECT_EQ(put(1), 1);  // 0 goes down as agent
  EXPECT_EQ(put(2), 1);  // 1 goes down as chat
  sched_.clock().current_time += 3 * 24h;  // the agent block's 3 days are over, on disk too
  EXPECT_EQ(fetch(0, 3).size(), 0u);
  EXPECT_EQ(disk_->num_expirations(), 1);
  EXPECT_FALSE(std::filesystem::exists(disk_->path_of(block_of(tokens_, 0, block_size).hash)));
  EXPECT_EQ(fetch(1, 2).size(), 2u);  // 1 from disk (chat: 7 days), 2 from memory
  const msg::tier_report r = report();
  EXPECT_EQ(r.num_disk_blocks, 1);
  EXPECT_EQ(r.num_disk_hits, 1);
  EXPECT_EQ(r.num_disk_expirations, 1);
}

TEST_F(CacheTierActor, ADiskTierTooSmallForABlockRefusesEvictionsAndTheTierServesOn) {
  start(1, /*disk_bytes=*/1);  // no block fits even in the empty disk tier: a refusal
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 1);  // block 0 is refused by the disk tier: dropped
  EXPECT_EQ(put(2), 1);
  EXPECT_EQ(fetch(0, 3).size(), 0u);
  EXPECT_EQ(fetch(2, 1).size(), 1u);
  const msg::tier_report r = report();
  EXPECT_EQ(r.num_disk_refused, 2);
  EXPECT_EQ(r.num_disk_puts, 0);
  EXPECT_EQ(r.num_disk_blocks, 0);
}

}  // namespace
}  // namespace troupe::testing

namespace troupe::testing {
namespace {

TEST_F(CacheTierActor, ServesWhatItHoldsWhileTheDiskTierNeverAnswers) {
  auto disk = std::make_shared<silent_disk>();
  start_over(2, spawn_silent_disk(sys_, disk));
  EXPECT_EQ(put(2), 0);
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 1);  // block 2 goes down, unanswered: the put is answered all the same
  EXPECT_EQ(disk->puts, (std::vector<uint64_t>{block(2).hash}));
  const answer<msg::tier_blocks> waiting = ask_later<msg::tier_blocks>(msg::tier_fetch{tokens_, 0, 3});
  sched_.run();
  EXPECT_FALSE(waiting->has_value());  // 0 and 1 are here; 2 is asked of the disk tier
  EXPECT_EQ(disk->fetches, (std::vector<std::vector<uint64_t>>{{block(2).hash}}));
  // The disk tier's I/O is not this actor's: meanwhile it answers what it holds at once.
  const std::vector<kv::kv_block> held = fetch(0, 2);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_TRUE(same_block(held[1], block(1)));
  EXPECT_EQ(lookup(), 2);
  EXPECT_TRUE(get(0).found);
  sched_.advance_time(40ms - 1ns);
  sched_.run();
  EXPECT_FALSE(waiting->has_value());
  sched_.advance_time(1ns);  // the disk tier's time is up: what the host tier holds
  sched_.run();
  ASSERT_TRUE(waiting->has_value());
  const msg::tier_blocks& got = std::get<msg::tier_blocks>(**waiting);
  ASSERT_EQ(got.blocks.size(), 2u);
  EXPECT_TRUE(same_block(got.blocks[0], block(0)));
  EXPECT_TRUE(same_block(got.blocks[1], block(1)));
  EXPECT_TRUE(got.from_lower.empty());
  // A report waits as long, then carries the disk tier's last counters (none yet).
  const answer<msg::tier_report> stats = ask_later<msg::tier_report>(actors::stats_atom::value);
  sched_.run();
  EXPECT_FALSE(stats->has_value());
  EXPECT_EQ(disk->num_stats, 1);
  sched_.advance_time(40ms);
  sched_.run();
  ASSERT_TRUE(stats->has_value());
  const msg::tier_report& r = std::get<msg::tier_report>(**stats);
  EXPECT_EQ(r.num_blocks, 2);
  EXPECT_EQ(r.num_evictions, 1);
  EXPECT_EQ(r.num_hits, 5);  // 0 and 1 by each fetch, 0 by the get
  EXPECT_EQ(r.num_disk_puts, 0);
  EXPECT_EQ(r.num_disk_blocks, 0);
}

TEST_F(CacheTierActor, ServesWhatItHoldsWhenTheDiskTierIsGone) {
  start(2, /*disk_bytes=*/1 << 20);
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 0);
  EXPECT_EQ(put(2), 1);  // block 0 goes down to disk
  EXPECT_EQ(report().num_disk_puts, 1);
  caf::anon_send_exit(disk_tier_, caf::exit_reason::user_shutdown);
  sched_.run();
  EXPECT_EQ(put(0), 1);  // block 1 goes down to no one: dropped
  const std::vector<kv::kv_block> got = fetch(0, 3);  // 0 here, 1 asked of no one: answered at once
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(same_block(got[0], block(0)));
  EXPECT_EQ(fetch(2, 1).size(), 1u);
  const msg::tier_report r = report();  // at once, with the disk tier's last counters
  EXPECT_EQ(r.num_blocks, 2);
  EXPECT_EQ(r.num_evictions, 2);
  EXPECT_EQ(r.num_disk_puts, 1);
  EXPECT_EQ(r.num_disk_blocks, 1);
}

TEST_F(CacheTierActor, ABlockEvictedAndFetchedAtOnceIsReadBackFromTheDiskTier) {
  start(2, /*disk_bytes=*/1 << 20);
  EXPECT_EQ(put(0), 0);
  EXPECT_EQ(put(1), 0);
  // One asker sends the put that evicts block 0 and, without waiting, a fetch of it: the host
  // tier sends the block down and then asks for it, and the disk tier gets them in that order.
  auto got = std::make_shared<std::optional<msg::tier_blocks>>();
  sys_.spawn([=, tier = tier_, b2 = block(2), tokens = tokens_](caf::event_based_actor* self) {
    self->request(tier, caf::infinite, msg::tier_put{b2, kv::cache_class::chat}).then([](int64_t) {});
    self->request(tier, caf::infinite, msg::tier_fetch{tokens, 0, 3}).then([=](msg::tier_blocks& b) { *got = std::move(b); });
  });
  sched_.run();
  ASSERT_TRUE(got->has_value());
  ASSERT_EQ((*got)->blocks.size(), 3u);
  for (int32_t i = 0; i < 3; i++) EXPECT_TRUE(same_block((*got)->blocks[static_cast<size_t>(i)], block(i)));
  EXPECT_EQ((*got)->from_lower, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(report().num_disk_hits, 1);
}

}  // namespace
}  // namespace troupe::testing
