#pragma once

/// The Llama forward pass over a batch of rows, reading and writing KV through block tables.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/cpu/layer_stream.hpp"
#include "kernels/cpu/ops.hpp"
#include "runtime/model/kernel_path.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/kv_cache.hpp"
#include "runtime/moe/expert_dispatch.hpp"
#include "runtime/moe/placement.hpp"

namespace troupe::model {

/// Which kernel implementation a transformer runs. Both give the same bits; `reference` is
/// the readable oracle.

/// One token of one sequence in a step: a prefill-chunk token or a decode token.
struct forward_row {
  int32_t token = 0;
  int32_t position = 0;                  ///< 0-based position in its sequence
  const int32_t* block_table = nullptr;  ///< the sequence's blocks; covers position
  bool want_logits = false;              ///< compute this row's logits (last token of a chunk)
  bool want_hidden = false;              ///< return this row's final-norm hidden state (pooling)
};

/// Runs a checkpoint (float32, or Q8_0 as runq.c computes it, or a float32 mixture of experts,
/// or a GGUF model in its stored types as llama.cpp computes them).
/// Owns packed weights, the RoPE table and scratch buffers; not thread-safe.
class transformer {
 public:
  transformer(const checkpoint& ck, kernel_path path = kernel_path::fast);

  [[nodiscard]] const model_config& config() const { return config_; }

  /// Spreads each step over `pool`'s threads (borrowed; nullptr = this thread only). Results
  /// are bit-identical for every pool size. Two ways: each kernel call's outputs are shared out
  /// (matmul tiles, attention rows), or — when every matrix together fits a core's L2 cache
  /// (`max_split_matrix_bytes`; a dense model, not an MoE) and the step's rows fall into
  /// independent sets (runtime/model/row_groups.hpp) — each thread runs a whole forward pass over
  /// its share of the sets. A small model's kernel calls are a few microseconds each, so the
  /// second saves two synchronizations per call (~40 per step) for reading the weights once per
  /// thread, which a cache-resident model pays nothing for.
  void set_thread_pool(kernels::cpu::thread_pool* pool);

  /// The largest model (the bytes of its matrices) whose steps are split by independent rows.
  static constexpr int64_t max_split_matrix_bytes = int64_t{2} << 20;

  /// Consecutive rows of one sequence whose attention reads each KV block once for all of them
  /// (fast::attention_rows; a tile whose scores outgrow the scratch is split).
  static constexpr int32_t attention_tile_rows = 16;

  /// An MoE checkpoint's experts: computed by `dispatch` (borrowed; it must outlive the
  /// transformer's use of it), whose shards hold them as `placement` says. Until this is called,
  /// one in-process shard holds every expert. Results are bit-identical for every placement and
  /// dispatch (runtime/moe/placement.hpp).
  void set_expert_dispatch(const moe::expert_placement& placement, moe::expert_dispatch& dispatch);

  /// Computes one step for `rows` (any mix of sequences). Rows of one sequence must appear in
  /// increasing position order and each row's block table must cover its position. Writes the
  /// rows' K/V into `cache`, then fills `logits` with one (vocab_size) vector per row whose
  /// want_logits is set, in row order. A row's results depend only on its own sequence: they are
  /// bit-identical whatever else is in the batch (see kernels/cpu/ops.hpp).
  /// `num_layers` in [1, n_layers] (0: all) runs only the first layers, then the final norm and the
  /// classifier: the layer-skip self-draft of speculative decoding (runtime/spec/drafter.hpp).
  /// Those layers' K/V are the ones the whole model writes for the same rows.
  /// `hidden` (may be null) gets one (dim) vector per row whose want_hidden is set, in row order:
  /// its hidden state after the final norm, the classifier's input (embeddings pool them).
  /// `moves` (may be null): a step's KV moves running beside the pass, layer by layer; each
  /// layer starts once its moves are done (`moves->wait(layer)`).
  void forward(const std::vector<forward_row>& rows, kv_cache& cache, std::vector<float>& logits,
               int32_t num_layers = 0, std::vector<float>* hidden = nullptr, kernels::cpu::layer_stream* moves = nullptr);

