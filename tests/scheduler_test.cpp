// sched::scheduler: exact step plans (chunks, copies, preemptions) and exact block ids for
// chunked prefill, decode-first ordering, max_num_seqs, preemption, priorities, prefix hits,
// fork and remove. Invariants are checked after every schedule and every complete.
#include "runtime/sched/scheduler.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace troupe::sched {

inline bool operator==(const scheduled_chunk& a, const scheduled_chunk& b) {
  return a.seq == b.seq && a.first_position == b.first_position && a.num_tokens == b.num_tokens &&
         a.samples == b.samples;
}

inline std::ostream& operator<<(std::ostream& os, const scheduled_chunk& c) {
  return os << "{seq " << c.seq << ", pos " << c.first_position << ", n " << c.num_tokens
            << (c.samples ? ", samples}" : "}");
}

}  // namespace troupe::sched

namespace troupe::kv {
inline std::ostream& operator<<(std::ostream& os, const block_copy& c) {
  return os << "{" << c.src << " -> " << c.dst << "}";
}
}  // namespace troupe::kv

namespace troupe::sched {
namespace {

using chunks = std::vector<scheduled_chunk>;
using ids = std::vector<kv::block_id>;
using seqs = std::vector<seq_id>;

/// `n` tokens first, first + 1, ...: distinct, so every block has its own hash.
std::vector<int32_t> token_range(int32_t n, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = first + i;
  return tokens;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void make(int32_t num_blocks, int32_t block_size, int32_t max_num_batched_tokens,
            int32_t max_num_seqs) {
    make(num_blocks, block_size, scheduler_config{max_num_batched_tokens, max_num_seqs});
  }

  void make(int32_t num_blocks, int32_t block_size, const scheduler_config& config) {
    sched_.reset();  // before the block manager it refers to
    auto bm = kv::block_manager::create({num_blocks, block_size});
    ASSERT_TRUE(bm.has_value());
    blocks_ = std::make_unique<kv::block_manager>(std::move(*bm));
    sched_ = std::make_unique<scheduler>(config, *blocks_);
    sched_->check_invariants();
  }

  step_plan schedule() {
    step_plan plan = sched_->schedule();
    sched_->check_step();  // the per-step check raises no false alarm
    sched_->check_invariants();
    int32_t num_tokens = 0;
    for (const scheduled_chunk& c : plan.chunks) num_tokens += c.num_tokens;
    EXPECT_EQ(plan.num_batched_tokens, num_tokens);
    return plan;
  }

  void complete(const step_plan& plan, const std::vector<int32_t>& sampled) {
    sched_->complete(plan, sampled);
    sched_->check_step();
    sched_->check_invariants();
  }

  /// Adds a sequence with no practical length limit.
  void add(seq_id id, std::vector<int32_t> prompt, int32_t priority) {
    sched_->add(id, std::move(prompt), priority, 1000);
    sched_->check_invariants();
  }

  const ids& table(seq_id seq) const { return blocks_->block_table(seq); }

  std::unique_ptr<kv::block_manager> blocks_;
  std::unique_ptr<scheduler> sched_;
};

TEST_F(SchedulerTest, ChunkedPrefillUnderTheTokenBudget) {
  make(16, 4, 4, 8);
  add(0, token_range(10, 10), 0);

  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, false}}));
  EXPECT_EQ(p.num_batched_tokens, 4);
  EXPECT_EQ(table(0), (ids{0}));
  complete(p, {});
  EXPECT_EQ(sched_->get(0).num_computed_tokens, 4);
  EXPECT_TRUE(blocks_->is_cached(0));  // a fully computed block is offered to the prefix cache

  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 4, 4, false}}));
  EXPECT_EQ(table(0), (ids{0, 1}));
  complete(p, {});
  EXPECT_TRUE(blocks_->is_cached(1));

  p = schedule();  // the last 2 prompt tokens: this chunk samples the first new token
  EXPECT_EQ(p.chunks, (chunks{{0, 8, 2, true}}));
  EXPECT_EQ(table(0), (ids{0, 1, 2}));
  complete(p, {50});
  EXPECT_EQ(sched_->get(0).tokens, concat(token_range(10, 10), {50}));
  EXPECT_EQ(sched_->get(0).num_computed_tokens, 10);
  EXPECT_FALSE(blocks_->is_cached(2));

  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 10, 1, true}}));
  EXPECT_EQ(table(0), (ids{0, 1, 2}));
  complete(p, {51});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 11, 1, true}}));
  EXPECT_EQ(table(0), (ids{0, 1, 2}));
  complete(p, {52});
  EXPECT_TRUE(blocks_->is_cached(2));
  p = schedule();  // position 12 starts a new block
  EXPECT_EQ(p.chunks, (chunks{{0, 12, 1, true}}));
  EXPECT_EQ(table(0), (ids{0, 1, 2, 3}));
  EXPECT_TRUE(p.copies.empty());
  EXPECT_TRUE(p.preempted.empty());
}

/// A 2 µs step budget priced by 1 µs per step, 10 ns per token, 50 ns per sample and 2 ns per
/// attended position: a chunk of q tokens from position c costs q² + (11 + 2c)q on top of the
/// step (tests/chunk_budget_test.cpp works the same fit by hand).
scheduler_config time_budgeted(int32_t max_num_batched_tokens) {
  scheduler_config c{max_num_batched_tokens, 8};
  c.step_time_budget_ms = 0.002;
  c.step_cost = {1000, 10, 50, 2, 0};
  return c;
}

