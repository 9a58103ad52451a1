// Model-based fuzz test: kv::block_manager against a naive reference that recomputes refcounts
// from tables, keeps the free queue as a plain vector and finds prefixes by brute force over the
// full token prefixes of cached blocks (no hashing). Random operations over a tiny alphabet make
// shared prefixes, duplicate commits and evictions common. A failure names its seed; rerun one
// seed with TROUPE_FUZZ_SEED=<seed>.
#include "runtime/kv/block_manager.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace troupe::kv {
namespace {

using tokens_t = std::vector<int32_t>;

/// The reference: the same contract, written the obvious way.
class model {
 public:
  model(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), bs_(block_size) {
    for (block_id b = 0; b < num_blocks; ++b) free_queue_.push_back(b);
  }

  struct seq_state {
    std::vector<block_id> table;
    int32_t num_tokens = 0;
    size_t num_registered = 0;
  };

  int32_t num_blocks_for(int32_t n) const { return (n + bs_ - 1) / bs_; }

  int32_t refcount(block_id b) const {
    int32_t n = 0;
    for (const auto& [id, s] : seqs_)
      n += static_cast<int32_t>(std::count(s.table.begin(), s.table.end(), b));
    return n;
  }

  bool is_free(block_id b) const {
    return std::find(free_queue_.begin(), free_queue_.end(), b) != free_queue_.end();
  }

  /// The cached block whose full prefix equals tokens[0, n), or -1.
  block_id find_cached(const tokens_t& tokens, size_t n) const {
    for (const auto& [b, prefix] : cached_)
      if (prefix.size() == n && std::equal(prefix.begin(), prefix.end(), tokens.begin())) return b;
    return -1;
  }

  prefix_hit find_prefix(const tokens_t& tokens) const {
    prefix_hit hit;
    const size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / bs_;
    for (size_t i = 0; i < max_blocks; ++i) {
      const block_id b = find_cached(tokens, (i + 1) * bs_);
      if (b < 0) break;
      hit.blocks.push_back(b);
    }
    hit.num_tokens = static_cast<int32_t>(hit.blocks.size()) * bs_;
    return hit;
  }

  bool can_allocate(seq_id seq, int32_t total, const prefix_hit& hit) const {
    const auto it = seqs_.find(seq);
    const int32_t have = it != seqs_.end() ? static_cast<int32_t>(it->second.table.size())
                                           : static_cast<int32_t>(hit.blocks.size());
    int32_t available = static_cast<int32_t>(free_queue_.size());
    if (it == seqs_.end())
      for (const block_id b : hit.blocks) available -= is_free(b) ? 1 : 0;
    return num_blocks_for(total) - have <= available;
  }

  void allocate(seq_id seq, int32_t total, const prefix_hit& hit) {
    if (!seqs_.count(seq)) {
      seq_state s;
      for (const block_id b : hit.blocks) {
        free_queue_.erase(std::remove(free_queue_.begin(), free_queue_.end(), b),
                          free_queue_.end());
        s.table.push_back(b);
      }
      s.num_registered = hit.blocks.size();
      seqs_[seq] = s;
    }
    seq_state& s = seqs_[seq];
    while (static_cast<int32_t>(s.table.size()) < num_blocks_for(total)) s.table.push_back(pop());
    s.num_tokens = total;
  }