  /// Bytes of memory the weights take: the checkpoint's (checkpoint::resident_bytes) and the
  /// packed copies the fast path made.
  [[nodiscard]] int64_t resident_bytes() const;

  /// Why the last forward's experts could not be computed (a dispatch that refused or timed out:
  /// shards in other actors or processes), if so. That forward stopped at the failed layer: its
  /// logits and the K/V it wrote are meaningless.
  [[nodiscard]] const std::optional<error>& expert_error() const { return expert_error_; }

 private:
  struct layer_weights {
    kernels::cpu::packed_matrix wq, wk, wv, wo, w1, w2, w3;  // an MoE's: no w1, w2, w3
    kernels::cpu::packed_matrix router;                      // an MoE's with a top-k router
  };
  struct q80_layer_weights {
    kernels::cpu::packed_q80 wq, wk, wv, wo, w1, w2, w3;
  };

  /// One forward pass's buffers, sized for the largest batch it has run.
  struct scratch {
    std::vector<float> x;       // (rows, dim) residual stream
    std::vector<float> xb;      // (rows, dim)
    std::vector<float> xb2;     // (rows, dim)
    std::vector<float> q;       // (rows, q_dim)
    std::vector<float> att;     // (rows, q_dim) attention's output, wo's input
    std::vector<float> k;       // (rows, kv_dim)
    std::vector<float> v;       // (rows, kv_dim)
    std::vector<float> hb;      // (rows, hidden_dim)
    std::vector<float> hb2;     // (rows, hidden_dim)
    std::vector<float> router_logits;  // (rows, n_experts) (an MoE's)
    std::vector<float> scores;  // (threads, n_heads, seq_len); (n_heads, seq_len) for a group
    std::vector<int8_t> xq;     // (rows, max(dim, hidden_dim)) activations quantized (Q8_0 only)
    std::vector<float> xs;      // (rows, max(dim, hidden_dim) / group_size) their scales
    std::vector<uint8_t> xt;    // activations in a stored matrix's dot type (GGUF models)
    std::vector<uint8_t> embedding_row;  // a token's row of a laid-out (rows16) embedding
    // An f16 or q8_0 pool's blocks one layer's rows read, as an f32 pool holds them (stage_kv):
    std::vector<float> stage_keys, stage_values;  // (staged blocks, block_size * kv_dim)
    std::vector<int32_t> stage_of;                // pool block -> its staged index; -1: none
    std::vector<int32_t> staged;                  // the pool blocks staged, in order of first read
    std::vector<int32_t> stage_tables;            // each row's block table in staged indices
    std::vector<int64_t> stage_table_at;          // (rows) where its table starts in stage_tables
    std::vector<std::pair<int32_t, int32_t>> attention_tiles;  // (first row, rows) sharing KV reads
  };