TEST_F(SchedulerTest, TheTimeBudgetCutsLaterChunksOfAPromptShorter) {
  make(64, 16, time_budgeted(512));
  add(0, token_range(60, 10), 0);
  // c = 0: q² + 11q <= 1000 -> 26; c = 26: q² + 63q -> 13 (988); c = 39: q² + 89q -> 10
  // (990); c = 49: q² + 109q -> 8 (936); c = 57: the last 3 and the sample, 384 + 50.
  const chunks want[] = {{{0, 0, 26, false}}, {{0, 26, 13, false}}, {{0, 39, 10, false}},
                         {{0, 49, 8, false}}, {{0, 57, 3, true}}};
  for (const chunks& w : want) {
    step_plan p = schedule();
    EXPECT_EQ(p.chunks, w);
    complete(p, w.back().samples ? std::vector<int32_t>{70} : std::vector<int32_t>{});
  }
  // Sequence 0 decodes at position 60: 1000 + 10 + 50 + 2 * 61 = 1182 ns, leaving 818 for
  // the new prompt: q² + 11q <= 818 -> 23 (782; 24 would be 840).
  add(1, token_range(30, 100), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 60, 1, true}, {1, 0, 23, false}}));
  complete(p, {71});
  // The token budget still caps: with 5 tokens a step, a 5-token chunk fits the time.
  make(64, 16, time_budgeted(5));
  add(2, token_range(60, 10), 0);
  EXPECT_EQ(schedule().chunks, (chunks{{2, 0, 5, false}}));
}

TEST_F(SchedulerTest, ABudgetBelowOneStepStillPrefillsOneTokenButNeverBesideADecode) {
  scheduler_config c = time_budgeted(512);
  c.step_time_budget_ms = 0.0005;  // below the 1 µs step
  make(64, 16, c);
  add(0, token_range(3, 10), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 1, false}}));  // alone in its step: one token
  complete(p, {});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 1, 1, false}}));
  complete(p, {});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 2, 1, true}}));
  complete(p, {50});
  add(1, token_range(8, 40), 0);
  p = schedule();  // the decode row runs; the new prompt waits (no time and not alone)
  EXPECT_EQ(p.chunks, (chunks{{0, 3, 1, true}}));
  EXPECT_EQ(sched_->num_waiting(), 1);
}

TEST_F(SchedulerTest, AKvWatermarkKeepsALongPromptWaitingInsteadOfPreemptingIt) {
  // 10 blocks of 4 slots, 8 tokens a step; two 16-token prompts. Without a watermark, 1 is
  // admitted beside 0's decode at step 3 and preempted at step 7, when 0's growth needs its
  // 6th block and none is free. With 20% of the pool kept (2 blocks), 1 needs 4 blocks for its
  // whole prompt, 0 one more for its known tokens: 4 + 1 + 2 > the 6 free, so 1 waits.
  for (const double watermark : {0.0, 0.2}) {
    SCOPED_TRACE(watermark);
    scheduler_config c{8, 8};
    c.kv_watermark = watermark;
    make(10, 4, c);
    add(0, token_range(16, 10), 0);
    add(1, token_range(16, 40), 0);
    int32_t first_step_of_1 = -1;
    for (int32_t step = 1; step <= 12; step++) {
      const step_plan p = schedule();
      for (const scheduled_chunk& chunk : p.chunks)
        if (chunk.seq == 1 && first_step_of_1 < 0) first_step_of_1 = step;
      if (!p.preempted.empty()) EXPECT_EQ(step, 7);
      std::vector<int32_t> sampled;
      for (const scheduled_chunk& chunk : p.chunks)
        if (chunk.samples) sampled.push_back(99);
      complete(p, sampled);
    }
    EXPECT_EQ(sched_->num_preemptions(), watermark == 0 ? 1 : 0);
    EXPECT_EQ(first_step_of_1, watermark == 0 ? 3 : -1);
  }
  sched_->remove(0);  // with nothing running, the first chunk's blocks suffice again
  EXPECT_EQ(schedule().chunks, (chunks{{1, 0, 8, false}}));
}

TEST_F(SchedulerTest, WithATimeBudgetAdmissionAlsoKeepsTheDecodersGrowthDuringThePrefill) {
  // Blocks of 2 slots, 14 blocks, 10% kept (llround(1.4) = 1 block). Sequence 0 decodes; a
  // 16-token prompt needs 8 blocks. At step 2, 0 holds 3 blocks (11 free) and needs none more
  // for its known tokens: 8 + 1 <= 11 admits the prompt by the watermark alone. With the
  // time budget, the prompt's chunks are priced as one at its end beside 0's decode row
  // (position 5: 1000 + 10 + 50 + 2 * 6 = 1072 ns of 1240): q² + 41q <= 168 -> 3 tokens, so
  // 16 tokens take 6 steps, in which 0 grows from 6 to 12 tokens: 3 more blocks, and
  // 8 + 1 + 3 > 11 keeps the prompt waiting.
  for (const bool time_budget : {false, true}) {
    SCOPED_TRACE(time_budget);
    scheduler_config c{64, 8};
    c.kv_watermark = 0.1;
    if (time_budget) {
      c.step_time_budget_ms = 0.00124;
      c.step_cost = {1000, 10, 50, 2, 0};
    }
    make(14, 2, c);
    add(0, token_range(4, 10), 0);
    step_plan p = schedule();
    EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, true}}));
    complete(p, {50});
    add(1, token_range(16, 40), 0);
    p = schedule();
    EXPECT_EQ(table(0), (ids{0, 1, 2}));
    if (time_budget) {
      EXPECT_EQ(p.chunks, (chunks{{0, 4, 1, true}}));
      EXPECT_EQ(sched_->num_waiting(), 1);
    } else {
      EXPECT_EQ(p.chunks, (chunks{{0, 4, 1, true}, {1, 0, 16, true}}));
    }
    complete(p, time_budget ? std::vector<int32_t>{51} : std::vector<int32_t>{51, 52});
  }
  // With nothing running the first chunk's blocks suffice again: alone, q² + 11q <= 240 -> 10.
  sched_->remove(0);
  EXPECT_EQ(schedule().chunks, (chunks{{1, 0, 10, false}}));
}

