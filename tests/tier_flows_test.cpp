// The host tier's flows in the real engine (issue 14), under CAF's test coordinator (one
// thread, virtual clock, the executor on the scheduler): cached blocks the pool evicts are
// demoted to the node's cache tier, a later request whose prefix the pool lost is served from
// it (promoted into the pool before its prefill is planned), and every output is bit-identical
// to the same seeded request on an engine without a tier. The tier's LRU order and its TTL by
// traffic class act on the flows, and a tier that never answers only costs the wait.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/cache_tier_actor.hpp"
#include "actors/system/clock.hpp"
#include "actors/disk_tier_actor.hpp"
#include "messages/kv_block.hpp"
#include "runtime/kv/chain_hash.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/random_llama.hpp"
#include "actors/edge/disk_tier.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

/// The first `n` token ids of golden case `i` (BOS first). Cases 0, 3 and 5 differ within
/// their first block of 16, so their prompts share no cached block.
std::vector<int32_t> golden_prompt(size_t i, size_t n) {
  static const std::vector<golden_case> cases = golden_cases();
  const std::vector<int32_t>& ids = cases.at(i).token_ids;
  return {ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n)};
}

// 65 tokens: 4 full blocks of 16 and one more token, so the hit rule lets 64 come from cache.
const std::vector<int32_t> prompt_a = golden_prompt(0, 65);
const std::vector<int32_t> prompt_c = golden_prompt(5, 65);

/// A cache tier that takes every message and never answers (a stalled or partitioned tier).
actors::cache_tier_actor spawn_silent_tier(caf::actor_system& sys) {
  struct held {
    std::vector<caf::typed_response_promise<msg::tier_blocks>> fetches;
    std::vector<caf::typed_response_promise<int64_t>> puts;
  };
  auto h = std::make_shared<held>();
  return sys.spawn([h](actors::cache_tier_actor::pointer self) -> actors::cache_tier_actor::behavior_type {
    return {
        [=](msg::tier_lookup&) -> caf::result<int32_t> { return 0; },
        [=](msg::tier_put&) -> caf::result<int64_t> {
          h->puts.push_back(self->make_response_promise<int64_t>());
          return h->puts.back();
        },
        [=](msg::tier_get&) -> caf::result<msg::tier_got> { return msg::tier_got{}; },
        [=](msg::tier_fetch&) -> caf::result<msg::tier_blocks> {
          h->fetches.push_back(self->make_response_promise<msg::tier_blocks>());
          return h->fetches.back();
        },
        [=](actors::stats_atom) -> caf::result<msg::tier_report> { return msg::tier_report{}; },
        [=](msg::tier_report_to&) {},
        [=](actors::report_atom) {},
    };
  });
}