  /// The model's matrices, by name.
  enum class matrix { wq, wk, wv, wo, w1, w2, w3, wcls, router };
  /// Whether a step's independent rows run as separate passes, one per thread (see forward()).
  [[nodiscard]] bool splits_rows() const;
  /// One forward pass over `rows` with `s`'s buffers, its kernels spread over `pool` (or not).
  void run(const std::vector<forward_row>& rows, kv_cache& cache, std::vector<float>& logits, int32_t num_layers,
           std::vector<float>* hidden, scratch& s, kernels::cpu::thread_pool* pool);
  /// out (rows, d) = x (rows, n) · w (d, n)ᵀ for matrix `which` of `layer` (any layer for
  /// wcls): float32 through the packed copy on the fast path, or Q8_0 with x quantized per
  /// group first (runq.c's arithmetic).
  void matmul(float* out, const float* x, matrix which, int32_t layer, int32_t rows, scratch& s,
              kernels::cpu::thread_pool* pool);
  /// `packed`: w's packed copy (fast path) or nullptr (reference path).
  void matmul_q80(float* out, const float* x, const kernels::cpu::q80_matrix& w,
                  const kernels::cpu::packed_q80* packed, int32_t rows, scratch& s, kernels::cpu::thread_pool* pool);
  void attention_layer(const std::vector<forward_row>& rows, kv_cache& cache, int32_t layer, scratch& s,
                       kernels::cpu::thread_pool* pool);
  /// Converts the blocks of an f16 or q8_0 `cache` that `rows` attend to in `layer` (each
  /// once) into s.stage_keys and s.stage_values as an f32 pool holds them, and renumbers each
  /// row's block table into them: attention then runs its f32 kernels, on the stored values.
  void stage_kv(const std::vector<forward_row>& rows, const kv_cache& cache, int32_t layer,
                const kernels::cpu::attention_shape& shape, scratch& s, kernels::cpu::thread_pool* pool);
  void ffn_layer(int32_t rows, int32_t layer, scratch& s, kernels::cpu::thread_pool* pool);
  /// The MoE FFN: route the rows, send each shard its rows, combine by expert id, then row.
  void moe_ffn_layer(int32_t rows, int32_t layer, scratch& s, kernels::cpu::thread_pool* pool);
  void classifier(const std::vector<forward_row>& rows, std::vector<float>& logits, std::vector<float>* hidden,
                  scratch& s, kernels::cpu::thread_pool* pool);
  /// Copies each group's rows' outputs (`width` floats per row whose `wants` is set, from
  /// `from`, the groups' own) back to their places among the step's rows into `out`.
  static void gather_groups(const std::vector<forward_row>& rows, const std::vector<std::vector<int32_t>>& groups,
                            bool forward_row::*wants, int32_t width, const std::vector<std::vector<float>>& from,
                            std::vector<float>& out);
  void reserve(scratch& s, int32_t rows) const;

  checkpoint ck_;  // keeps the mapped weights alive
  model_config config_;
  kernel_path path_;
  kernels::cpu::exp_source exp_;  // libm's expf for Q8_0 (runq.c's arithmetic), else the kernels'
  std::vector<layer_weights> layers_;  // float32 checkpoints on the fast path
  kernels::cpu::packed_matrix wcls_;
  std::vector<q80_layer_weights> q80_layers_;  // Q8_0 checkpoints on the fast path
  kernels::cpu::packed_q80 q80_wcls_;
  /// RoPE's angles of every position: (seq_len, head_size / 2) each.
  struct rope_angles {
    std::vector<float> cos, sin;
  };
  static rope_angles rope_table(const model_config& c, float base, float scale);
  rope_angles rope_;      // every layer's, or the global layers' (Gemma)
  rope_angles rope_swa_;  // sliding layers' (Gemma); empty without them
  moe::expert_placement placement_;                          // an MoE's
  std::unique_ptr<moe::expert_dispatch> own_dispatch_;       // one shard with every expert
  moe::expert_dispatch* dispatch_ = nullptr;                 // own_dispatch_ or a borrowed one
  std::optional<error> expert_error_;                        // the last forward's failed dispatch
  int64_t num_forwards_ = 0;  // the turn of an MoE's replicas (moe::plan_dispatch)
  int64_t matrix_weights_ = 0;  // the weights of every matrix a token's forward reads
  int64_t matrix_bytes_ = 0;    // their bytes

  kernels::cpu::thread_pool* pool_ = nullptr;
  kernels::cpu::layer_stream* moves_ = nullptr;  // the running forward's (forward())
  std::vector<scratch> scratch_;  // [0]: a whole batch's; [g]: group g's when rows are split
  // A split step's groups: their rows and their logits.
  std::vector<std::vector<forward_row>> group_rows_;
  std::vector<std::vector<float>> group_logits_;
  std::vector<std::vector<float>> group_hidden_;
};

}  // namespace troupe::model
