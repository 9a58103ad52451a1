#pragma once

/// The synchronous engine: an engine_core and a step_executor in one object, plus each
/// sample's output stream (detokenization and stop strings). `step()` is the whole loop:
/// schedule, run, sample, record, stream. It is the in-process oracle the actors are tested
/// against; the actors split the same three pieces across request, engine and executor.

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/output_stream.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::engine {

class engine {
 public:
  /// Validates `config` against the model (block count, budgets, vocabulary). `pool`
  /// (borrowed, may be null) spreads each step over its threads. `draft` (borrowed): the draft
  /// model of a draft_model drafter (config.speculation).
  [[nodiscard]] static expected<std::unique_ptr<engine>> create(const model::checkpoint& ck,
                                                                const tokenizer& tok,
                                                                const engine_config& config,
                                                                kernels::cpu::thread_pool* pool = nullptr,
                                                                const model::checkpoint* draft = nullptr);

  /// Checks and queues a request (see engine_core::add_request for the errors).
  [[nodiscard]] expected<void> add_request(request r);

  /// Prefill/decode disaggregation (see engine_core::add_prefill / add_prefilled): the prefill
  /// half produces no token events; its finished requests come out of take_prefilled.
  [[nodiscard]] expected<void> add_prefill(request r) { return core_->add_prefill(std::move(r)); }
  [[nodiscard]] expected<void> add_prefilled(request r, kv_data kv);
  [[nodiscard]] std::vector<prefilled_request> take_prefilled() { return core_->take_prefilled(); }

  /// Ends every sample of a request now; its last events carry finish_reason::aborted and
  /// token -1. Unknown id -> not_found.
  [[nodiscard]] expected<std::vector<token_event>> abort(request_id id);

  /// Runs one step; returns the tokens it produced (and the ends of finished samples). A request
  /// whose logits could not be sampled ends without a last event: it goes to take_failed.
  [[nodiscard]] std::vector<token_event> step();

  /// Requests failed by the steps since the last call (engine_core::take_failed).
  [[nodiscard]] std::vector<failed_request> take_failed();

  [[nodiscard]] bool has_unfinished() const { return core_->has_unfinished(); }
  [[nodiscard]] engine_stats stats() const { return core_->stats(); }
  [[nodiscard]] const kv::block_manager& blocks() const { return core_->blocks(); }
  [[nodiscard]] const engine_core& core() const { return *core_; }
  [[nodiscard]] const model::model_config& model_config() const { return executor_.config(); }

  void check_invariants() const;

 private:
  using sample_key = std::pair<request_id, int32_t>;  // (request, sample index)

  engine(const model::checkpoint& ck, const tokenizer& tok, const engine_config& config,
         std::unique_ptr<engine_core> core, kernels::cpu::thread_pool* pool, const model::checkpoint* draft);

  /// What a request's output streams are made from.
  struct text_spec {
    std::vector<int32_t> prompt;
    std::vector<std::string> stop;
  };

  /// Queues `r` through `add_to_core` (a core add_* call) and keeps its text side.
  template <class Add>
  [[nodiscard]] expected<void> add(request r, Add&& add_to_core);

  /// The output stream of a live sample, made on its first token.
  [[nodiscard]] output_stream& stream(request_id id, int32_t index);
  [[nodiscard]] token_event to_event(const sample_event& e);

  const tokenizer& tokenizer_;
  std::unique_ptr<engine_core> core_;
  step_executor executor_;
  grammar::grammar_cache grammars_;                 // requests' grammars, compiled on add
  std::map<request_id, text_spec> texts_;          // live requests
  std::map<sample_key, output_stream> streams_;    // live samples that produced a token
  std::vector<failed_request> failed_;             // for take_failed
};

}  // namespace troupe::engine
