#pragma once

/// The synchronous engine: scheduler + block manager + transformer + sampler, one replica.
/// `step()` is the whole loop: schedule, run, sample, record, stream. It is the pure core the
/// engine and step-executor actors wrap, and the oracle they are tested against.

#include <map>
#include <memory>
#include <vector>

#include "runtime/engine/output_stream.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/kv/block_manager.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/sampling/sampler.hpp"
#include "runtime/sched/scheduler.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::engine {

struct engine_config {
  int32_t num_kv_blocks = 1024;  ///< KV pool size in blocks
  int32_t block_size = 16;       ///< tokens per block
  sched::scheduler_config scheduler;
  model::kernel_path kernels = model::kernel_path::fast;
  /// Tokens that end a sample unless `ignore_eos`. Empty = the tokenizer's EOS and, as in
  /// llama2.c (TinyStories separates stories with BOS), its BOS.
  std::vector<int32_t> eos_token_ids;
};

/// Counters since construction.
struct engine_stats {
  int64_t num_steps = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_scheduled_tokens = 0;   ///< tokens run through the model (prefill + decode)
  int64_t num_preemptions = 0;
  int64_t num_prefix_hit_tokens = 0;
  int32_t num_blocks_in_use = 0;
};

class engine {
 public:
  /// Validates `config` against the model (block count, budgets).
  [[nodiscard]] static expected<std::unique_ptr<engine>> create(const model::checkpoint& ck,
                                                                const tokenizer& tok,
                                                                const engine_config& config);

  /// Checks and queues a request. Errors: invalid sampling params, empty prompt, token ids out
  /// of range, max_tokens <= 0, n out of range, bad stop strings (invalid_argument); prompt +
  /// max_tokens beyond the model's context or a sequence needing more blocks than the whole
  /// pool (too_long); a duplicate id (invalid_argument).
  [[nodiscard]] expected<void> add_request(request r);

  /// Ends every sample of a request now; its last events carry finish_reason::aborted.
  /// Unknown id -> not_found.
  [[nodiscard]] expected<std::vector<token_event>> abort(request_id id);

  /// Runs one step; returns the tokens it produced (and the ends of finished samples).
  [[nodiscard]] std::vector<token_event> step();

  [[nodiscard]] bool has_unfinished() const { return !requests_.empty(); }
  [[nodiscard]] engine_stats stats() const;
  [[nodiscard]] const kv::block_manager& blocks() const { return *blocks_; }
  [[nodiscard]] const model::model_config& model_config() const { return model_.config(); }

  /// Aborts unless scheduler, block manager, and the request/sequence maps agree.
  void check_invariants() const;

 private:
  struct sample_state {
    request_id request = 0;
    int32_t index = 0;
    uint64_t seed = 0;
    int32_t num_generated = 0;
    output_stream stream;
  };
  struct request_state {
    request req;
    std::vector<sched::seq_id> live;  ///< sequences still generating, by sample index
  };

  engine(const model::checkpoint& ck, const tokenizer& tok, const engine_config& config);

  [[nodiscard]] expected<void> validate(const request& r) const;
  void run_forward(const sched::step_plan& plan);
  [[nodiscard]] std::vector<sampling::sample_result> sample(const sched::step_plan& plan);
  void fork_samples(sched::seq_id parent, const float* logits, std::vector<token_event>& events);
  void emit(sched::seq_id seq, const sampling::sample_result& s, std::vector<token_event>& events);
  void finish(sched::seq_id seq, token_event& last, finish_reason reason);
  [[nodiscard]] sched::seq_id new_sequence(request_id id, int32_t index, uint64_t seed);

  engine_config config_;
  const tokenizer& tokenizer_;
  model::transformer model_;
  model::kv_cache cache_;
  std::unique_ptr<kv::block_manager> blocks_;
  std::unique_ptr<sched::scheduler> scheduler_;
  sampling::sampler sampler_;
  std::map<request_id, request_state> requests_;
  std::map<sched::seq_id, sample_state> samples_;
  sched::seq_id next_seq_ = 0;
  std::vector<float> logits_;        // (sampling chunks, vocab)
  std::vector<model::forward_row> rows_;
  engine_stats stats_;
};

}  // namespace troupe::engine
