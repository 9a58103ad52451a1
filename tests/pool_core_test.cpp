// The KV pool side of an engine (runtime/engine/pool_core.hpp) driven by the sequence of plain
// messages a block-manager actor will take: a new sequence, a plan, a step's tokens, a fork, an
// ending, an export, and a new sequence that reuses the prefix the ended ones left cached.
// Block ids are exact: the free queue starts 0, 1, ..., 7 and freed blocks join its back.

#include <gtest/gtest.h>

#include "runtime/engine/pool_core.hpp"

namespace troupe::engine {
namespace {

constexpr int32_t block_size = 4;

std::unique_ptr<pool_core> make_pool(engine_counters& counters) {
  engine_config config;
  config.block_size = block_size;
  config.num_kv_blocks = 8;
  config.max_steps_in_flight = 1;
  config.scheduler.max_num_batched_tokens = 64;
  config.scheduler.max_num_seqs = 4;
  auto blocks = kv::block_manager::create({config.num_kv_blocks, config.block_size});
  EXPECT_TRUE(blocks.has_value());
  return std::make_unique<pool_core>(model::model_config{}, config,
                                     std::make_unique<kv::block_manager>(std::move(*blocks)), counters);
}

/// A step's completion: one token per sampling chunk, no drafts.
step_done sampled(std::vector<int32_t> tokens) {
  step_done done;
  done.accepted.resize(tokens.size());
  done.sampled = std::move(tokens);
  return done;
}

TEST(PoolCore, AllocateForkFreeAndForwardAsAMessageSequence) {
  engine_counters counters;
  auto pool = make_pool(counters);
  const kv::block_manager& blocks = pool->blocks();

  // Allocate: request 1 (n = 2) arrives as sequence 0 with a 6-token prompt.
  pool->add(0, pool_sequence{1, 2}, {10, 11, 12, 13, 14, 15}, 0, 10, 0);
  std::optional<exec_plan> step0 = pool->plan(1);
  ASSERT_TRUE(step0.has_value());
  EXPECT_EQ(step0->step, 0);
  ASSERT_EQ(step0->chunks.size(), 1u);
  const exec_chunk& prompt = step0->chunks[0];
  EXPECT_EQ(prompt.seq, 0);
  EXPECT_EQ(prompt.first_position, 0);
  EXPECT_EQ(prompt.tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(prompt.first_block, 0);
  EXPECT_EQ(prompt.block_table, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(prompt.num_samples, 2);  // the row forks
  EXPECT_FALSE(pool->plan(1).has_value());  // one plan in flight at most
  pool->check_invariants(true);

  // The step's token; the sample side forks: the child shares block 0 and copies the partial
  // block 1 into block 2.
  pool->complete(sampled({20}));
  pool->end_hold(0, 0);
  pool->fork(0, 1, 21);
  EXPECT_EQ(blocks.block_table(0), (std::vector<kv::block_id>{0, 1}));
  EXPECT_EQ(blocks.block_table(1), (std::vector<kv::block_id>{0, 2}));
  EXPECT_EQ(blocks.refcount(0), 2);
  pool->check_invariants(true);

  std::optional<exec_plan> step1 = pool->plan(1);
  ASSERT_TRUE(step1.has_value());
  ASSERT_EQ(step1->copies.size(), 1u);
  EXPECT_EQ(step1->copies[0].src, 1);
  EXPECT_EQ(step1->copies[0].dst, 2);
  ASSERT_EQ(step1->chunks.size(), 2u);
  EXPECT_EQ(step1->chunks[0].seq, 0);
  EXPECT_EQ(step1->chunks[0].tokens, (std::vector<int32_t>{20}));
  EXPECT_EQ(step1->chunks[0].first_block, 2);  // the executor holds its table
  EXPECT_TRUE(step1->chunks[0].block_table.empty());
  EXPECT_EQ(step1->chunks[1].seq, 1);
  EXPECT_EQ(step1->chunks[1].tokens, (std::vector<int32_t>{21}));
  EXPECT_EQ(step1->chunks[1].first_block, 0);  // new to the executor: its whole table
  EXPECT_EQ(step1->chunks[1].block_table, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(step1->chunks[1].num_samples, 1);
  pool->complete(sampled({30, 31}));

  // Free: the child ends; its own block goes back, the shared one keeps the parent's reference.
  pool->remove(1);
  EXPECT_EQ(blocks.refcount(0), 1);
  EXPECT_EQ(blocks.refcount(2), 0);
  EXPECT_EQ(blocks.num_free_blocks(), 6);
  pool->check_invariants(true);

  // Forward: the parent leaves with the KV of its 7 computed positions, read out by the next
  // plan before anything writes its blocks; the plan also tells the executor both are gone.
  ASSERT_TRUE(pool->export_sequence(0, 1).has_value());
  pool->remove(0);
  std::optional<exec_plan> step2 = pool->plan(1);
  ASSERT_TRUE(step2.has_value());
  EXPECT_TRUE(step2->chunks.empty());
  ASSERT_EQ(step2->readouts.size(), 1u);
  EXPECT_EQ(step2->readouts[0].block_table, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(step2->readouts[0].num_tokens, 7);
  EXPECT_EQ(step2->released, (std::vector<kv::seq_id>{1, 0}));
  step_done read = sampled({});
  read.read_out.push_back(kv_data{0, 0, 7, {}, {}});
  pool->complete(std::move(read));
  const std::vector<exported_request> exported = pool->take_exported();
  ASSERT_EQ(exported.size(), 1u);
  EXPECT_EQ(exported[0].id, 1);
  EXPECT_EQ(exported[0].kv.num_tokens, 7);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
  pool->check_invariants(true);

  // Allocate again: request 2's prompt starts with the cached block 0, which it shares; its
  // fresh block is the free queue's front (3: blocks 2, 1, 0 went to its back in that order).
  pool->add(2, pool_sequence{2}, {10, 11, 12, 13, 14, 15, 16}, 0, 12, 0);
  std::optional<exec_plan> step3 = pool->plan(1);
  ASSERT_TRUE(step3.has_value());
  ASSERT_EQ(step3->chunks.size(), 1u);
  EXPECT_EQ(step3->chunks[0].first_position, 4);
  EXPECT_EQ(step3->chunks[0].tokens, (std::vector<int32_t>{14, 15, 16}));
  EXPECT_EQ(step3->chunks[0].block_table, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(pool->sequence(2).num_cached_tokens, 4);
  EXPECT_EQ(counters.num_steps, 4);
  pool->check_invariants(true);
}

TEST(PoolCore, AnExportOfAPrefillOnlyRunOrOfASequenceWithNoKvIsRefused) {
  engine_counters counters;
  auto pool = make_pool(counters);
  pool->add_prefill_only(0, pool_sequence{1}, {10, 11, 12}, 0);
  pool->add(1, pool_sequence{2}, {10, 11}, 0, 4, 0);
  const auto prefill = pool->export_sequence(0, 1);
  ASSERT_FALSE(prefill.has_value());
  EXPECT_EQ(prefill.error().message, "request 1 is a prefill-only run");
  const auto waiting = pool->export_sequence(1, 2);
  ASSERT_FALSE(waiting.has_value());
  EXPECT_EQ(waiting.error().message, "request 2 has no KV computed yet");
  pool->check_invariants(true);
}

}  // namespace
}  // namespace troupe::engine
