#pragma once

/// llama2.c checkpoints, memory-mapped: the legacy format (7 int32 header, then float32
/// weights), version 2 (runq.c's Q8_0: a 256-byte header, float32 norms, then each matrix as
/// int8 values and one float32 scale per group), and troupe's mixture-of-experts format (a
/// 256-byte header extending llama2.c's, then float32 weights; docs/moe.md).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quants.hpp"
#include "runtime/common/error.hpp"
#include "runtime/moe/routing.hpp"

namespace troupe::kernels::cpu {
class thread_pool;
}

namespace troupe::model {

struct layout_cache_entry;

/// The largest value a header field may hold (dimensions, vocabulary, seq_len): far above any
/// llama2.c-format model, and keeps the size arithmetic far from overflow.
inline constexpr int32_t header_value_max = 1 << 20;

/// Which elements of a head RoPE rotates together: llama2.c's and GGUF llama's consecutive
/// pairs (2f, 2f + 1), or GPT-NeoX's halves (f, f + head_size / 2) (qwen2, qwen3, phi3).
enum class rope_style : uint8_t { interleaved, neox };

/// The FFN's gate activation: SiLU (SwiGLU: llama, qwen, phi3) or GELU's tanh form (GeGLU:
/// gemma2, gemma3).
enum class ffn_activation : uint8_t { silu, gelu };

/// Shape of a transformer model: a llama2.c header's fields, and how a GGUF architecture
/// computes what llama2.c's fixed choices leave open (docs/gguf.md).
struct model_config {
  int32_t dim = 0;         ///< transformer width
  int32_t hidden_dim = 0;  ///< FFN width
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;
  int32_t seq_len = 0;     ///< maximum context length
  bool shared_classifier = true;  ///< the header's vocab_size was positive
  // How RoPE and RMS norm are computed: llama2.c's fixed values unless a GGUF file's metadata
  // says otherwise (docs/gguf.md).
  float rope_freq_base = 10000.0f;  ///< pair f of a head turns by pos * base^(-2f / head_size)
  float rope_freq_scale = 1.0f;     ///< linear RoPE scaling: angles times 1 / rope.scaling.factor
  std::vector<float> rope_freq_factors;  ///< (head_size / 2) divisors of each pair's angle
                                         ///< (Llama 3's scaling, rope_freqs.weight); empty: none
  float rms_norm_eps = 1e-5f;       ///< added to the mean square before its inverse square root
  rope_style rope = rope_style::interleaved;
  int32_t head_dim = 0;   ///< a head's width; 0: dim / n_heads (GGUF attention.key_length may differ)
  bool qkv_bias = false;  ///< Q, K and V add a bias after their matmuls (qwen2)
  bool qk_norm = false;   ///< each head of Q and K is RMS-normed before RoPE (qwen3, gemma3)
  // Gemma's choices (docs/gguf.md), at llama's values for every other architecture:
  ffn_activation activation = ffn_activation::silu;
  bool scale_embedding = false;  ///< an embedding row is multiplied by sqrt(dim) first
  bool post_norms = false;       ///< attention's and the FFN's outputs are RMS-normed before each residual add
  float attn_softcap = 0.0f;     ///< attention scores soft-capped at this (kernels' soft_cap); 0: none
  float final_softcap = 0.0f;    ///< logits soft-capped at this; 0: none
  float attn_divisor = 0.0f;     ///< a score is q·k / attn_divisor; 0: sqrt(head_size)
  int32_t sliding_window = 0;    ///< a sliding layer attends its last this many positions; 0: none
  int32_t sliding_period = 0;    ///< layer l slides when l % period < period - 1 (0: every layer)
  float rope_freq_base_swa = 10000.0f;  ///< a sliding layer's RoPE base
  float rope_freq_scale_swa = 1.0f;     ///< and linear scale

  [[nodiscard]] bool is_sliding(int32_t layer) const {
    return sliding_window > 0 && (sliding_period == 0 || layer % sliding_period < sliding_period - 1);
  }

  /// The layers that do not slide, ascending (every layer without a window).
  [[nodiscard]] std::vector<int32_t> global_layers() const {
    std::vector<int32_t> out;
    for (int32_t l = 0; l < n_layers; l++)
      if (!is_sliding(l)) out.push_back(l);
    return out;
  }