TEST_F(SchedulerTest, PreemptionTakesTheCheapestVictimThatCoversTheStep) {
  // Blocks of 4 slots, 7 blocks, all held after the first step: 0 (4 tokens, block 0), 1 (8,
  // blocks 1-2), 2 (16, blocks 3-6). Each decode row needs a new block: 3 short. Preempting 1
  // frees 2 blocks and drops its own need: 3, enough, at a recompute cost of 8 tokens; 2 would
  // cover it too, at 16. So 1 gives way, not the back of the running order.
  make(7, 4, 64, 8);
  add(0, token_range(4, 10), 0);
  add(1, token_range(8, 20), 0);
  add(2, token_range(16, 40), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, true}, {1, 0, 8, true}, {2, 0, 16, true}}));
  complete(p, {1, 2, 3});
  EXPECT_EQ(blocks_->num_free_blocks(), 0);
  p = schedule();
  EXPECT_EQ(p.preempted, (seqs{1}));
  EXPECT_EQ(p.chunks, (chunks{{0, 4, 1, true}, {2, 16, 1, true}}));
  EXPECT_EQ(table(0), (ids{0, 2}));  // 1's table came back tail first: 2, then 1
  EXPECT_EQ(table(2), (ids{3, 4, 5, 6, 1}));
  EXPECT_EQ(sched_->num_preemptions(), 1);
  complete(p, {4, 5});
}

TEST_F(SchedulerTest, PreemptionStaysWithinThePolicysLastRankClass) {
  // As above, but 1 has the better priority: only 2 (the last rank class) may give way.
  make(7, 4, 64, 8);
  add(0, token_range(4, 10), 0);
  add(1, token_range(8, 20), -1);
  add(2, token_range(16, 40), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 0, 8, true}, {0, 0, 4, true}, {2, 0, 16, true}}));
  complete(p, {1, 2, 3});
  p = schedule();
  EXPECT_EQ(p.preempted, (seqs{2}));
  EXPECT_EQ(p.chunks, (chunks{{1, 8, 1, true}, {0, 4, 1, true}}));
  complete(p, {4, 5});
}

TEST_F(SchedulerTest, APrefillOnlySequenceComputesItsTokensAndSamplesNothing) {
  make(16, 4, 4, 8);
  sched_->add_prefill_only(0, token_range(6, 10), 0);
  add(1, token_range(3, 40), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, false}}));
  complete(p, {});
  p = schedule();  // its last 2 tokens, no sample; 1 takes the rest of the budget
  EXPECT_EQ(p.chunks, (chunks{{0, 4, 2, false}, {1, 0, 2, false}}));
  EXPECT_EQ(table(0), (ids{0, 1}));
  complete(p, {});
  EXPECT_EQ(sched_->get(0).tokens, token_range(6, 10));  // no placeholder, no sample
  p = schedule();  // 0 is done and never planned again
  EXPECT_EQ(p.chunks, (chunks{{1, 2, 1, true}}));
  complete(p, {77});
  sched_->remove(0);
  sched_->check_invariants();
  EXPECT_TRUE(blocks_->is_cached(0));  // its full block stays in the prefix cache
}

TEST_F(SchedulerTest, ImportedKvSharesTheCachedPrefixAndIsListedInThePlan) {
  make(16, 4, 16, 8);
  add(0, token_range(9, 10), 0);  // caches blocks 0 and 1 for tokens 10..17
  complete(schedule(), {90});
  sched_->add_imported(1, token_range(9, 10), 0, 20, 8);  // same prompt, KV of 8 tokens imported
  sched_->add_imported(2, token_range(9, 40), 0, 20, 8);  // another prompt: nothing cached
  sched_->check_invariants();
  EXPECT_EQ(sched_->get(1).num_computed_tokens, 0);
  step_plan p = schedule();  // 0 decodes; 1 and 2 compute their last token
  EXPECT_EQ(p.chunks, (chunks{{0, 9, 1, true}, {1, 8, 1, true}, {2, 8, 1, true}}));
  EXPECT_EQ(p.imported, (seqs{1, 2}));
  EXPECT_EQ(table(1), (ids{0, 1, 3}));  // the cached blocks shared; the imported KV goes past them
  EXPECT_EQ(sched_->get(1).num_cached_tokens, 8);
  EXPECT_EQ(sched_->get(1).num_shared_import_tokens, 8);
  EXPECT_EQ(table(2), (ids{4, 5, 6}));  // fresh blocks for all of it
  EXPECT_EQ(sched_->get(2).num_cached_tokens, 0);
  EXPECT_EQ(sched_->get(2).num_shared_import_tokens, 0);
  EXPECT_EQ(sched_->get(1).num_imported_tokens, 0);
  complete(p, {91, 92, 93});
  sched_->check_invariants();
  p = schedule();
  EXPECT_TRUE(p.imported.empty());
  EXPECT_EQ(p.chunks, (chunks{{0, 10, 1, true}, {1, 9, 1, true}, {2, 9, 1, true}}));
}