/// One engine behind a balancer on its own deterministic actor system: a test runs one with a
/// tier and one without and compares them.
class tier_bench {
 public:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_{dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())};
  actors::cache_tier_actor tier_;
  actors::disk_tier_actor disk_tier_;  // below tier_, if any
  actors::engine_actor engine_;
  actors::engine_actor decode_;  // disaggregated: the decode engine (engine_ prefills)
  actors::balancer_actor lb_;
  actors::engine_actor another_;      // start_another_node's
  actors::balancer_actor another_lb_;
  /// Applied to the engines' options before start() spawns them.
  std::function<void(actors::engine_options&)> tune;
  int32_t context_tokens = 0;  ///< the balancer's longest request (0: the bundled model's context)

  /// An engine with a pool of `pool_blocks` blocks of 16 behind a balancer, with `tier` as its
  /// host tier (none: tiers off), checking its invariants after every step.
  /// `mode`: what a victim of preemption does (engine_config::preemption). `disaggregated`: a
  /// prefill engine (engine_) and a decode engine (decode_), both over the tier as on one node.
  void start(int32_t pool_blocks, actors::cache_tier_actor tier,
             engine::preemption_mode mode = engine::preemption_mode::recompute, bool disaggregated = false) {
    sched_.clock().current_time += 1h;  // away from 0
    tier_ = std::move(tier);
    actors::engine_options o = engine_opts(/*detached_executor=*/false, pool_blocks);
    o.config.preemption = mode;
    o.check_invariants_every = 1;
    o.host_tier = tier_;
    if (tune) tune(o);
    engine_ = spawn_engine_or_die(sys_, o);
    if (disaggregated) {
      decode_ = spawn_engine_or_die(sys_, o);
      lb_ = spawn_balancer(sys_, {engine_, decode_}, {balance::engine_kind::prefill, balance::engine_kind::decode});
    } else {
      lb_ = spawn_balancer(sys_, {engine_}, {}, context_tokens);
    }
    sched_.run();
  }

  actors::cache_tier_actor host_tier(int64_t capacity_blocks, int32_t block_size = 16) {
    auto store = kv::tier_store::create({block_size, capacity_blocks, 7 * kv::day_ns, 3 * kv::day_ns});
    EXPECT_TRUE(store.has_value());
    return actors::spawn_cache_tier(sys_, std::move(*store));
  }

  /// A host tier owning `store` over a disk tier actor owning `disk` (whose reads take
  /// `read_cost` of virtual time, if given).
  actors::cache_tier_actor host_tier_over(kv::tier_store store, std::shared_ptr<kv::lower_tier> disk,
                                          actors::lower_read_cost read_cost = {}) {
    disk_tier_ = actors::spawn_disk_tier(sys_, std::move(disk), std::move(read_cost));
    return actors::spawn_cache_tier(sys_, std::move(store), disk_tier_);
  }

  /// Starts an engine with a pool of 5 over a host tier of one prompt's 4 blocks over a disk
  /// tier in `tests/tmp/tier_flows_test/<name>` (removed when the bench ends; its reads take
  /// `read_cost` of virtual time, if given), and runs A, C, then D: A's blocks end on disk.
  /// Returns A's completion.
  actors::completion start_with_a_on_disk(const std::string& name, actors::lower_read_cost read_cost = {}) {
    disk_dir_ = std::string(TROUPE_BUILD_DIR) + "/tests/tmp/tier_flows_test/" + name;
    std::filesystem::remove_all(disk_dir_);
    auto store = kv::tier_store::create({16, 4, 7 * kv::day_ns, 3 * kv::day_ns});
    auto disk = tiers::disk_tier::open({disk_dir_, 1 << 30, 16}, actors::ns_since_epoch(sched_.clock().now()));
    EXPECT_TRUE(store.has_value() && disk.has_value());
    start(5, host_tier_over(std::move(*store), std::make_shared<tiers::disk_tier>(std::move(*disk)), std::move(read_cost)));
    const actors::completion a = complete(request(prompt_a, 7));
    (void)complete(request(prompt_c, 9));               // A's blocks demoted to the host tier
    (void)complete(request(golden_prompt(3, 65), 11));  // C's too, pushing A's down to disk
    EXPECT_EQ(tier_lookup(prompt_a), 0);                // not in memory
    return a;
  }

  ~tier_bench() {
    if (another_lb_) caf::anon_send_exit(another_lb_, caf::exit_reason::user_shutdown);
    if (another_) caf::anon_send_exit(another_, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(engine_, caf::exit_reason::user_shutdown);
    if (decode_) caf::anon_send_exit(decode_, caf::exit_reason::user_shutdown);
    if (tier_) caf::anon_send_exit(tier_, caf::exit_reason::user_shutdown);
    if (disk_tier_) caf::anon_send_exit(disk_tier_, caf::exit_reason::user_shutdown);
    sched_.run();
    if (!disk_dir_.empty()) std::filesystem::remove_all(disk_dir_);
  }

  std::string disk_dir_;  // start_with_a_on_disk's

  /// A seeded sampling request (temperature 1) for 8 tokens, of traffic class `cls`.
  static msg::completion_request request(const std::vector<int32_t>& prompt, uint64_t seed,
                                         const std::string& cls = "chat") {
    msg::completion_request r = make_completion("", 8, seed);
    r.prompt_tokens = prompt;
    r.ignore_eos = true;
    r.cache_class = cls;
    return r;
  }

  /// Sends `r` and runs until nothing is left; the completion.
  actors::completion complete(const msg::completion_request& r) { return complete_together({r}).at(0); }

  /// Sends every request of `rs` at once (to `lb`, by default the bench's balancer) and runs
  /// until nothing is left; their completions.
  std::vector<actors::completion> complete_together(const std::vector<msg::completion_request>& rs,
                                                    actors::balancer_actor lb = {}) {
    std::vector<std::shared_ptr<client_log>> logs;
    for (const msg::completion_request& r : rs) {
      logs.push_back(std::make_shared<client_log>());
      spawn_logged_client(sys_, lb ? lb : lb_, r, logs.back());
    }
    sched_.run();
    std::vector<actors::completion> out;
    for (const auto& log : logs) {
      EXPECT_EQ(log->num_done, 1);
      if (!log->outcome || !log->outcome->has_value())
        ADD_FAILURE() << (log->outcome ? log->outcome->error().message : "no outcome");
      out.push_back(log->outcome && log->outcome->has_value() ? **log->outcome : actors::completion{});
    }
    return out;
  }

  /// Another node's engine, with no tier of its own, and a prefix-affinity balancer over it
  /// (index 0: ties go to it) and engine_, whose node's tier is tier_ (of `tier_blocks`, over a
  /// disk tier of at most `disk_blocks_max` blocks); run until their first reports are in.
  struct another_node {
    actors::engine_actor engine;
    actors::balancer_actor balancer;
  };
  another_node start_another_node(int64_t tier_blocks, int64_t disk_blocks_max) {
    actors::engine_options o = engine_opts(/*detached_executor=*/false, 9);
    o.check_invariants_every = 1;
    o.cluster_tiers = true;
    another_ = spawn_engine_or_die(sys_, o);
    actors::load_balancer_options lo;
    lo.engines = actors::mixed_engines({another_, engine_});
    lo.engines[1].host_tier = tier_;
    lo.engines[1].host_tier_blocks = tier_blocks;
    lo.engines[1].disk_tier_blocks_max = disk_blocks_max;
    lo.router = "prefix_affinity";
    lo.tok = bundled_shared().tok;
    lo.context_tokens = bundled_shared().ck->config().seq_len;
    another_lb_ = actors::spawn_load_balancer(sys_, std::move(lo));
    sched_.run();
    return {another_, another_lb_};
  }

  msg::engine_report report() { return report_of(engine_); }
  msg::engine_report report_of(const actors::engine_actor& e) {
    return ask_idle<msg::engine_report>(sys_, sched_, e, actors::stats_atom::value);
  }

  int32_t tier_lookup(const std::vector<int32_t>& tokens) {
    return ask_idle<int32_t>(sys_, sched_, tier_, msg::tier_lookup{tokens});
  }
};