  [[nodiscard]] int32_t head_size() const { return head_dim > 0 ? head_dim : dim / n_heads; }
  [[nodiscard]] int32_t q_dim() const { return n_heads * head_size(); }
  [[nodiscard]] int32_t kv_dim() const { return n_kv_heads * head_size(); }
  /// Whether a llama2.c-format file can hold this model: every choice above at llama2.c's value
  /// (what `troupe quantize`, `moe-split` and `convert` write).
  [[nodiscard]] bool is_llama2c() const;
};

/// Pointers into the mapped file, in llama2.c's names and shapes. A version-2 (Q8_0) checkpoint
/// has the norms and the token embedding (dequantized at load, as runq.c does) here and its
/// matrices in `q80_weights`; a GGUF model computed in its stored types has its norms here and
/// its matrices (the embedding too) in `stored_weights`: wq .. w3 and wcls are then null.
struct weights {
  const float* token_embedding = nullptr;  ///< (vocab_size, dim)
  const float* rms_att = nullptr;          ///< (layer, dim)
  const float* wq = nullptr;               ///< (layer, q_dim, dim): out = q_dim, in = dim
  const float* wk = nullptr;               ///< (layer, kv_dim, dim)
  const float* wv = nullptr;               ///< (layer, kv_dim, dim)
  const float* wo = nullptr;               ///< (layer, dim, q_dim)
  const float* rms_ffn = nullptr;          ///< (layer, dim)
  const float* w1 = nullptr;               ///< (layer, hidden_dim, dim)
  const float* w2 = nullptr;               ///< (layer, dim, hidden_dim)
  const float* w3 = nullptr;               ///< (layer, hidden_dim, dim)
  const float* rms_final = nullptr;        ///< (dim)
  const float* wcls = nullptr;             ///< (vocab_size, dim); == token_embedding if shared
  // A GGUF architecture's extras (model_config says which), null otherwise:
  const float* bq = nullptr;      ///< (layer, q_dim) when qkv_bias
  const float* bk = nullptr;      ///< (layer, kv_dim) when qkv_bias
  const float* bv = nullptr;      ///< (layer, kv_dim) when qkv_bias
  const float* q_norm = nullptr;  ///< (layer, head_size) when qk_norm
  const float* k_norm = nullptr;  ///< (layer, head_size) when qk_norm
  const float* rms_att_post = nullptr;  ///< (layer, dim) when post_norms
  const float* rms_ffn_post = nullptr;  ///< (layer, dim) when post_norms
  const float* router = nullptr;        ///< (layer, n_experts, dim) a GGUF MoE's ffn_gate_inp
};

/// A model's matrices in one kernel view: one per layer, llama2.c's names and shapes.
template <class Matrix>
struct matrix_set {
  Matrix token_embedding;  ///< (vocab_size, dim)
  std::vector<Matrix> wq, wk, wv, wo, w1, w2, w3;  ///< (layer)
  Matrix wcls;  ///< == token_embedding if shared
};

/// The matrices of a version-2 checkpoint in the kernels' Q8_0 view; activations are quantized
/// as runq.c does.
struct q80_weights : matrix_set<kernels::cpu::q80_matrix> {
  int32_t group_size = 0;
};

/// The matrices of a GGUF model read in place, in the types the file stores them (any mix of
/// kernels/cpu/quants.hpp's), computed as llama.cpp computes them: every GGUF model unless
/// load_options::float32_views asks for an all-F32 file's matrices as float32.
using stored_weights = matrix_set<kernels::cpu::quant_matrix>;

/// The FFN of a mixture-of-experts checkpoint: a router and `n_experts` SwiGLU experts per
/// layer, each of model_config::hidden_dim hidden units. Its `weights` have no w1, w2, w3. A GGUF
/// MoE computed in its stored types (Mixtral's llama layout, qwen3moe) has its experts in
/// stored_weights' w1, w2, w3 at expert_index(layer, expert), and null w1, w2, w3 here.
struct moe_weights {
  int32_t n_experts = 0;
  int32_t top_k = 0;  ///< experts per row; n_experts for router_kind::all
  moe::router_kind router = moe::router_kind::top_k;
  const float* router_weight = nullptr;  ///< (layer, n_experts, dim)
  const float* router_bias = nullptr;    ///< (layer, n_experts): added to the router's logits; null: none (GGUF)
  const float* w1 = nullptr;             ///< (layer, n_experts, hidden_dim, dim)
  const float* w2 = nullptr;             ///< (layer, n_experts, dim, hidden_dim)
  const float* w3 = nullptr;             ///< (layer, n_experts, hidden_dim, dim)