TEST_F(SchedulerTest, DecodesComeBeforePrefillsAndNewAdmissions) {
  make(32, 4, 6, 8);
  add(0, token_range(4, 10), 0);
  add(1, token_range(5, 20), 0);

  step_plan p = schedule();  // 0 takes 4 of the 6 tokens; 1 gets the remaining 2
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, true}, {1, 0, 2, false}}));
  EXPECT_EQ(sched_->num_running(), 2);
  complete(p, {70});

  add(2, token_range(3, 30), 0);
  p = schedule();  // 0's decode first, then 1's prefill continues, then 2 is admitted
  EXPECT_EQ(p.chunks, (chunks{{0, 4, 1, true}, {1, 2, 3, true}, {2, 0, 2, false}}));
  EXPECT_EQ(p.num_batched_tokens, 6);
  complete(p, {71, 80});

  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 5, 1, true}, {1, 5, 1, true}, {2, 2, 1, true}}));
  EXPECT_EQ(p.num_batched_tokens, 3);
  complete(p, {72, 81, 90});
  EXPECT_EQ(sched_->get(0).tokens, concat(token_range(4, 10), {70, 71, 72}));
  EXPECT_EQ(sched_->get(1).tokens, concat(token_range(5, 20), {80, 81}));
  EXPECT_EQ(sched_->get(2).tokens, concat(token_range(3, 30), {90}));
  EXPECT_EQ(table(0), (ids{0, 2}));
  EXPECT_EQ(table(1), (ids{1, 3}));
  EXPECT_EQ(table(2), (ids{4}));
}

TEST_F(SchedulerTest, MaxNumSeqsLimitsTheRunningSet) {
  make(32, 4, 64, 2);
  for (seq_id s = 0; s < 3; ++s) add(s, token_range(3, 10 * static_cast<int32_t>(s)), 0);

  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 3, true}, {1, 0, 3, true}}));
  EXPECT_EQ(sched_->num_running(), 2);
  EXPECT_EQ(sched_->num_waiting(), 1);
  complete(p, {100, 101});

  p = schedule();  // plenty of budget and memory, but no room in the running set
  EXPECT_EQ(p.chunks, (chunks{{0, 3, 1, true}, {1, 3, 1, true}}));
  complete(p, {102, 103});

  sched_->remove(0);
  sched_->check_invariants();
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 4, 1, true}, {2, 0, 3, true}}));
  complete(p, {104, 105});
  EXPECT_EQ(sched_->num_running(), 2);

  // A fork into a full running set waits, though a block is free.
  sched_->fork(1, 7, 106);
  sched_->check_invariants();
  EXPECT_EQ(sched_->get(7).status, seq_status::waiting);
  EXPECT_EQ(sched_->get(7).num_computed_tokens, 0);
  EXPECT_FALSE(blocks_->contains(7));
  EXPECT_EQ(sched_->num_running(), 2);
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 5, 1, true}, {2, 3, 1, true}}));
  EXPECT_TRUE(p.copies.empty());
}

TEST_F(SchedulerTest, PrioritiesOrderAdmissionAndTheRunningSet) {
  make(32, 4, 4, 8);
  add(0, token_range(4, 10), 5);
  add(1, token_range(4, 20), 0);  // arrives later, served first

  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 0, 4, true}}));
  complete(p, {60});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 4, 1, true}, {0, 0, 3, false}}));
  complete(p, {61});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 5, 1, true}, {0, 3, 1, true}}));
  complete(p, {62, 50});

  add(2, token_range(2, 30), 0);  // admitted behind the running ones...
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 6, 1, true}, {0, 4, 1, true}, {2, 0, 2, true}}));
  complete(p, {63, 51, 70});
  p = schedule();  // ...but then runs ahead of the lower-priority 0
  EXPECT_EQ(p.chunks, (chunks{{1, 7, 1, true}, {2, 2, 1, true}, {0, 5, 1, true}}));
}

TEST_F(SchedulerTest, FcfsIgnoresPriorities) {
  scheduler_config c{4, 8};
  c.policy.name = "fcfs";
  make(32, 4, c);
  add(0, token_range(4, 10), 5);
  add(1, token_range(4, 20), 0);  // a higher priority, but it arrives later
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, true}}));
  complete(p, {60});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 4, 1, true}, {1, 0, 3, false}}));
}

class SjfTest : public SchedulerTest {
 public:
  /// The order an sjf scheduler with `aging` admits four 4-token prompts whose limits are 24,
  /// 13, 9 and 7 tokens (arrivals 0..3), one at a time (max_num_seqs = 1: each runs alone
  /// until it is removed).
  std::vector<seq_id> admission_order(int32_t aging) {
    scheduler_config c{64, 1};
    c.policy.name = "sjf";
    c.policy.sjf_aging_tokens = aging;
    make(32, 4, c);
    const int32_t limits[] = {24, 13, 9, 7};
    for (seq_id id = 0; id < 4; id++) {
      sched_->add(id, token_range(4, 10 * (static_cast<int32_t>(id) + 1)), /*priority=*/0, limits[id]);
      sched_->check_invariants();
    }
    std::vector<seq_id> order;
    for (int i = 0; i < 4; i++) {
      const step_plan p = schedule();
      EXPECT_EQ(p.chunks.size(), 1u);
      if (p.chunks.empty()) break;
      EXPECT_EQ(p.chunks[0].first_position, 0);  // a new admission
      order.push_back(p.chunks[0].seq);
      complete(p, {1});
      sched_->remove(p.chunks[0].seq);
      sched_->check_invariants();
    }
    return order;
  }
};