class TierFlows : public ::testing::Test, protected tier_bench {};

void expect_same(const actors::completion& a, const actors::completion& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.text, b.text);
}

/// The outputs of A, then Q (which evicts A's blocks from a pool of 9), then A again.
struct three_runs {
  actors::completion a, q, a_again;
};

/// A, Q, then A again (seeds 7, 8, 7) on an engine with a pool of 9 and tiers off (`disaggregated`:
/// a prefill and a decode engine): what the same requests over tiers must give.
three_runs with_tiers_off(const std::vector<int32_t>& prompt_q, bool disaggregated = false) {
  tier_bench reference;
  reference.start(9, {}, engine::preemption_mode::recompute, disaggregated);
  three_runs off;
  off.a = reference.complete(tier_bench::request(prompt_a, 7));
  off.q = reference.complete(tier_bench::request(prompt_q, 8));
  off.a_again = reference.complete(tier_bench::request(prompt_a, 7));
  return off;
}

/// A's prefix demoted to the host tier by Q and promoted for the second A (`t` started with
/// its tune hook set as the test wants): the outputs of tiers off, the counts below.
void demote_and_promote_a_prefix(tier_bench& t) {
  const std::vector<int32_t> prompt_q = golden_prompt(3, 130);  // 9 blocks with its 8 tokens
  const three_runs off = with_tiers_off(prompt_q);
  t.start(9, t.host_tier(64));
  const actors::completion a = t.complete(tier_bench::request(prompt_a, 7));
  const actors::completion q = t.complete(tier_bench::request(prompt_q, 8));
  EXPECT_EQ(t.tier_lookup(prompt_a), 4);  // Q took every block of A's: the tier has A's 4 full blocks
  const actors::completion a_again = t.complete(tier_bench::request(prompt_a, 7));
  expect_same(a, off.a);
  expect_same(q, off.q);
  expect_same(a_again, off.a_again);
  expect_same(a_again, a);
  // Prefill: tiers off, the second A computes its 65 prompt tokens again; with the host tier,
  // 64 come from the promoted blocks and 1 is computed.
  EXPECT_EQ(off.a_again.end.num_cached_tokens, 0);
  EXPECT_EQ(a_again.end.num_cached_tokens, 64);
  const msg::engine_report r = t.report();
  EXPECT_EQ(r.num_prefix_hit_tokens, 64);
  EXPECT_EQ(r.num_host_hit_tokens, 64);
  EXPECT_EQ(r.num_promoted_blocks, 4);
  // A's 4 blocks when Q took them, then 4 of Q's 8 cached blocks: 3 taken by the promotion
  // (its first pop is Q's partial last block) and 1 by the second A's fresh block.
  EXPECT_EQ(r.num_demoted_blocks, 8);
  // One block: 16 token ids, and keys and values of (layers, 16 positions, kv_dim) floats.
  const model::model_config& m = bundled_shared().ck->config();
  const int64_t block_bytes = 16 * 4 + 2 * int64_t{m.n_layers} * 16 * m.kv_dim() * 4;
  EXPECT_EQ(r.num_promoted_bytes, 4 * block_bytes);
  EXPECT_EQ(r.num_demoted_bytes, 8 * block_bytes);
  EXPECT_EQ(r.host_tier_expired_blocks, 0);
}

TEST_F(TierFlows, ADemotedPrefixIsPromotedAndItsOutputIsBitIdenticalToTiersOff) { demote_and_promote_a_prefix(*this); }

/// The same with every step's moves (the demotions, the promotion's imports) on the executor's
/// copy stream, layer by layer beside the forward pass (engine_config::copy_stream_min_bytes).
TEST_F(TierFlows, ThePromotionAndDemotionsOnTheCopyStreamGiveTheSameOutputsAndCounts) {
  tune = [](actors::engine_options& o) { o.config.copy_stream_min_bytes = 0; };
  demote_and_promote_a_prefix(*this);
}

/// A random Gemma 2 (random_llama_families: layer 0 of 2 slides, layer 1 is global) written to
/// the build tree as `name`, `edit` applied to its spec first.
std::shared_ptr<const model::checkpoint> write_gemma2(const std::string& name,
                                                     const std::function<void(random_llama_spec&)>& edit = {}) {
  random_llama_spec spec;
  for (const random_llama_family& f : random_llama_families())
    if (f.name == "gemma2") spec = f.spec;
  if (edit) edit(spec);
  const std::filesystem::path dir = std::filesystem::path(TROUPE_BUILD_DIR) / "tests" / "tmp";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << random_llama_gguf(spec);
  auto loaded = model::checkpoint::load(path);
  if (!loaded) ADD_FAILURE() << loaded.error().message;
  return loaded ? std::make_shared<const model::checkpoint>(std::move(*loaded)) : nullptr;
}