  /// Offset of (layer, expert)'s matrix in w1, w2 or w3 (all three are hidden_dim × dim).
  [[nodiscard]] int64_t expert_offset(const model_config& c, int32_t layer, int32_t expert) const {
    return expert_index(layer, expert) * c.hidden_dim * c.dim;
  }
  /// (layer, expert)'s place among every layer's experts.
  [[nodiscard]] int64_t expert_index(int32_t layer, int32_t expert) const {
    return static_cast<int64_t>(layer) * n_experts + expert;
  }
};

/// The MoE header's magic number, "tmoe" read as a little-endian uint32.
inline constexpr uint32_t moe_magic = 0x656f6d74;
/// The MoE format's version (the int32 after the magic).
inline constexpr int32_t moe_version = 1;
/// Bytes of the MoE header (zero-padded).
inline constexpr int64_t moe_header_bytes = 256;
/// The most experts a layer may have.
inline constexpr int32_t moe_experts_max = 1024;

/// The version-2 header's magic number, "ak42" read as a little-endian uint32.
inline constexpr uint32_t q80_magic = 0x616b3432;
/// Bytes of the version-2 header (zero-padded).
inline constexpr int64_t q80_header_bytes = 256;

/// How `checkpoint::load` treats the weights' values.
struct load_options {
  /// Scan every weight for NaN and infinities (one pass over the file, cheap next to reading it
  /// for the first forward pass). Off only in tests that need a poisoned model to run.
  bool check_finite = true;
  /// Read the whole file into memory at load, so the first request does not fault the weights
  /// in page by page. Off only to measure the difference (bench_warm_start).
  bool prefault = true;
  /// The longest context (prompt and output, in tokens) to serve: model_config::seq_len is the
  /// file's, clipped to this when > 0 (`--ctx-size`).
  int32_t max_context = 0;
  /// Called as the file is read (bytes read, file size), when given: progress for an operator.
  std::function<void(int64_t, int64_t)> progress;
  /// Lay out the Q8_0 and Q4_0 matrices of a GGUF file as the selected kernels read them
  /// fastest (kernels::cpu::fast::takes_rows16), once at load, instead of reading them in place:
  /// the same bits, the same memory (the file's pages they came from are given back). Off only
  /// to compare (tests, benches).
  bool repack = true;
  /// Read an all-F32 GGUF file's matrices as llama2.c's float32 views (weights; a copy in
  /// llama2.c's layout, computed by the float kernels) instead of in place: for what reads
  /// float32 views (convert, quantize, moe-split, moving experts between shards). Files with
  /// any other type are read in place either way.
  bool float32_views = false;
  /// The directory of the layout cache (layout_cache.hpp) that keeps the laid-out matrices
  /// between starts; "" = none (made at every start).
  std::string layout_cache;
  /// Layouts smaller than this are made at every start (milliseconds), not cached.
  int64_t layout_cache_min_bytes = int64_t{64} << 20;
  /// A new entry is written in the background while the model serves (the checkpoint's
  /// destruction waits for it); this is called, on the writing thread, with a sentence saying
  /// where it was kept or why not.
  std::function<void(const std::string&)> layout_cache_report;
};

/// A loaded checkpoint: config plus weight views into a read-only memory map. Move-only; the
/// views stay valid for the checkpoint's lifetime.
class checkpoint {
 public:
  /// Maps and validates `path`. Errors name the file and what is wrong: missing/unreadable
  /// (io_error); header out of range, inconsistent shapes, a size different from what the
  /// header implies, or (with `check_finite`) a NaN or infinite weight, naming its tensor,
  /// layer and index (malformed_file).
  [[nodiscard]] static expected<checkpoint> load(const std::string& path, load_options options = {});