TEST_F(SjfTest, ServesTheShortestPredictedWorkFirstAgedByArrival) {
  // rank = limit + arrival * aging.
  // aging 1: 24, 14, 11, 10 -> the shortest first, the reverse of arrival.
  EXPECT_EQ(admission_order(1), (seqs{3, 2, 1, 0}));
  // aging 3: 24, 16, 15, 16 -> 2, then 1 and 3 tie at 16 and go by arrival; 0 last.
  EXPECT_EQ(admission_order(3), (seqs{2, 1, 3, 0}));
  // aging 256 (the default): 24, 269, 521, 775 -> arrival order; a sequence of work w is
  // overtaken by at most w / aging later arrivals.
  EXPECT_EQ(admission_order(256), (seqs{0, 1, 2, 3}));
}

TEST(SchedulingPolicy, RegistryNamesAndErrors) {
  EXPECT_EQ(policy_names(), (std::vector<std::string>{"priority", "fcfs", "sjf"}));
  auto unknown = make_policy({"shortest", 1});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().message, "unknown scheduler 'shortest'; known: priority, fcfs, sjf");
  for (const int32_t aging : {0, -1, (1 << 20) + 1}) {
    auto bad = make_policy({"sjf", aging});
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().message, "sjf_aging_tokens must be in [1, 1048576], got " + std::to_string(aging));
  }
  auto priority = make_policy({});
  ASSERT_TRUE(priority);
  EXPECT_EQ((*priority)->rank({7, 3, 10, 20}), 7);
  auto sjf = make_policy({"sjf", 5});
  ASSERT_TRUE(sjf);
  EXPECT_EQ((*sjf)->rank({7, 3, 10, 20}), 20 + 3 * 5);
}

TEST_F(SchedulerTest, PreemptsTheLowestPriorityAndAdmitsNobodyThatStep) {
  make(6, 4, 64, 8);
  add(10, token_range(4, 10), 1);  // arrives first, lowest priority
  add(11, token_range(4, 20), 0);
  add(12, token_range(8, 30), 0);

  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{11, 0, 4, true}, {12, 0, 8, true}, {10, 0, 4, true}}));
  EXPECT_EQ(table(11), (ids{0}));
  EXPECT_EQ(table(12), (ids{1, 2}));
  EXPECT_EQ(table(10), (ids{3}));
  complete(p, {1, 2, 3});

  add(13, token_range(3, 40), 0);  // would fit in the block 10 gives back
  p = schedule();  // 11 and 12 take the last 2 blocks; 10 (the back) must give way
  EXPECT_EQ(p.chunks, (chunks{{11, 4, 1, true}, {12, 8, 1, true}}));
  EXPECT_EQ(p.preempted, (seqs{10}));
  EXPECT_EQ(table(11), (ids{0, 4}));
  EXPECT_EQ(table(12), (ids{1, 2, 5}));
  EXPECT_FALSE(blocks_->contains(10));
  EXPECT_FALSE(blocks_->contains(13));  // a step that preempts admits nobody
  EXPECT_EQ(sched_->num_waiting(), 2);
  EXPECT_EQ(sched_->num_preemptions(), 1);
  const sequence& v = sched_->get(10);
  EXPECT_EQ(v.status, seq_status::waiting);
  EXPECT_EQ(v.num_computed_tokens, 0);
  EXPECT_EQ(v.num_preemptions, 1);
  EXPECT_EQ(v.tokens, concat(token_range(4, 10), {3}));  // keeps its sampled token
  complete(p, {4, 5});

  // Requeued by (priority, arrival): 13 (priority 0) is admitted before 10 (priority 1).
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{11, 5, 1, true}, {12, 9, 1, true}, {13, 0, 3, true}}));
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(table(13), (ids{3}));
  EXPECT_EQ(sched_->get(10).status, seq_status::waiting);
  complete(p, {6, 7, 8});

  sched_->remove(11);  // frees 4, 0 (tail first)
  sched_->check_invariants();
  EXPECT_EQ(blocks_->free_queue(), (ids{4, 0}));
  p = schedule();  // 10 recomputes its prompt and its sampled token, then samples again
  EXPECT_EQ(p.chunks, (chunks{{12, 10, 1, true}, {13, 3, 1, true}, {10, 0, 5, true}}));
  EXPECT_EQ(table(10), (ids{4, 0}));
  complete(p, {9, 10, 11});
  EXPECT_EQ(sched_->get(10).tokens, concat(token_range(4, 10), {3, 11}));
}