/// The family's Gemma 2: its sliding layer reads 6 positions.
std::shared_ptr<const model::checkpoint> gemma2_checkpoint() {
  static const std::shared_ptr<const model::checkpoint> ck = write_gemma2("tier_flows_gemma2.gguf");
  return ck;
}

/// `n` token ids of the random models' vocabulary, a sequence of its own for each `salt`.
std::vector<int32_t> gemma_tokens(int32_t n, int32_t salt) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; i++) out.push_back(3 + (i * 37 + salt * 101) % 300);
  return out;
}

TEST_F(TierFlows, ASlidingWindowModelsTiersKeepItsWindowStateOnlyAtSequenceEndsAndReuseStaysExact) {
  ASSERT_NE(gemma2_checkpoint(), nullptr);
  const auto gemma = [](actors::engine_options& o) {
    o.checkpoint = gemma2_checkpoint();
    o.vocabulary = nullptr;
  };
  // X: P's first 65 tokens; Y: 104 (X's 4 full blocks and 40 more); two evictors; X again;
  // Z: P's first 90 tokens, then 30 of its own (it leaves Y's path inside Y's block 5).
  const std::vector<int32_t> p = gemma_tokens(104, 0);
  const std::vector<int32_t> x(p.begin(), p.begin() + 65);
  std::vector<int32_t> z(p.begin(), p.begin() + 90);
  for (const int32_t t : gemma_tokens(30, 1)) z.push_back(t);
  const std::vector<msg::completion_request> requests = {request(x, 7), request(p, 8), request(gemma_tokens(65, 2), 9),
                                                         request(gemma_tokens(65, 3), 10), request(x, 7), request(z, 11)};
  tier_bench reference;
  reference.tune = gemma;
  reference.start(9, {});
  std::vector<actors::completion> off, on;
  for (const msg::completion_request& r : requests) off.push_back(reference.complete(r));
  tune = gemma;
  start(9, host_tier(64));
  for (const msg::completion_request& r : requests) on.push_back(complete(r));
  for (size_t i = 0; i < requests.size(); i++) {
    SCOPED_TRACE(i);
    expect_same(on[i], off[i]);
    // Tiers off: Y extends X in the pool, and Z the X computed again just before it.
    EXPECT_EQ(off[i].end.num_cached_tokens, i == 1 || i == 5 ? 64 : 0);
  }
  // The evictors took every block of P's: the tier holds Y's 6 full blocks. Freed, X left the
  // window state at 64 (positions 59-63) in block 3 and Y the one at 96 in block 5: those two
  // were demoted with both layers, blocks 0-2 and 4 with the global layer only.
  EXPECT_EQ(tier_lookup(p), 6);
  // X again: blocks 0-3 from the tier, the window state at 64 with them: 64 cached.
  EXPECT_EQ(on[4].end.num_cached_tokens, 64);
  // Z: blocks 0-4 match (its block 5 does not), but block 4 came without its sliding rows, so
  // the window state at 80 is missing: Z reuses up to X's end, exactly, and computes 56.
  EXPECT_EQ(on[5].end.num_cached_tokens, 64);
  const msg::engine_report r = report();
  const model::model_config& m = gemma2_checkpoint()->config();
  const int64_t whole = 16 * 4 + 2 * int64_t{m.n_layers} * 16 * m.kv_dim() * 4, global = 16 * 4 + 2 * 16 * m.kv_dim() * 4;
  EXPECT_EQ(r.num_promoted_blocks, 5);  // X again's 4, then Z's block 4
  EXPECT_EQ(r.num_promoted_bytes, 4 * global + whole);
  // Every full block of P's and the evictors' went down: of each prompt's, those holding the
  // window state at its end whole (P: blocks 3 and 5; each evictor: its block 3), the others
  // with the global layer only.
  EXPECT_EQ(r.num_demoted_blocks, 14);
  EXPECT_EQ(r.num_demoted_bytes, 4 * whole + 10 * global);
}