  [[nodiscard]] const model_config& config() const { return config_; }
  [[nodiscard]] const weights& w() const { return weights_; }
  /// The Q8_0 matrices of a version-2 checkpoint; nullptr for float32 ones.
  [[nodiscard]] const q80_weights* q80() const;
  /// The matrices of a GGUF model computed in its stored types; nullptr for every other model.
  [[nodiscard]] const stored_weights* stored() const;
  /// Whether no matrix is stored in a GGUF type other than F32 (model_header::float32): every
  /// llama2.c-format file, and all-F32 GGUF files whether read in place or as float32 views.
  [[nodiscard]] bool gguf_float32() const;
  /// Bytes of weights the checkpoint holds in memory: the mapped file's tensor bytes it reads
  /// in place and the copies it made (converted or dequantized values).
  [[nodiscard]] int64_t resident_bytes() const;
  /// The experts of a mixture-of-experts checkpoint; nullptr for dense ones.
  [[nodiscard]] const moe_weights* moe() const { return moe_ ? &*moe_ : nullptr; }
  [[nodiscard]] const std::string& path() const { return path_; }
  /// The file's architecture: a GGUF file's general.architecture, or "llama2.c".
  [[nodiscard]] const std::string& architecture() const { return architecture_; }
  /// What load did about the layout for the kernels, for an operator ("" when nothing was laid
  /// out): made (and cached where), mapped from the cache, or why the cache was not used.
  [[nodiscard]] const std::string& layout_note() const { return layout_note_; }

 private:
  struct mapping;
  struct layout_plan;
  static layout_plan plan_layout(mapping& map);
  static void repack_stored(mapping& map, const layout_plan& plan, kernels::cpu::thread_pool& pool);
  static bool map_layout_cache(mapping& map, const layout_plan& plan, const layout_cache_entry& entry,
                               const load_options& options, kernels::cpu::thread_pool& pool, std::string& note);
  /// Gives back the file pages of a token embedding read in place and not shared with the
  /// classifier: only looked-up rows are read again (the NaN scan and the prefault read them all).
  static void release_embedding(const mapping& map);
  std::string path_;
  std::string architecture_ = "llama2.c";
  std::string layout_note_;
  model_config config_;
  weights weights_;
  std::optional<moe_weights> moe_;
  std::shared_ptr<const mapping> map_;
};

/// What a model file's header says, read without any weight: what start-up sizes the KV pool
/// by before loading (`checkpoint::read_header`).
struct model_header {
  model_config config;       ///< the shape (GGUF: embedding, layers, heads, head width, context)
  bool float32 = true;       ///< every tensor float32 (else a GGUF file computed as stored)
  int64_t file_bytes = 0;
};

/// The header of the model in `path`: a GGUF file's metadata and tensor index, or a llama2.c
/// format's header. Errors as checkpoint::load's for the same faults; what only the weights
/// show (a tensor's shape, a NaN) is load's to find.
[[nodiscard]] expected<model_header> read_header(const std::string& path);

/// One line for an operator: architecture, parameters, the types they are computed in (with
/// their share), resident bytes; e.g. "qwen2, 494.0 M parameters (Q4_K 70%, Q6_K 27%, F32 3%),
/// 380.2 MiB resident".
[[nodiscard]] std::string describe(const checkpoint& ck, int64_t resident_bytes);

/// Refuses (errc::invalid_argument, naming `what`, the tool) a model that a llama2.c-format file
/// cannot hold (model_config::is_llama2c): what `what` writes would compute another model.
[[nodiscard]] expected<void> require_llama2c(const checkpoint& ck, const std::string& what);

/// The first NaN or infinite value among `ck`'s weights, as an error naming the tensor, the layer
/// (for per-layer tensors) and the element index within it; exposed for tests.
/// With `laid_out_checked`, matrices in the kernels' layout are skipped: a layout cache entry's,
/// whose matrices were checked before the entry was written (its checksum holds).
[[nodiscard]] expected<void> check_finite(const checkpoint& ck, bool laid_out_checked = false);

/// Validates a version-2 header (`bytes` is at least q80_header_bytes long and starts with
/// q80_magic) against the file's size; returns the shape and the group size. Exposed for tests.
[[nodiscard]] expected<std::pair<model_config, int32_t>> parse_q80_header(std::string_view bytes,
                                                                          const std::string& path);

/// Validates an MoE header (`bytes` is at least moe_header_bytes long and starts with moe_magic)
/// against the file's size; returns the shape and the experts' counts and router (no weights).
/// Exposed for tests.
[[nodiscard]] expected<std::pair<model_config, moe_weights>> parse_moe_header(std::string_view bytes,
                                                                             const std::string& path);

/// Validates a header's values; exposed for tests. `file_size` in bytes.
[[nodiscard]] expected<model_config> parse_header(const int32_t (&header)[7], int64_t file_size,
                                                  const std::string& path);

}  // namespace troupe::model