TEST_F(SchedulerTest, PreemptsTheLatestArrivalAmongEqualPriorities) {
  make(4, 4, 64, 8);
  add(0, token_range(4, 10), 0);
  add(1, token_range(4, 20), 0);
  add(2, token_range(4, 30), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 4, true}, {1, 0, 4, true}, {2, 0, 4, true}}));
  complete(p, {1, 2, 3});

  add(3, token_range(1, 40), 0);
  p = schedule();  // 0 takes block 3; 1 needs one more: 2 (latest arrival) is preempted
  EXPECT_EQ(p.chunks, (chunks{{0, 4, 1, true}, {1, 4, 1, true}}));
  EXPECT_EQ(p.preempted, (seqs{2}));
  EXPECT_EQ(table(0), (ids{0, 3}));
  EXPECT_EQ(table(1), (ids{1, 2}));
  EXPECT_FALSE(blocks_->is_cached(2));  // 2's committed block was reallocated: evicted
  EXPECT_EQ(blocks_->num_evictions(), 1);
  complete(p, {4, 5});

  // 2 is requeued ahead of 3 (earlier arrival). It does not fit, and 3 may not overtake it.
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 5, 1, true}, {1, 5, 1, true}}));
  EXPECT_EQ(sched_->num_waiting(), 2);
  complete(p, {6, 7});

  sched_->remove(0);  // frees 3, 0
  sched_->check_invariants();
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{1, 6, 1, true}, {2, 0, 5, true}}));
  EXPECT_EQ(table(2), (ids{3, 0}));
  EXPECT_EQ(sched_->num_waiting(), 1);  // 3 still waits: the pool is full again
  EXPECT_EQ(sched_->get(2).num_recomputed_tokens, 4);  // its 4 prompt tokens, a second time
  EXPECT_EQ(sched_->num_recomputed_tokens(), 4);
  complete(p, {8, 9});
  EXPECT_EQ(sched_->get(2).tokens, concat(token_range(4, 30), {3, 9}));
}

TEST_F(SchedulerTest, TheBackOfTheRunningOrderPreemptsItself) {
  make(4, 4, 64, 8);
  add(0, token_range(8, 10), 0);
  add(1, token_range(4, 20), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 8, true}, {1, 0, 4, true}}));
  EXPECT_EQ(table(0), (ids{0, 1}));
  EXPECT_EQ(table(1), (ids{2}));
  complete(p, {1, 2});
  p = schedule();  // 0 takes block 3, 1 needs a block: 1 preempts itself
  EXPECT_EQ(p.chunks, (chunks{{0, 8, 1, true}}));
  EXPECT_EQ(p.preempted, (seqs{1}));
  complete(p, {3});
  EXPECT_EQ(blocks_->free_queue(), (ids{2}));
  // 1 (5 tokens) would reuse its cached block 2 but needs one more block: none is free.
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 9, 1, true}}));
  EXPECT_EQ(sched_->num_waiting(), 1);
  complete(p, {4});
  sched_->remove(0);
  sched_->check_invariants();
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
  p = schedule();  // now it reuses its own cached block 2 and computes 1 token
  EXPECT_EQ(p.chunks, (chunks{{1, 4, 1, true}}));
  EXPECT_EQ(table(1), (ids{2, 3}));
  // Its own block, found again: not a prefix hit (its first admission found none), and it
  // spares the recomputation of the 4 tokens the preemption dropped.
  EXPECT_EQ(sched_->get(1).num_cached_tokens, 0);
  EXPECT_EQ(sched_->num_prefix_hit_tokens(), 0);
  EXPECT_EQ(sched_->get(1).num_recomputed_tokens, 0);
}

TEST_F(SchedulerTest, PrefixHitOnAdmissionSharesBlocks) {
  make(16, 4, 64, 8);
  const std::vector<int32_t> prompt = token_range(10, 10);
  add(0, prompt, 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 10, true}}));
  EXPECT_EQ(table(0), (ids{0, 1, 2}));
  complete(p, {99});
  EXPECT_TRUE(blocks_->is_cached(0));
  EXPECT_TRUE(blocks_->is_cached(1));

  // Shares 2 full blocks with 0 while 0 still runs.
  add(1, concat(token_range(8, 10), {60, 61, 62}), 0);
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 10, 1, true}, {1, 8, 3, true}}));
  EXPECT_EQ(sched_->get(1).num_cached_tokens, 8);
  EXPECT_EQ(sched_->get(1).num_computed_tokens, 11);  // 8 cached + 3 scheduled
  EXPECT_EQ(sched_->num_prefix_hit_tokens(), 8);
  EXPECT_EQ(table(1), (ids{0, 1, 3}));
  EXPECT_EQ(blocks_->refcount(0), 2);
  EXPECT_EQ(blocks_->refcount(1), 2);
  complete(p, {98, 97});

  // A prompt of exactly 2 cached blocks hits only 1: the last token must be computed.
  add(2, token_range(8, 10), 0);
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 11, 1, true}, {1, 11, 1, true}, {2, 4, 4, true}}));
  EXPECT_EQ(table(2), (ids{0, 4}));
  EXPECT_EQ(blocks_->refcount(0), 3);
  EXPECT_EQ(sched_->num_prefix_hit_tokens(), 12);
  complete(p, {96, 95, 94});

  // After everyone is gone the cached blocks are free but still hit.
  sched_->remove(0);
  sched_->remove(1);
  sched_->remove(2);
  sched_->check_invariants();
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
  EXPECT_FALSE(sched_->has_work());
  add(3, prompt, 0);
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{3, 8, 2, true}}));
  EXPECT_EQ(table(3), (ids{0, 1, 5}));
  EXPECT_EQ(sched_->num_prefix_hit_tokens(), 20);
}