// The seed's worked example (§2: block 128, window 128, slack 6, a 10,000-token prompt) through
// the engine, on a random Gemma 2 whose sliding layer reads 128 positions.
TEST_F(TierFlows, TheSeedsWorkedExampleThroughTheEngineWithTheWindowStateAndWithoutIt) {
  const std::shared_ptr<const model::checkpoint> ck = write_gemma2("tier_flows_gemma2_seed.gguf", [](random_llama_spec& s) {
    s.dim = 32;
    s.n_heads = 2;
    s.n_kv_heads = 1;
    s.context_length = 10240;
    s.sliding_window = 128;
  });
  ASSERT_NE(ck, nullptr);
  const auto seed_engine = [&](actors::engine_options& o) {
    o.checkpoint = ck;
    o.vocabulary = nullptr;
    o.config.block_size = 128;
    o.config.scheduler.prefix_cache_slack_tokens = 6;
  };
  // A: a 9,866-token turn (it ends with 77 whole blocks: the window state at 9,856 is in its
  // block 76), then A2: A and 134 tokens more. T1 and T2: turns of 9,740 and 9,990 tokens of P
  // (window states at 9,728, block 75, and at 9,984); X: P's first 9,866 tokens and 134 of its
  // own, leaving T2's path inside T2's block 77.
  const std::vector<int32_t> a = gemma_tokens(9866, 4), p = gemma_tokens(9990, 5);
  std::vector<int32_t> a2 = a, x(p.begin(), p.begin() + 9866);
  for (const int32_t t : gemma_tokens(134, 6)) {
    a2.push_back(t);
    x.push_back(t);
  }
  const std::vector<msg::completion_request> requests = {
      request(a, 7), request({p.begin(), p.begin() + 9740}, 8), request(p, 9), request(a2, 10), request(x, 11)};
  tier_bench reference;
  reference.tune = seed_engine;
  reference.context_tokens = 10240;
  reference.start(90, {});
  std::vector<actors::completion> off, on;
  for (const msg::completion_request& r : requests) off.push_back(reference.complete(r));
  tune = seed_engine;
  context_tokens = 10240;
  start(90, host_tier(400, 128));
  for (const msg::completion_request& r : requests) on.push_back(complete(r));
  for (size_t i = 0; i < requests.size(); i++) {
    SCOPED_TRACE(i);
    expect_same(on[i], off[i]);
  }
  // A2: A's blocks came back from the tier, block 76 with its sliding rows: the window state at
  // 9,856 is there, so 9,856 tokens are reused and 144 computed.
  EXPECT_EQ(on[3].end.num_cached_tokens, 9856);
  // X: P's blocks 0-76 came back, block 76 (inside T2) without its sliding rows: the window
  // state at 9,856 is missing, and the one at 9,728 (T1's end, block 75) is there: 9,728
  // reused, 272 computed (the seed: 9,728 reused, 400 computed, 128 of them replayed).
  EXPECT_EQ(on[4].end.num_cached_tokens, 9728);
  EXPECT_LT(off[3].end.num_cached_tokens, 9856);
  EXPECT_LT(off[4].end.num_cached_tokens, 9728);
}

TEST_F(TierFlows, TheTiersLruOrderDecidesWhichPrefixComesBack) {
  start(5, host_tier(4));  // a pool of one request, a tier of one prompt's 4 blocks
  const actors::completion a = complete(request(prompt_a, 7));
  const actors::completion c = complete(request(prompt_c, 9));  // evicts A's blocks: demoted
  EXPECT_EQ(tier_lookup(prompt_a), 4);
  const actors::completion a_again = complete(request(prompt_a, 7));  // A promoted; C's blocks demoted, evicting A's
  EXPECT_EQ(a_again.end.num_cached_tokens, 64);
  EXPECT_EQ(tier_lookup(prompt_a), 0);
  EXPECT_EQ(tier_lookup(prompt_c), 4);
  const actors::completion c_again = complete(request(prompt_c, 9));
  EXPECT_EQ(c_again.end.num_cached_tokens, 64);
  expect_same(a_again, a);
  expect_same(c_again, c);
  EXPECT_EQ(report().num_host_hit_tokens, 128);
}

TEST_F(TierFlows, BlocksExpireByTheirRequestsClassOnTheActorSystemsClock) {
  const std::vector<int32_t> prompt_d = golden_prompt(3, 65);
  start(5, host_tier(64));
  const actors::completion a = complete(request(prompt_a, 7, "agent"));
  const actors::completion c = complete(request(prompt_c, 9, "chat"));  // A's blocks demoted as agent's
  (void)complete(request(prompt_d, 11, "chat"));                         // C's demoted as chat's
  EXPECT_EQ(tier_lookup(prompt_a), 4);
  EXPECT_EQ(tier_lookup(prompt_c), 4);
  sched_.clock().current_time += 3 * 24h;  // agent's 3 days are over, chat's 7 are not
  EXPECT_EQ(tier_lookup(prompt_a), 0);
  EXPECT_EQ(tier_lookup(prompt_c), 4);
  EXPECT_EQ(report().host_tier_expired_blocks, 4);
  const actors::completion a_again = complete(request(prompt_a, 7, "agent"));
  const actors::completion c_again = complete(request(prompt_c, 9, "chat"));
  EXPECT_EQ(a_again.end.num_cached_tokens, 0);  // recomputed
  EXPECT_EQ(c_again.end.num_cached_tokens, 64);  // from the host tier
  expect_same(a_again, a);
  expect_same(c_again, c);
}

TEST_F(TierFlows, HostTierEvictionsGoToTheDiskTierAndComeBackFromThere) {
  const actors::completion a = start_with_a_on_disk("disk");
  const actors::completion a_again = complete(request(prompt_a, 7));
  EXPECT_EQ(a_again.end.num_cached_tokens, 64);           // from disk, through the host tier
  expect_same(a_again, a);
  const msg::tier_report r = ask_idle<msg::tier_report>(sys_, sched_, tier_, actors::stats_atom::value);
  EXPECT_EQ(r.num_disk_hits, 4);
  EXPECT_EQ(r.num_disk_puts, 8);  // A's 4, then C's 4 when the second A's promotion demoted D's
  EXPECT_EQ(r.num_disk_refused, 0);
  const msg::engine_report e = report();  // the engine counts the disk's share of its tier hits
  EXPECT_EQ(e.num_host_hit_tokens, 64);
  EXPECT_EQ(e.num_disk_hit_tokens, 64);
}