  void commit(seq_id seq, const tokens_t& tokens, int32_t num_computed) {
    seq_state& s = seqs_.at(seq);
    const size_t full = static_cast<size_t>(num_computed / bs_);
    for (size_t i = s.num_registered; i < full; ++i) {
      const block_id b = s.table[i];
      const size_t n = (i + 1) * bs_;
      if (cached_.count(b)) continue;
      if (find_cached(tokens, n) >= 0) {  // one block per prefix: this one stays unhashed
        ++num_duplicates_;
        continue;
      }
      cached_[b] = tokens_t(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
    }
    s.num_registered = std::max(s.num_registered, full);
  }

  bool can_fork(seq_id parent) const {
    return seqs_.at(parent).num_tokens % bs_ == 0 || !free_queue_.empty();
  }

  std::vector<block_copy> fork(seq_id parent, seq_id child) {
    const seq_state p = seqs_.at(parent);
    seq_state c;
    const int32_t full = p.num_tokens / bs_;
    c.table.assign(p.table.begin(), p.table.begin() + full);
    c.num_tokens = p.num_tokens;
    c.num_registered = p.num_registered;
    std::vector<block_copy> copies;
    if (p.num_tokens % bs_ != 0) {
      copies.push_back({p.table[static_cast<size_t>(full)], pop()});
      c.table.push_back(copies.back().dst);
    }
    seqs_[child] = c;
    return copies;
  }

  void free(seq_id seq) {
    const std::vector<block_id> table = seqs_.at(seq).table;
    seqs_.erase(seq);
    for (auto b = table.rbegin(); b != table.rend(); ++b)
      if (refcount(*b) == 0) free_queue_.push_back(*b);
  }

  block_id pop() {
    const block_id b = free_queue_.front();
    free_queue_.erase(free_queue_.begin());
    if (cached_.erase(b) != 0) ++num_evictions_;
    return b;
  }

  int32_t num_blocks_;
  int32_t bs_;
  std::vector<block_id> free_queue_;
  std::map<seq_id, seq_state> seqs_;
  std::map<block_id, tokens_t> cached_;  // block -> the full token prefix it ends
  int64_t num_evictions_ = 0;
  int64_t num_duplicates_ = 0;
};

/// How often the runs reached each rare path; a fuzzer that never reaches one proves nothing.
struct coverage {
  int64_t num_hits = 0;
  int64_t num_hits_on_free_blocks = 0;
  int64_t num_refused = 0;
  int64_t num_refused_only_because_of_hit = 0;
  int64_t num_fork_copies = 0;
  int64_t num_evictions = 0;
  int64_t num_duplicates = 0;
};

/// Harness-side state of one live sequence: the tokens known so far (>= its slots).
struct live_seq {
  tokens_t tokens;
};

// ---- seed reporting even when a TROUPE_ASSERT aborts ------------------------------------------

volatile uint64_t current_seed = 0;

void report_seed_on_abort(int) {
  char buf[64] = "\nblock_manager fuzz: aborted at seed ";
  size_t len = 37;
  char digits[24];
  size_t n = 0;
  uint64_t s = current_seed;
  do { digits[n++] = static_cast<char>('0' + s % 10); s /= 10; } while (s != 0);
  while (n > 0) buf[len++] = digits[--n];
  buf[len++] = '\n';
  (void)!::write(2, buf, len);
  std::signal(SIGABRT, SIG_DFL);
  std::raise(SIGABRT);
}

// ---- one run ------------------------------------------------------------------------------------

class fuzz_run {
 public:
  fuzz_run(uint64_t seed, coverage& cov) : rng_(seed), cov_(cov) {
    static constexpr int32_t block_sizes[] = {1, 2, 3, 4, 8};
    bs_ = block_sizes[pick(0, 4)];
    num_blocks_ = pick(1, 24);
    alphabet_ = pick(1, 3) == 1 ? 1 : pick(2, 4);
    bm_ = std::make_unique<block_manager>(std::move(*block_manager::create({num_blocks_, bs_})));
    model_ = std::make_unique<model>(num_blocks_, bs_);
  }

  void run(int num_ops) {
    for (int op = 0; op < num_ops && !::testing::Test::HasFailure(); ++op) {
      const int kind = pick(0, 99);
      if (kind < 30) op_new();
      else if (kind < 50) op_grow();
      else if (kind < 70) op_commit();
      else if (kind < 80) op_fork();
      else if (kind < 95) op_free();
      else op_probe();
      bm_->check_step();  // the per-step check on what this op changed: never a false alarm
      bm_->check_invariants();
      compare();
    }
    cov_.num_evictions += model_->num_evictions_;
    cov_.num_duplicates += model_->num_duplicates_;
  }

 private:
  int32_t pick(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }

  tokens_t random_tokens(int32_t n) {
    tokens_t t(static_cast<size_t>(n));
    for (auto& x : t) x = pick(0, alphabet_ - 1);
    return t;
  }

  const tokens_t& pick_corpus() {
    return corpus_[static_cast<size_t>(pick(0, static_cast<int32_t>(corpus_.size()) - 1))];
  }