TEST_F(SchedulerTest, TheHitRulesSlackKeepsTrailingTokensOutOfThePrefixCache) {
  scheduler_config c{64, 8};
  c.prefix_cache_slack_tokens = 4;
  make(16, 4, c);
  add(0, token_range(10, 10), 0);
  step_plan p = schedule();
  complete(p, {99});  // blocks 0 and 1 cached
  // 11 tokens whose first 8 are cached: the pool hits 2 blocks, the rule allows at most
  // 11 - 4 = 7 tokens, so 1 block.
  add(1, concat(token_range(8, 10), {60, 61, 62}), 0);
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 10, 1, true}, {1, 4, 7, true}}));
  EXPECT_EQ(sched_->get(1).num_cached_tokens, 4);
  EXPECT_EQ(sched_->num_prefix_hit_tokens(), 4);
  EXPECT_EQ(table(1), (ids{0, 3, 4}));
  EXPECT_EQ(blocks_->refcount(0), 2);
  EXPECT_EQ(blocks_->refcount(1), 1);
  // 12 tokens: 12 - 4 = 8, so both blocks.
  add(2, concat(token_range(8, 10), {70, 71, 72, 73}), 0);
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 11, 1, true}, {1, 11, 1, true}, {2, 8, 4, true}}));
  EXPECT_EQ(sched_->get(2).num_cached_tokens, 8);
  EXPECT_EQ(table(2), (ids{0, 1, 5}));
}

TEST_F(SchedulerTest, ForkRunsWithACopyInTheNextPlan) {
  make(8, 4, 64, 8);
  add(0, token_range(6, 10), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 6, true}}));
  EXPECT_EQ(table(0), (ids{0, 1}));
  complete(p, {50});

  sched_->fork(0, 1, 51);
  sched_->check_invariants();
  const sequence& child = sched_->get(1);
  EXPECT_EQ(child.status, seq_status::running);
  EXPECT_EQ(child.tokens, concat(token_range(6, 10), {51}));
  EXPECT_EQ(child.num_computed_tokens, 6);
  EXPECT_EQ(table(1), (ids{0, 2}));  // full block shared, partial block copied
  EXPECT_EQ(blocks_->refcount(0), 2);
  EXPECT_EQ(blocks_->refcount(1), 1);

  p = schedule();
  EXPECT_EQ(p.copies, (std::vector<kv::block_copy>{{1, 2}}));
  EXPECT_EQ(p.chunks, (chunks{{0, 6, 1, true}, {1, 6, 1, true}}));
  complete(p, {52, 53});
  p = schedule();
  EXPECT_TRUE(p.copies.empty());  // emitted once
  EXPECT_EQ(p.chunks, (chunks{{0, 7, 1, true}, {1, 7, 1, true}}));
  complete(p, {54, 55});
  p = schedule();  // position 8: each grows its own block
  EXPECT_EQ(p.chunks, (chunks{{0, 8, 1, true}, {1, 8, 1, true}}));
  EXPECT_EQ(table(0), (ids{0, 1, 3}));
  EXPECT_EQ(table(1), (ids{0, 2, 4}));
}

TEST_F(SchedulerTest, RemovingAForkedChildDropsItsPendingCopy) {
  make(8, 4, 64, 8);
  add(0, token_range(6, 10), 0);
  complete(schedule(), {50});
  sched_->fork(0, 1, 51);
  sched_->fork(0, 2, 52);
  EXPECT_EQ(table(1), (ids{0, 2}));
  EXPECT_EQ(table(2), (ids{0, 3}));
  sched_->remove(1);  // e.g. it ended at its first token
  sched_->check_invariants();
  step_plan p = schedule();
  EXPECT_EQ(p.copies, (std::vector<kv::block_copy>{{1, 3}}));
  EXPECT_EQ(p.chunks, (chunks{{0, 6, 1, true}, {2, 6, 1, true}}));
  complete(p, {53, 54});

  // The parent's removal keeps its child's copy: the source is copied before anything else
  // can write to it.
  sched_->fork(0, 3, 55);
  EXPECT_EQ(table(3), (ids{0, 4}));  // 2 went to the back of the free queue with 1
  sched_->remove(0);
  sched_->remove(2);
  sched_->check_invariants();
  p = schedule();
  EXPECT_EQ(p.copies, (std::vector<kv::block_copy>{{1, 4}}));
  EXPECT_EQ(p.chunks, (chunks{{3, 7, 1, true}}));

  // Nothing but a stale copy never makes a plan.
  complete(p, {56});
  p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{3, 8, 1, true}}));
  complete(p, {57});
  sched_->fork(3, 4, 58);  // 9 computed tokens: a partial block to copy
  EXPECT_EQ(table(4).size(), 3u);
  sched_->remove(3);
  sched_->remove(4);
  sched_->check_invariants();
  EXPECT_TRUE(schedule().empty());
}

TEST_F(SchedulerTest, ForkAtABlockBoundaryCopiesNothing) {
  make(3, 4, 64, 8);
  add(0, token_range(8, 10), 0);
  add(2, token_range(4, 30), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 8, true}, {2, 0, 4, true}}));
  complete(p, {50, 60});
  EXPECT_EQ(blocks_->num_free_blocks(), 0);

  sched_->fork(0, 1, 51);  // no block needed: runs though the pool is full
  sched_->check_invariants();
  EXPECT_EQ(sched_->get(1).status, seq_status::running);
  EXPECT_EQ(table(1), (ids{0, 1}));
  EXPECT_EQ(blocks_->refcount(0), 2);
  EXPECT_EQ(blocks_->refcount(1), 2);

  // Running order 0, 1 (same arrival as its parent), 2. 0 needs a block: 2 is preempted and
  // 0 takes its block; the child then needs one too and, being the back, preempts itself.
  p = schedule();
  EXPECT_TRUE(p.copies.empty());
  EXPECT_EQ(p.chunks, (chunks{{0, 8, 1, true}}));
  EXPECT_EQ(p.preempted, (seqs{2, 1}));
  EXPECT_EQ(table(0), (ids{0, 1, 2}));
  EXPECT_EQ(blocks_->refcount(0), 1);
  EXPECT_EQ(sched_->get(1).tokens, concat(token_range(8, 10), {51}));
  EXPECT_EQ(sched_->num_preemptions(), 2);
}