TEST_F(TierFlows, AFullDiskTierEvictsItsLeastRecentlyUsedBlocksAndServesOn) {
  // The flow above over a disk tier of one prompt's 4 block files: A's blocks are read back
  // from disk, then C's, written down after them, evict them there.
  const std::string dir = std::string(TROUPE_BUILD_DIR) + "/tests/tmp/tier_flows_test/full_disk";
  std::filesystem::remove_all(dir);
  const model::model_config& m = bundled_shared().ck->config();
  kv::kv_block shape;  // every block file of this model has one size
  shape.tokens.assign(16, 0);
  shape.parent_hash = kv::root_hash_seed;
  shape.hash = kv::chain_hash(shape.parent_hash, shape.tokens.data(), 16);
  shape.num_layers = m.n_layers;
  shape.kv_dim = m.kv_dim();
  shape.keys.assign(size_t(m.n_layers) * 16 * size_t(m.kv_dim()) * sizeof(float), 0);
  shape.values = shape.keys;
  const auto file_bytes = static_cast<int64_t>(msg::encode_kv_block(shape).size());
  auto store = kv::tier_store::create({16, 4, 7 * kv::day_ns, 3 * kv::day_ns});
  auto opened = tiers::disk_tier::open({dir, 4 * file_bytes, 16}, actors::ns_since_epoch(sched_.clock().now()));
  ASSERT_TRUE(store.has_value() && opened.has_value());
  const auto disk = std::make_shared<tiers::disk_tier>(std::move(*opened));
  start(5, host_tier_over(std::move(*store), disk));
  const actors::completion a = complete(request(prompt_a, 7));
  (void)complete(request(prompt_c, 9));
  (void)complete(request(golden_prompt(3, 65), 11));  // A's blocks down to disk
  const actors::completion a_again = complete(request(prompt_a, 7));
  EXPECT_EQ(a_again.end.num_cached_tokens, 64);  // from disk, then C's blocks go down
  expect_same(a_again, a);
  disk->check_invariants();
  const std::vector<uint64_t> lru = disk->lru_order();
  const std::vector<uint64_t> c_hashes = kv::chain_hashes(prompt_c, 16);
  EXPECT_EQ(std::set<uint64_t>(lru.begin(), lru.end()), std::set<uint64_t>(c_hashes.begin(), c_hashes.end()));
  EXPECT_EQ(disk->num_evictions(), 4);  // A's 4
  EXPECT_EQ(disk->num_bytes(), 4 * file_bytes);
  const msg::tier_report r = ask_idle<msg::tier_report>(sys_, sched_, tier_, actors::stats_atom::value);
  EXPECT_EQ(r.num_disk_puts, 8);
  EXPECT_EQ(r.num_disk_refused, 0);
  EXPECT_EQ(r.num_disk_blocks, 4);
  std::filesystem::remove_all(dir);
}

/// Prices for fetch or recompute (issue 54, engine_core::plan_fetch): a prompt token computes in
/// `token_ns` by the engine's step-time model, and a block copies from the host tier to the pool
/// at `copy_gb_s`.
std::function<void(actors::engine_options&)> priced(double token_ns, double copy_gb_s) {
  return [=](actors::engine_options& o) {
    o.config.scheduler.step_cost.token_ns = token_ns;
    o.config.swap_bandwidth_gb_s = copy_gb_s;
  };
}

TEST_F(TierFlows, AFetchPredictedSlowerThanRecomputingIsDeclinedAndTheOutputIsBitIdentical) {
  const std::vector<int32_t> prompt_q = golden_prompt(3, 130);
  const three_runs off = with_tiers_off(prompt_q);
  // A token computes in 1 ns; a block's copy at 1 kB/s takes minutes: nothing is worth asking.
  tune = priced(1, 1e-6);
  start(9, host_tier(64));
  const actors::completion a = complete(request(prompt_a, 7));
  (void)complete(request(prompt_q, 8));
  EXPECT_EQ(tier_lookup(prompt_a), 4);  // the tier holds A's prefix, as in the first test
  const actors::completion a_again = complete(request(prompt_a, 7));
  expect_same(a, off.a);
  expect_same(a_again, off.a_again);
  EXPECT_EQ(a_again.end.num_cached_tokens, 0);  // recomputed: the tier was not asked
  const msg::engine_report r = report();
  EXPECT_EQ(r.num_tier_fetches, 0);
  EXPECT_EQ(r.num_tier_fetches_declined, 3);  // A, Q and A again
  EXPECT_EQ(r.num_host_hit_tokens, 0);
  EXPECT_EQ(ask_idle<msg::tier_report>(sys_, sched_, tier_, actors::stats_atom::value).num_hits, 0);
}