  /// A prompt that often shares a prefix with an earlier one.
  tokens_t make_prompt() {
    tokens_t prompt;
    if (!corpus_.empty() && pick(0, 9) < 6) {
      const tokens_t& base = pick_corpus();
      prompt.assign(base.begin(), base.begin() + pick(0, static_cast<int32_t>(base.size())));
    }
    const tokens_t tail = random_tokens(pick(prompt.empty() ? 1 : 0, 3 * bs_));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    return prompt;
  }

  /// A live sequence chosen uniformly, by position in the (ordered) map; -1 if none.
  seq_id pick_live() {
    if (live_.empty()) return -1;
    auto it = live_.begin();
    std::advance(it, pick(0, static_cast<int32_t>(live_.size()) - 1));
    return it->first;
  }

  void op_new() {
    const seq_id seq = next_id_++;
    const tokens_t prompt = make_prompt();
    prefix_hit hit = bm_->find_prefix(prompt);
    const prefix_hit expected_hit = model_->find_prefix(prompt);
    ASSERT_EQ(hit.blocks, expected_hit.blocks);
    ASSERT_EQ(hit.num_tokens, expected_hit.num_tokens);
    if (pick(0, 9) == 0) hit = prefix_hit{};  // ignore the cache: makes duplicate commits
    const int32_t len = static_cast<int32_t>(prompt.size());
    const int32_t total = pick(0, 1) ? len : pick(std::max(hit.num_tokens, 1), len);  // a chunk
    const bool can = bm_->can_allocate(seq, total, hit);
    ASSERT_EQ(can, model_->can_allocate(seq, total, hit));
    const auto num_hit_free = std::count_if(hit.blocks.begin(), hit.blocks.end(),
                                            [&](block_id b) { return bm_->refcount(b) == 0; });
    cov_.num_hits += hit.blocks.empty() ? 0 : 1;
    cov_.num_hits_on_free_blocks += num_hit_free > 0 ? 1 : 0;
    cov_.num_refused += can ? 0 : 1;
    const int32_t num_fresh =
        model_->num_blocks_for(total) - static_cast<int32_t>(hit.blocks.size());
    cov_.num_refused_only_because_of_hit += !can && num_fresh <= bm_->num_free_blocks() ? 1 : 0;
    if (!can) return;
    bm_->allocate(seq, total, hit);
    model_->allocate(seq, total, hit);
    live_[seq] = live_seq{prompt};
    corpus_.push_back(prompt);
  }

  void op_grow() {
    const seq_id seq = pick_live();
    if (seq < 0) return;
    live_seq& s = live_[seq];
    const int32_t total = bm_->num_tokens(seq) + pick(1, 2 * bs_);
    if (static_cast<int32_t>(s.tokens.size()) < total) {
      const tokens_t more = random_tokens(total - static_cast<int32_t>(s.tokens.size()));
      s.tokens.insert(s.tokens.end(), more.begin(), more.end());
    }
    const bool can = bm_->can_allocate(seq, total);
    ASSERT_EQ(can, model_->can_allocate(seq, total, {}));
    if (!can) return;
    bm_->allocate(seq, total);
    model_->allocate(seq, total, {});
  }

  void op_commit() {
    const seq_id seq = pick_live();
    if (seq < 0) return;
    const int32_t num_computed = pick(0, bm_->num_tokens(seq));
    bm_->commit(seq, live_[seq].tokens, num_computed);
    model_->commit(seq, live_[seq].tokens, num_computed);
  }

  void op_fork() {
    const seq_id parent = pick_live();
    if (parent < 0) return;
    const bool can = bm_->can_fork(parent);
    ASSERT_EQ(can, model_->can_fork(parent));
    if (!can) return;
    const seq_id child = next_id_++;
    const std::vector<block_copy> copies = bm_->fork(parent, child);
    ASSERT_EQ(copies, model_->fork(parent, child));
    cov_.num_fork_copies += static_cast<int64_t>(copies.size());
    const tokens_t& from = live_[parent].tokens;
    live_[child] = live_seq{tokens_t(from.begin(), from.begin() + bm_->num_tokens(parent))};
  }

  void op_free() {
    if (pick(0, 9) == 0) {  // a user-supplied id that does not exist
      const auto result = bm_->try_free(next_id_ + 1000);
      ASSERT_FALSE(result.has_value());
      ASSERT_EQ(result.error().code, errc::not_found);
      return;
    }
    const seq_id seq = pick_live();
    if (seq < 0) return;
    if (pick(0, 1)) bm_->free(seq);
    else ASSERT_TRUE(bm_->try_free(seq).has_value());
    model_->free(seq);
    live_.erase(seq);
  }