TEST_F(SchedulerTest, ForkWaitsWhenNoBlockIsFree) {
  make(2, 4, 64, 8);
  add(0, token_range(6, 10), 0);
  step_plan p = schedule();
  complete(p, {50});
  EXPECT_EQ(table(0), (ids{0, 1}));

  sched_->fork(0, 1, 51);
  sched_->check_invariants();
  EXPECT_EQ(sched_->get(1).status, seq_status::waiting);
  EXPECT_EQ(sched_->get(1).num_computed_tokens, 0);
  EXPECT_EQ(sched_->get(1).tokens, concat(token_range(6, 10), {51}));
  EXPECT_EQ(sched_->num_waiting(), 1);
  EXPECT_FALSE(blocks_->contains(1));

  p = schedule();  // the child needs 2 blocks (1 hit + 1 fresh): none free
  EXPECT_TRUE(p.copies.empty());
  EXPECT_EQ(p.chunks, (chunks{{0, 6, 1, true}}));
  complete(p, {52});
  sched_->remove(0);
  sched_->check_invariants();
  p = schedule();  // readmitted with the parent's cached first block
  EXPECT_EQ(p.chunks, (chunks{{1, 4, 3, true}}));
  EXPECT_EQ(table(1), (ids{0, 1}));
  EXPECT_EQ(sched_->get(1).num_cached_tokens, 0);  // the prompt is counted once, by the parent
}

TEST_F(SchedulerTest, PlansAheadWithPlaceholdersUpToTheLengthLimit) {
  make(8, 4, 64, 8);
  const int32_t x = previous_sample;
  sched_->add(0, token_range(3, 10), 0, 6);  // 3 prompt tokens + 3 samples at most
  sched_->check_invariants();

  const step_plan p1 = schedule();
  EXPECT_EQ(p1.chunks, (chunks{{0, 0, 3, true}}));
  EXPECT_EQ(sched_->get(0).tokens, concat(token_range(3, 10), {x}));
  EXPECT_EQ(sched_->get(0).num_computed_tokens, 3);
  const step_plan p2 = schedule();  // before p1 completed: decodes p1's sample
  EXPECT_EQ(p2.chunks, (chunks{{0, 3, 1, true}}));
  EXPECT_EQ(table(0), (ids{0}));
  complete(p1, {50});
  EXPECT_EQ(sched_->get(0).tokens, concat(token_range(3, 10), {50, x}));
  const step_plan p3 = schedule();
  EXPECT_EQ(p3.chunks, (chunks{{0, 4, 1, true}}));
  EXPECT_EQ(table(0), (ids{0, 1}));
  complete(p2, {51});
  EXPECT_TRUE(schedule().empty());  // 6 tokens: the limit; only p3's sample is pending
  complete(p3, {52});
  EXPECT_EQ(sched_->get(0).tokens, concat(token_range(3, 10), {50, 51, 52}));
  EXPECT_TRUE(schedule().empty());
  EXPECT_TRUE(blocks_->is_cached(0));
  EXPECT_FALSE(blocks_->is_cached(1));  // 5 computed tokens: block 1 is not full
}

TEST_F(SchedulerTest, HeldSequencesAreSkippedAndRemovedOnesIgnoredOnCompletion) {
  make(8, 4, 64, 8);
  add(0, token_range(3, 10), 0);
  add(1, token_range(2, 20), 0);
  const step_plan p1 = schedule();
  EXPECT_EQ(p1.chunks, (chunks{{0, 0, 3, true}, {1, 0, 2, true}}));
  sched_->set_hold(0, true);
  const step_plan p2 = schedule();
  EXPECT_EQ(p2.chunks, (chunks{{1, 2, 1, true}}));
  sched_->remove(1);  // ended while p1 and p2 are in flight
  sched_->check_invariants();
  complete(p1, {50, 60});
  complete(p2, {61});
  EXPECT_EQ(sched_->get(0).tokens, concat(token_range(3, 10), {50}));
  EXPECT_TRUE(schedule().empty());
  sched_->set_hold(0, false);
  const step_plan p3 = schedule();
  EXPECT_EQ(p3.chunks, (chunks{{0, 3, 1, true}}));
}

TEST_F(SchedulerTest, RemoveFreesBlocksOfRunningAndWaitingSequences) {
  make(8, 4, 6, 1);
  add(0, token_range(10, 10), 0);
  add(1, token_range(3, 30), 0);
  step_plan p = schedule();
  EXPECT_EQ(p.chunks, (chunks{{0, 0, 6, false}}));
  complete(p, {});
  EXPECT_EQ(blocks_->num_used_blocks(), 2);

  sched_->remove(0);  // mid-prefill
  sched_->check_invariants();
  EXPECT_FALSE(sched_->contains(0));
  EXPECT_FALSE(blocks_->contains(0));
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
  EXPECT_EQ(blocks_->free_queue(), (ids{2, 3, 4, 5, 6, 7, 1, 0}));

  sched_->remove(1);  // waiting, holds nothing
  sched_->check_invariants();
  EXPECT_FALSE(sched_->has_work());
  EXPECT_EQ(sched_->num_waiting(), 0);
  EXPECT_EQ(sched_->num_running(), 0);
  EXPECT_TRUE(schedule().empty());
}

}  // namespace
}  // namespace troupe::sched