TEST_F(TierFlows, ASlowDiskFetchIsCutToTheBlocksThatArrivedWithinItsBudgetAndTheRestIsRecomputed) {
  // The disk flow above on virtual time: a block takes 25 ms to read. A token computes in 1 ms
  // and copies are free, so asking for A's 4 blocks pays while they arrive within 64 ms (its
  // budget, computing 64 tokens): the disk reads 2 (50 ms; a third would end at 75).
  tune = priced(1e6, 1e6);
  const actors::completion a =
      start_with_a_on_disk("slow_disk", [](int64_t num_blocks) { return caf::timespan{num_blocks * 25'000'000}; });
  auto waiting = std::make_shared<client_log>();
  spawn_logged_client(sys_, lb_, request(prompt_a, 7), waiting);
  sched_.run();
  EXPECT_EQ(waiting->num_done, 0);  // the 2 reads take 50 ms
  sched_.advance_time(50ms);
  sched_.run();
  ASSERT_EQ(waiting->num_done, 1);
  ASSERT_TRUE(waiting->outcome->has_value()) << waiting->outcome->error().message;
  const actors::completion& a_again = **waiting->outcome;
  EXPECT_EQ(a_again.end.num_cached_tokens, 32);  // 2 blocks from disk; 33 tokens recomputed
  expect_same(a_again, a);
  const msg::tier_report t = ask_idle<msg::tier_report>(sys_, sched_, tier_, actors::stats_atom::value);
  EXPECT_EQ(t.num_disk_hits, 2);
  const msg::engine_report e = report();
  EXPECT_EQ(e.num_disk_hit_tokens, 32);
  EXPECT_EQ(e.num_tier_fetches, 4);
}

TEST_F(TierFlows, ATierThatNeverAnswersCostsOnlyTheWaitAndTheEngineServesOthersMeanwhile) {
  actors::completion off;
  {
    tier_bench reference;
    reference.start(9, {});
    off = reference.complete(request(prompt_a, 7));
  }
  start(9, spawn_silent_tier(sys_));
  auto waiting = std::make_shared<client_log>();
  spawn_logged_client(sys_, lb_, request(prompt_a, 7), waiting);
  sched_.run();
  EXPECT_EQ(waiting->num_done, 0);  // waits for the tier (50 ms of virtual time)
  // A one-block prompt has nothing to fetch: it runs to its end while the other waits.
  const actors::completion short_one = complete(request(golden_prompt(3, 16), 3));
  EXPECT_EQ(short_one.tokens.size(), 8u);
  EXPECT_EQ(waiting->num_done, 0);
  sched_.advance_time(50ms);  // the fetch times out: the prompt is recomputed
  sched_.run();
  ASSERT_EQ(waiting->num_done, 1);
  ASSERT_TRUE(waiting->outcome->has_value()) << waiting->outcome->error().message;
  const actors::completion& a = **waiting->outcome;
  expect_same(a, off);
  EXPECT_EQ(a.end.num_cached_tokens, 0);
}

TEST_F(TierFlows, AVictimOfPreemptionSwappedInFromTheHostTierContinuesBitIdentically) {
  // Two 33-token prompts on a pool of 8 blocks of 16: both run until they need a fifth block,
  // then the second is preempted; the first's growth takes a block the victim left cached
  // (demoted to the tier), and the victim, readmitted, is swapped in from there.
  msg::completion_request first = request(golden_prompt(0, 33), 7);
  first.max_tokens = 64;
  msg::completion_request second = request(golden_prompt(5, 33), 9);
  second.max_tokens = 40;
  std::vector<actors::completion> off;
  {
    tier_bench reference;  // tiers off: the victim recomputes
    reference.start(8, {});
    off = reference.complete_together({first, second});
  }
  start(8, host_tier(64), engine::preemption_mode::swap);
  const std::vector<actors::completion> swapped = complete_together({first, second});
  ASSERT_EQ(off.size(), 2u);
  ASSERT_EQ(swapped.size(), 2u);
  expect_same(swapped[0], off[0]);
  expect_same(swapped[1], off[1]);
  EXPECT_EQ(off[1].end.num_preemptions, 1);
  EXPECT_EQ(swapped[1].end.num_preemptions, 1);
  // The victim had 63 tokens (33 + 30 sampled): the hit rule allows 3 blocks. The pool kept 2;
  // the third (demoted when the first request's growth took it) comes back from the tier, so 14
  // tokens are computed again instead of 30.
  EXPECT_EQ(off[1].end.num_recomputed_tokens, 30);
  EXPECT_EQ(swapped[1].end.num_recomputed_tokens, 14);
  const msg::engine_report r = report();
  EXPECT_EQ(r.num_promoted_blocks, 1);
  EXPECT_EQ(r.num_swap_in_tokens, 16);
  EXPECT_EQ(r.num_host_hit_tokens, 0);  // first admissions only: the pool's hits are never below it
}

TEST_F(TierFlows, ADisaggregatedPairTakesThePrefixFromTheHostTierWithTheSameOutputs) {
  // A, then Q evicting A's blocks from the prefill engine's pool of 9, then A again, each
  // prefilled by one engine and decoded by the other, with tiers off and over one host tier.
  const std::vector<int32_t> prompt_q = golden_prompt(3, 130);
  const three_runs off = with_tiers_off(prompt_q, /*disaggregated=*/true);
  start(9, host_tier(64), engine::preemption_mode::recompute, /*disaggregated=*/true);
  const actors::completion a = complete(request(prompt_a, 7));
  const actors::completion q = complete(request(prompt_q, 8));
  const actors::completion a_again = complete(request(prompt_a, 7));
  expect_same(a, off.a);
  expect_same(q, off.q);
  expect_same(a_again, off.a_again);
  expect_same(a_again, a);
  // The prefill engine computes the prompt but its last token (64 tokens): the hit rule lets 3
  // of those 4 blocks come from cache, promoted from the tier. (The completion's
  // num_cached_tokens is the decode engine's admission, which imports the KV: 0.)
  const msg::engine_report prefill = report();
  EXPECT_EQ(prefill.num_generated_tokens, 0);
  EXPECT_EQ(prefill.num_host_hit_tokens, 48);
  EXPECT_EQ(prefill.num_promoted_blocks, 3);
  EXPECT_EQ(report_of(decode_).num_generated_tokens, 3 * 8);
}