  void op_probe() {
    if (corpus_.empty()) return;
    tokens_t probe = pick_corpus();
    const tokens_t extra = random_tokens(pick(0, bs_));
    probe.insert(probe.end(), extra.begin(), extra.end());
    const prefix_hit hit = bm_->find_prefix(probe);
    ASSERT_EQ(hit.blocks, model_->find_prefix(probe).blocks);
    ASSERT_EQ(hit.num_tokens, model_->find_prefix(probe).num_tokens);
  }

  void compare() {
    ASSERT_EQ(bm_->num_sequences(), static_cast<int32_t>(model_->seqs_.size()));
    for (const auto& [seq, s] : model_->seqs_) {
      ASSERT_TRUE(bm_->contains(seq));
      ASSERT_EQ(bm_->block_table(seq), s.table) << "seq " << seq;
      ASSERT_EQ(bm_->num_tokens(seq), s.num_tokens) << "seq " << seq;
    }
    ASSERT_EQ(bm_->free_queue(), model_->free_queue_);
    ASSERT_EQ(bm_->num_free_blocks(), static_cast<int32_t>(model_->free_queue_.size()));
    ASSERT_EQ(bm_->num_used_blocks(), num_blocks_ - bm_->num_free_blocks());
    ASSERT_EQ(bm_->num_cached_blocks(), static_cast<int32_t>(model_->cached_.size()));
    ASSERT_EQ(bm_->num_evictions(), model_->num_evictions_);
    for (block_id b = 0; b < num_blocks_; ++b) {
      ASSERT_EQ(bm_->refcount(b), model_->refcount(b)) << "block " << b;
      ASSERT_EQ(bm_->is_cached(b), model_->cached_.count(b) != 0) << "block " << b;
    }
  }

  std::mt19937_64 rng_;
  coverage& cov_;
  int32_t bs_ = 1;
  int32_t num_blocks_ = 1;
  int32_t alphabet_ = 1;
  std::unique_ptr<block_manager> bm_;
  std::unique_ptr<model> model_;
  std::map<seq_id, live_seq> live_;
  std::vector<tokens_t> corpus_;
  seq_id next_id_ = 1;
};

constexpr uint64_t num_seeds = 5000;
constexpr int num_ops_per_seed = 120;

TEST(BlockManagerFuzz, MatchesTheReferenceModel) {
  std::signal(SIGABRT, report_seed_on_abort);
  uint64_t first = 0;
  uint64_t count = num_seeds;
  if (const char* only = std::getenv("TROUPE_FUZZ_SEED")) {
    first = std::strtoull(only, nullptr, 10);
    count = 1;
  }
  coverage cov;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    current_seed = seed;
    SCOPED_TRACE("block_manager fuzz seed " + std::to_string(seed) +
                 " (rerun: TROUPE_FUZZ_SEED=" + std::to_string(seed) + ")");
    fuzz_run(seed, cov).run(num_ops_per_seed);
    if (::testing::Test::HasFailure()) break;
  }
  std::signal(SIGABRT, SIG_DFL);
  if (count < num_seeds) return;
  // Every rare path must have been reached, or passing says little.
  EXPECT_GT(cov.num_hits, 1000);
  EXPECT_GT(cov.num_hits_on_free_blocks, 100);
  EXPECT_GT(cov.num_refused, 100);
  EXPECT_GT(cov.num_refused_only_because_of_hit, 10);
  EXPECT_GT(cov.num_fork_copies, 100);
  EXPECT_GT(cov.num_evictions, 1000);
  EXPECT_GT(cov.num_duplicates, 100);
  std::printf("coverage: hits %lld (on free blocks %lld), refused %lld (only because of the hit "
              "%lld), fork copies %lld, evictions %lld, duplicate commits %lld\n",
              static_cast<long long>(cov.num_hits),
              static_cast<long long>(cov.num_hits_on_free_blocks),
              static_cast<long long>(cov.num_refused),
              static_cast<long long>(cov.num_refused_only_because_of_hit),
              static_cast<long long>(cov.num_fork_copies),
              static_cast<long long>(cov.num_evictions),
              static_cast<long long>(cov.num_duplicates));
}

}  // namespace
}  // namespace troupe::kv