TEST_F(TierFlows, AnEngineWithoutATierFetchesThePrefixFromTheTierOfAnotherNodeThatTheBalancerNames) {
  // A, then Q evicting A's blocks to the tier of the first engine's node. Then another node's
  // engine, which has no tier of its own, and a prefix-affinity balancer over both: the tier
  // reports A's 4 blocks, both engines count them as cached, the tie goes to the other engine
  // (index 0), and the placement names the first node's tier, from which it fetches them.
  const std::vector<int32_t> prompt_q = golden_prompt(3, 130);
  const three_runs off = with_tiers_off(prompt_q);
  start(9, host_tier(64));
  const actors::completion a = complete(request(prompt_a, 7));
  const actors::completion q = complete(request(prompt_q, 8));
  ASSERT_EQ(tier_lookup(prompt_a), 4);
  const another_node n = start_another_node(64, 0);  // the reports: the pool's (Q's blocks), the tier's (A's)
  const actors::completion a_again = complete_together({request(prompt_a, 7)}, n.balancer).at(0);
  expect_same(a, off.a);
  expect_same(q, off.q);
  expect_same(a_again, off.a_again);
  EXPECT_EQ(a_again.end.num_cached_tokens, 64);
  const msg::engine_report r = report_of(n.engine);
  EXPECT_EQ(r.num_generated_tokens, 8);
  EXPECT_EQ(r.num_host_hit_tokens, 64);
  EXPECT_EQ(r.num_promoted_blocks, 4);
  EXPECT_EQ(r.num_demoted_blocks, 0);  // no tier of its own to demote to
  EXPECT_EQ(report().num_generated_tokens, 16);  // A and Q only
}

TEST_F(TierFlows, AnEngineWithoutATierFetchesThroughAnotherNodesTierThePrefixOnlyItsDiskTierHolds) {
  // As HostTierEvictionsGoToTheDiskTier...: A's blocks end on disk below the first node's tier.
  // The tier relays its disk tier's hashes: the balancer counts A's prefix as that tier's, and
  // the other node's engine fetches it through the host tier from disk.
  const actors::completion a = start_with_a_on_disk("disk_directory");
  const another_node n = start_another_node(4, 1024);
  const actors::completion a_again = complete_together({request(prompt_a, 7)}, n.balancer).at(0);
  expect_same(a_again, a);
  EXPECT_EQ(a_again.end.num_cached_tokens, 64);
  const msg::engine_report r = report_of(n.engine);
  EXPECT_EQ(r.num_generated_tokens, 8);
  EXPECT_EQ(r.num_host_hit_tokens, 64);
  EXPECT_EQ(r.num_disk_hit_tokens, 64);
}

TEST_F(TierFlows, ADecodeEngineSharesThePrefixItHoldsWithAnImportedRequest) {
  // No tier: A, then A again with another seed, prefilled by one engine and decoded by the
  // other. The decode engine still holds the first A's 4 full blocks: the second import shares
  // them and writes nothing (its 64 imported tokens are those blocks).
  actors::completion mixed_a, mixed_b;
  {
    tier_bench reference;  // one engine that does both
    reference.start(32, {});
    mixed_a = reference.complete(request(prompt_a, 7));
    mixed_b = reference.complete(request(prompt_a, 8));
  }
  start(32, {}, engine::preemption_mode::recompute, /*disaggregated=*/true);
  const actors::completion a = complete(request(prompt_a, 7));
  const actors::completion b = complete(request(prompt_a, 8));
  expect_same(a, mixed_a);
  expect_same(b, mixed_b);
  EXPECT_EQ(a.end.num_cached_tokens, 0);
  EXPECT_EQ(b.end.num_cached_tokens, 64);  // the decode engine's admission shared its blocks
  EXPECT_EQ(report_of(decode_).num_prefix_hit_tokens, 64);
  EXPECT_EQ(report().num_prefix_hit_tokens, 48);  // the prefill engine's own hit (64 tokens, rule: 3 blocks)
}

TEST_F(TierFlows, AnUnknownCacheClassIsRefusedAtTheRequestsDoor) {
  start(9, host_tier(64));
  auto log = std::make_shared<client_log>();
  spawn_logged_client(sys_, lb_, request(prompt_a, 7, "batch"), log);
  sched_.run();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_FALSE(log->outcome->has_value());
  EXPECT_EQ(log->outcome->error().code, errc::invalid_argument);
  EXPECT_NE(log->outcome->error().message.find("batch"), std::string::npos) << log->outcome->error().message;
}

}  // namespace
}  // namespace troupe::testing
