#include "runtime/model/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/common/gguf.hpp"
#include "runtime/common/mapped_file.hpp"
#include "runtime/common/page_buffer.hpp"
#include "runtime/model/layout_cache.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe::model {
namespace {

constexpr int64_t header_bytes = 7 * sizeof(int32_t);
constexpr int32_t max_dimension = header_value_max;

/// A count summed from products of header fields in int64, overflow remembered: a crafted
/// header's products exceed 2^63 and, wrapped, could match a small file's size.
class checked_count {
 public:
  /// Adds the product of `factors`.
  checked_count& add(std::initializer_list<int64_t> factors) {
    int64_t product = 1;
    for (int64_t f : factors) overflow_ |= __builtin_mul_overflow(product, f, &product);
    overflow_ |= __builtin_add_overflow(total_, product, &total_);
    return *this;
  }
  /// The sum, or nullopt where a product or the sum overflowed.
  [[nodiscard]] std::optional<int64_t> value() const {
    return overflow_ ? std::nullopt : std::optional<int64_t>(total_);
  }

 private:
  int64_t total_ = 0;
  bool overflow_ = false;
};

/// Number of float32 weights a file stores for `c`: the legacy format's (freq_cis tables
/// included) for `n_experts` 0, else the MoE format's (router and experts for the FFN); nullopt
/// where the count overflows int64.
std::optional<int64_t> num_weight_floats(const model_config& c, int64_t n_experts = 0) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers;
  const int64_t kv_dim = c.kv_dim(), q_dim = c.q_dim(), vocab = c.vocab_size, head_size = c.head_size();
  checked_count n;
  n.add({vocab, dim});                           // token_embedding
  n.add({layers, dim});                          // rms_att
  n.add({layers, q_dim, dim, 2});                // wq, wo
  n.add({layers, kv_dim, dim, 2});               // wk, wv
  n.add({layers, dim});                          // rms_ffn
  if (n_experts == 0) {
    n.add({layers, hidden, dim, 3});             // w1, w2, w3
    n.add({c.seq_len, head_size});               // freq_cis_real + freq_cis_imag (unused)
  } else {
    n.add({layers, n_experts, dim + 1});         // router_weight, router_bias
    n.add({layers, n_experts, hidden, dim, 3});  // each expert's w1, w2, w3
  }
  n.add({dim});                                  // rms_final
  if (!c.shared_classifier) n.add({vocab, dim});  // wcls
  if (c.qkv_bias) n.add({layers, q_dim + 2 * kv_dim});  // bq, bk, bv
  if (c.qk_norm) n.add({layers, head_size, 2});         // q_norm, k_norm
  if (c.post_norms) n.add({layers, dim, 2});            // rms_att_post, rms_ffn_post
  return n.value();
}

/// Bytes of a file of `header` bytes then `floats` float32 weights; nullopt on overflow.
std::optional<int64_t> float_file_bytes(int64_t header, std::optional<int64_t> floats) {
  if (!floats) return std::nullopt;
  return checked_count{}.add({header}).add({*floats, 4}).value();
}

std::string where(const std::string& path) { return "model file '" + echo(path, echo_path_bytes_max) + "': "; }

/// Whether a float's exponent bits are all ones (NaN or an infinity). A bit test, so the scan
/// below vectorizes and is not slowed by -ffast-math assumptions.
bool non_finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

/// Index of the first non-finite value in [p, p + count), or -1.
int64_t first_non_finite(const float* p, int64_t count) {
  constexpr int64_t block = 4096;
  for (int64_t begin = 0; begin < count; begin += block) {
    const int64_t end = std::min(count, begin + block);
    bool any = false;
    for (int64_t i = begin; i < end; i++) any |= non_finite(p[i]);
    if (!any) continue;
    for (int64_t i = begin; i < end; i++)
      if (non_finite(p[i])) return i;
  }
  return -1;
}

/// One weight tensor: `num_layers` slices of `layer_size` floats (num_layers = 0: not per layer).
struct tensor_view {
  const char* name;
  const float* data;
  int64_t num_layers;
  int64_t layer_size;
};

}  // namespace

struct checkpoint::mapping {
  std::optional<mapped_file> file;  // a llama2.c checkpoint: the weights are read in place
  std::vector<float> owned;         // a GGUF's weights, converted to llama2.c's layout (its
                                    // vectors only when `stored`); a version-2 file's
                                    // dequantized token embedding
  std::vector<float> scales;        // a version-2 file's group scales (aligned)
  std::optional<q80_weights> q80;   // a version-2 file's matrices
  std::optional<stored_weights> stored;  // a GGUF file's matrices, in place in `file` or
                                         // laid out for the kernels in `repacked`
  page_buffer<uint8_t> repacked;
  std::optional<mapped_file> cache;  // a layout cache entry the matrices are read from
  std::thread cache_writer;          // writing `repacked` to a layout cache entry

  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    if (cache_writer.joinable()) cache_writer.join();
  }
};

namespace {

/// The threads that lay a model out and check its cache entry: every core.
int32_t load_threads() { return static_cast<int32_t>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 64)); }

}  // namespace

const q80_weights* checkpoint::q80() const { return map_ && map_->q80 ? &*map_->q80 : nullptr; }

const stored_weights* checkpoint::stored() const { return map_ && map_->stored ? &*map_->stored : nullptr; }

bool checkpoint::gguf_float32() const {
  const stored_weights* g = stored();
  if (g == nullptr) return true;
  bool all = g->token_embedding.type == kernels::cpu::weight_type::f32 && g->wcls.type == kernels::cpu::weight_type::f32;
  for (const auto* kind : {&g->wq, &g->wk, &g->wv, &g->wo, &g->w1, &g->w2, &g->w3})
    for (const kernels::cpu::quant_matrix& m : *kind) all = all && m.type == kernels::cpu::weight_type::f32;
  return all;
}

int64_t checkpoint::resident_bytes() const {
  const int64_t mapped = map_->file ? static_cast<int64_t>(map_->file->bytes().size()) : 0;
  return mapped + static_cast<int64_t>((map_->owned.size() + map_->scales.size()) * sizeof(float));
}

bool model_config::is_llama2c() const {
  return rope_freq_base == 10000.0f && rope_freq_scale == 1.0f && rope_freq_factors.empty() &&
         rms_norm_eps == 1e-5f && rope == rope_style::interleaved && head_dim == 0 && !qkv_bias && !qk_norm &&
         activation == ffn_activation::silu && !scale_embedding && !post_norms && attn_softcap == 0 &&
         final_softcap == 0 && attn_divisor == 0 && sliding_window == 0;
}

namespace {

/// The checks of a shape every format shares: divisible heads, pairs for rotary embeddings.
expected<void> check_shape(const model_config& c, const std::string& path) {
  if (c.head_dim == 0 && c.dim % c.n_heads != 0)
    return fail(errc::malformed_file, where(path) + "dim " + std::to_string(c.dim) +
                                          " is not a multiple of n_heads " + std::to_string(c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0)
    return fail(errc::malformed_file, where(path) + "n_heads " + std::to_string(c.n_heads) +
                                          " is not a multiple of n_kv_heads " +
                                          std::to_string(c.n_kv_heads));
  if (c.head_size() % 2 != 0)
    return fail(errc::malformed_file, where(path) + "head size " + std::to_string(c.head_size()) +
                                          " is odd; rotary embeddings need pairs");
  return {};
}

/// Views of llama2.c's weight layout starting at `p` (the legacy file's freq_cis tables, unused,
/// between rms_final and wcls when `freq_cis`). With `moe` (its counts set), the MoE format's:
/// the router and the experts in place of w1, w2, w3, their views set in `moe`.
weights views(const model_config& c, const float* p, bool freq_cis, moe_weights* moe = nullptr) {
  const int64_t dim = c.dim, layers = c.n_layers, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  auto take = [&p](int64_t count) {
    const float* q = p;
    p += count;
    return q;
  };
  weights w;
  w.token_embedding = take(c.vocab_size * dim);
  w.rms_att = take(layers * dim);
  w.wq = take(layers * c.q_dim() * dim);
  w.wk = take(layers * kv_dim * dim);
  w.wv = take(layers * kv_dim * dim);
  w.wo = take(layers * dim * c.q_dim());
  w.rms_ffn = take(layers * dim);
  if (moe != nullptr) {
    const int64_t experts = moe->n_experts;
    moe->router_weight = take(layers * experts * dim);
    moe->router_bias = take(layers * experts);
    moe->w1 = take(layers * experts * hidden * dim);
    moe->w2 = take(layers * experts * dim * hidden);
    moe->w3 = take(layers * experts * hidden * dim);
  } else {
    w.w1 = take(layers * hidden * dim);
    w.w2 = take(layers * dim * hidden);
    w.w3 = take(layers * hidden * dim);
  }
  w.rms_final = take(dim);
  if (freq_cis) take(static_cast<int64_t>(c.seq_len) * c.head_size());  // RoPE is computed
  w.wcls = c.shared_classifier ? w.token_embedding : take(c.vocab_size * dim);
  return w;
}


/// Reads float metadata `key`, when present, into `*out`: it must be finite and in (min, max]
/// (`what` names the quantity in the error).
expected<void> read_float_key(const gguf_file& f, const std::string& key, double min, double max, const char* what,
                              float* out, const std::string& path) {
  if (!f.metadata.count(key)) return {};
  auto v = f.get_float(key, path);
  if (!v) return tl::unexpected(v.error());
  if (!std::isfinite(*v) || *v <= min || *v > max) {
    std::ostringstream text;
    text << key << " = " << *v << " is out of range (" << what << " must be in (" << min << ", " << max << "])";
    return fail(errc::malformed_file, where(path) + text.str());
  }
  *out = static_cast<float>(*v);
  return {};
}

/// What a GGUF architecture computes differently from llama's forward pass (docs/gguf.md).
struct architecture {
  std::string_view name;
  rope_style rope;
  bool qkv_bias;      ///< attn_q.bias, attn_k.bias, attn_v.bias
  bool qk_norm;       ///< attn_q_norm.weight, attn_k_norm.weight
  bool fused_ffn_up;  ///< ffn_up holds the gate's rows then the up projection's; no ffn_gate
  bool may_fuse_qkv;  ///< attn_qkv.weight may hold Q's, K's and V's rows in place of three tensors
  bool gemma;         ///< Gemma's computation (read_gemma): post_attention_norm, post_ffw_norm, ...
  bool experts;       ///< may be a mixture of experts (read_moe): expert_count, ffn_*_exps tensors
};

constexpr architecture architectures[] = {
    {"llama", rope_style::interleaved, false, false, false, false, false, true},
    {"qwen2", rope_style::neox, true, false, false, false, false, false},
    {"qwen3", rope_style::neox, false, true, false, false, false, false},
    {"qwen3moe", rope_style::neox, false, true, false, false, false, true},
    {"phi3", rope_style::neox, false, false, true, true, false, false},
    {"gemma2", rope_style::neox, false, false, false, false, true, false},
    {"gemma3", rope_style::neox, false, true, false, false, true, false},
};

/// `<arch>.<suffix>`: an architecture's metadata key.
std::string key(const architecture& a, std::string_view suffix) {
  return std::string(a.name) + "." + std::string(suffix);
}

/// Llama 3's RoPE scaling as llama.cpp's converter stores it: the F32 tensor rope_freqs.weight of
/// head_size / 2 divisors, one per rotated pair, computed from rope_scaling's factor,
/// low_freq_factor, high_freq_factor and original_max_position_embeddings (llama.cpp's loader
/// reads only the tensor, so troupe does too). Each must be finite and in [1/1024, 1024].
expected<void> read_rope_freqs(std::string_view bytes, const gguf_file& f, model_config& c, const std::string& path) {
  const gguf_tensor* t = f.tensor("rope_freqs.weight");
  if (t == nullptr) return {};
  const int64_t half = c.head_size() / 2;
  if (t->dims != std::vector<int64_t>{half})
    return fail(errc::malformed_file, where(path) + "tensor 'rope_freqs.weight' must hold head_size / 2 = " +
                                          std::to_string(half) + " values (one per rotated pair)");
  std::vector<float> factors = tensor_floats(bytes, f, *t);
  for (size_t i = 0; i < factors.size(); i++) {
    if (std::isfinite(factors[i]) && factors[i] >= 1.0f / 1024 && factors[i] <= 1024) continue;
    std::ostringstream text;
    text << "rope_freqs.weight[" << i << "] = " << factors[i]
         << " is out of range (a RoPE frequency divisor must be in [1/1024, 1024])";
    return fail(errc::malformed_file, where(path) + text.str());
  }
  c.rope_freq_factors = std::move(factors);
  return {};
}

/// A head's width: attention.key_length, else embedding_length / head_count. value_length must
/// equal it and RoPE must rotate all of it (llama.cpp refuses partial rotary for these
/// architectures too).
expected<void> read_head_size(const gguf_file& f, const architecture& a, model_config& c, const std::string& path) {
  if (f.metadata.count(key(a, "attention.key_length"))) {
    auto v = f.get_int(key(a, "attention.key_length"), path);
    if (!v) return tl::unexpected(v.error());
    if (*v < 2 || *v > max_dimension || *v % 2 != 0)
      return fail(errc::malformed_file, where(path) + key(a, "attention.key_length") + " = " + std::to_string(*v) +
                                            " is out of range (an even width in 2.." + std::to_string(max_dimension) +
                                            ")");
    if (c.dim % c.n_heads != 0 || *v != c.dim / c.n_heads) c.head_dim = static_cast<int32_t>(*v);
  }
  if (auto ok = check_shape(c, path); !ok) return ok;
  for (std::string_view suffix : {"attention.value_length", "rope.dimension_count"}) {
    if (!f.metadata.count(key(a, suffix))) continue;
    auto v = f.get_int(key(a, suffix), path);
    if (!v) return tl::unexpected(v.error());
    if (*v != c.head_size())
      return fail(errc::malformed_file, where(path) + key(a, suffix) + " = " + std::to_string(*v) +
                                            " is not supported (heads are " + std::to_string(c.head_size()) +
                                            " wide, and keys, values and RoPE span all of a head)");
  }
  return {};
}

/// RoPE and RMS-norm settings of a GGUF model (`c`'s shape already read), as llama.cpp reads
/// them: the RMS epsilon, the RoPE base, a linear scale of 1 / rope.scaling.factor (its old name
/// rope.scale_linear; 0 means none) unless the scaling type is "none", and Llama 3's divisors
/// (read_rope_freqs). YaRN and the other scaling types are refused by name.
expected<void> read_rope_and_norm(std::string_view bytes, const gguf_file& f, const architecture& a, model_config& c,
                                  const std::string& path) {
  c.rope = a.rope;
  for (auto ok : {read_float_key(f, key(a, "attention.layer_norm_rms_epsilon"), 0, 1, "an RMS-norm epsilon",
                                 &c.rms_norm_eps, path),
                  read_float_key(f, key(a, "rope.freq_base"), 1, 1e10, "a RoPE frequency base", &c.rope_freq_base,
                                 path)})
    if (!ok) return ok;
  std::string scaling = "linear";  // llama.cpp's default when the key is absent
  if (f.metadata.count(key(a, "rope.scaling.type"))) {
    auto v = f.get_string(key(a, "rope.scaling.type"), path);
    if (!v) return tl::unexpected(v.error());
    scaling = *v;
  }
  if (scaling != "linear" && scaling != "none")
    return fail(errc::malformed_file, where(path) + key(a, "rope.scaling.type") + " '" + echo(scaling) +
                                          "' is not supported (none and linear are; Llama 3's scaling is the "
                                          "tensor rope_freqs.weight)");
  float factor = 1.0f;
  for (std::string_view suffix : {"rope.scaling.factor", "rope.scale_linear"}) {
    if (!f.metadata.count(key(a, suffix))) continue;
    auto v = f.get_float(key(a, suffix), path);
    if (!v) return tl::unexpected(v.error());
    if (*v != 0.0)
      if (auto ok = read_float_key(f, key(a, suffix), 0, 1024, "a RoPE scaling factor", &factor, path); !ok) return ok;
    break;
  }
  if (scaling == "linear" && factor != 1.0f) c.rope_freq_scale = 1.0f / factor;
  if (a.gemma) return {};  // llama.cpp's gemma reads no rope_freqs.weight: check_tensors refuses it
  return read_rope_freqs(bytes, f, c, path);
}

/// An integer key, when present, into `*out`: it must be in [min, max_dimension].
expected<void> read_int_key(const gguf_file& f, const std::string& key, int64_t min, int32_t* out,
                            const std::string& path) {
  if (!f.metadata.count(key)) return {};
  auto v = f.get_int(key, path);
  if (!v) return tl::unexpected(v.error());
  if (*v < min || *v > max_dimension)
    return fail(errc::malformed_file, where(path) + key + " = " + std::to_string(*v) + " is out of range (" +
                                          std::to_string(min) + ".." + std::to_string(max_dimension) + ")");
  *out = static_cast<int32_t>(*v);
  return {};
}

/// Gemma's settings (`c`'s shape, RoPE and norm already read), as llama.cpp's
/// src/models/gemma2.cpp and gemma3.cpp read them: every layer scales the embedding by
/// sqrt(dim), gates its FFN by GELU and norms attention's and the FFN's outputs. gemma2 slides a
/// window (attention.sliding_window, 4096 by default) over every other layer, soft-caps scores
/// at attn_logit_softcapping (50) and logits at final_logit_softcapping (30), and turns its
/// sliding layers as its global ones. gemma3 slides only when the file gives a window, over 5
/// layers in 6, caps only logits and only when the file says, and turns sliding layers by base
/// 10000 unscaled. Either's attention.sliding_window_pattern and rope.freq_base_swa override the
/// period and the sliding layers' base. The 27B shapes (gemma2's 46 layers, gemma3's 62) divide
/// scores by sqrt(dim / heads), the others by sqrt(head width).
expected<void> read_gemma(const gguf_file& f, const architecture& a, model_config& c, const std::string& path) {
  const bool gemma2 = a.name == "gemma2";
  c.activation = ffn_activation::gelu;
  c.scale_embedding = c.post_norms = true;
  c.sliding_window = gemma2 ? 4096 : 0;
  c.sliding_period = gemma2 ? 2 : 6;
  if (gemma2) {
    c.attn_softcap = 50.0f;
    c.final_softcap = 30.0f;
    c.rope_freq_base_swa = c.rope_freq_base;
    c.rope_freq_scale_swa = c.rope_freq_scale;
  }
  for (auto ok : {read_int_key(f, key(a, "attention.sliding_window"), gemma2 ? 1 : 0, &c.sliding_window, path),
                  read_int_key(f, key(a, "attention.sliding_window_pattern"), 0, &c.sliding_period, path),
                  read_float_key(f, key(a, "rope.freq_base_swa"), 1, 1e10, "a RoPE frequency base",
                                 &c.rope_freq_base_swa, path),
                  read_float_key(f, key(a, "final_logit_softcapping"), 0, 1e4, "a soft cap", &c.final_softcap, path)})
    if (!ok) return ok;
  if (gemma2)
    if (auto ok = read_float_key(f, key(a, "attn_logit_softcapping"), 0, 1e4, "a soft cap", &c.attn_softcap, path);
        !ok)
      return ok;
  if (c.n_layers == (gemma2 ? 46 : 62)) c.attn_divisor = std::sqrt(static_cast<float>(c.dim / c.n_heads));
  if (gemma2) c.shared_classifier = true;  // llama.cpp's gemma2 classifies by token_embd.weight
  return {};
}

/// A GGUF mixture of experts' counts, as llama.cpp reads them: `<arch>.expert_count` experts per
/// layer (2..moe_experts_max), each row to `expert_used_count` of them (1..expert_count), routed
/// as Mixtral (softmax over the router's logits, the k most probable, their weights renormalized:
/// llama.cpp's llama and qwen3moe both normalize). qwen3moe's experts are
/// `expert_feed_forward_length` wide (default: feed_forward_length / expert_used_count), and it
/// must have experts; a llama file without expert_count is dense. nullopt: dense.
expected<std::optional<moe_weights>> read_moe(const gguf_file& f, const architecture& a, model_config& c,
                                              const std::string& path) {
  const std::string count_key = key(a, "expert_count");
  if (!a.experts || !f.metadata.count(count_key)) {
    if (a.name == "qwen3moe") return fail(errc::malformed_file, where(path) + "no key '" + count_key + "'");
    return std::optional<moe_weights>{};
  }
  moe_weights m;
  if (!f.metadata.count(key(a, "expert_used_count")))
    return fail(errc::malformed_file, where(path) + "no key '" + key(a, "expert_used_count") + "' beside " + count_key);
  for (auto ok : {read_int_key(f, count_key, 2, &m.n_experts, path),
                  read_int_key(f, key(a, "expert_used_count"), 1, &m.top_k, path),
                  read_int_key(f, key(a, "expert_feed_forward_length"), 1, &c.hidden_dim, path)})
    if (!ok) return tl::unexpected(ok.error());
  if (m.n_experts > moe_experts_max)
    return fail(errc::malformed_file, where(path) + count_key + " = " + std::to_string(m.n_experts) +
                                          " is out of range (2.." + std::to_string(moe_experts_max) + ")");
  if (m.top_k > m.n_experts)
    return fail(errc::malformed_file, where(path) + key(a, "expert_used_count") + " = " + std::to_string(m.top_k) +
                                          " is more than expert_count " + std::to_string(m.n_experts));
  if (a.name == "qwen3moe" && !f.metadata.count(key(a, "expert_feed_forward_length")))
    c.hidden_dim = std::max(1, c.hidden_dim / m.top_k);
  m.router = moe::router_kind::top_k;
  return std::optional<moe_weights>{m};
}

/// The `<arch>.*` keys troupe reads or may ignore (vocab_size, the scaling's informational
/// original context; phi3's sliding window, which llama.cpp ignores too); any other would change
/// the model (an MoE's expert counts, ...), and is refused by name rather than ignored.
bool is_known_key(const architecture& a, std::string_view k) {
  static constexpr std::string_view known[] = {
      "context_length",         "embedding_length",        "block_count",
      "feed_forward_length",    "attention.head_count",    "attention.head_count_kv",
      "attention.key_length",   "attention.value_length",  "attention.layer_norm_rms_epsilon",
      "rope.freq_base",         "rope.dimension_count",    "rope.scaling.type",
      "rope.scaling.factor",    "rope.scale_linear",       "rope.scaling.original_context_length",
      "rope.scaling.finetuned", "vocab_size"};
  static constexpr std::string_view gemma[] = {"attention.sliding_window", "attention.sliding_window_pattern",
                                               "rope.freq_base_swa", "final_logit_softcapping",
                                               "attn_logit_softcapping"};  // gemma3 ignores it, as llama.cpp
  const std::string_view suffix = k.substr(a.name.size() + 1);
  if (a.name == "phi3" && suffix == "attention.sliding_window") return true;
  if (a.gemma && std::find(std::begin(gemma), std::end(gemma), suffix) != std::end(gemma)) return true;
  if (a.experts && (suffix == "expert_count" || suffix == "expert_used_count")) return true;
  if (a.name == "qwen3moe" && suffix == "expert_feed_forward_length") return true;
  return std::find(std::begin(known), std::end(known), suffix) != std::end(known);
}

/// The architecture `general.architecture` names, with its keys checked (is_known_key).
expected<const architecture*> read_architecture(const gguf_file& f, const std::string& path) {
  auto name = f.get_string("general.architecture", path);
  if (!name) return tl::unexpected(name.error());
  const architecture* a = std::find_if(std::begin(architectures), std::end(architectures),
                                       [&](const architecture& x) { return x.name == *name; });
  if (a == std::end(architectures))
    return fail(errc::malformed_file, where(path) + "architecture '" + echo(*name) +
                                          "' is not supported (llama, qwen2, qwen3, qwen3moe, phi3, gemma2 and gemma3 are)");
  for (const auto& [k, value] : f.metadata)
    if (k.rfind(key(*a, ""), 0) == 0 && !is_known_key(*a, k))
      return fail(errc::malformed_file, where(path) + "metadata key '" + echo(k) + "' is not supported (troupe's " +
                                            std::string(a->name) + " reads no such key)");
  return a;
}

/// The shape fields of a GGUF model (`<arch>.embedding_length`, ...), its head count of keys
/// and values, and its heads' width (read_head_size).
expected<model_config> read_shape(const gguf_file& f, const architecture& a, const std::string& path) {
  model_config c;
  const std::pair<const char*, int32_t*> fields[] = {
      {"embedding_length", &c.dim},          {"feed_forward_length", &c.hidden_dim},
      {"block_count", &c.n_layers},          {"attention.head_count", &c.n_heads},
      {"context_length", &c.seq_len}};
  for (const auto& [suffix, field] : fields) {
    auto v = f.get_int(key(a, suffix), path);
    if (!v) return tl::unexpected(v.error());
    if (*v <= 0 || *v > max_dimension)
      return fail(errc::malformed_file, where(path) + key(a, suffix) + " = " + std::to_string(*v) +
                                            " is out of range (1.." + std::to_string(max_dimension) + ")");
    *field = static_cast<int32_t>(*v);
  }
  c.n_kv_heads = c.n_heads;
  if (f.metadata.count(key(a, "attention.head_count_kv"))) {
    auto v = f.get_int(key(a, "attention.head_count_kv"), path);
    if (!v) return tl::unexpected(v.error());
    if (*v <= 0 || *v > c.n_heads)
      return fail(errc::malformed_file, where(path) + key(a, "attention.head_count_kv") + " = " +
                                            std::to_string(*v) + " is out of range (1..head_count)");
    c.n_kv_heads = static_cast<int32_t>(*v);
  }
  c.qkv_bias = a.qkv_bias;
  c.qk_norm = a.qk_norm;
  if (auto ok = read_head_size(f, a, c, path); !ok) return tl::unexpected(ok.error());
  return c;
}

/// Rows [first_row, first_row + rows) of a GGUF tensor of `dims` (a row: dims[0] values); all of
/// it when `rows` is 0. A fused tensor (phi3's attn_qkv, ffn_up) is read as several pieces.
struct tensor_piece {
  std::string name;
  std::vector<int64_t> dims;
  int64_t first_row = 0;
  int64_t rows = 0;
  /// Where its float32 values are seen (a per-layer kind's layers lie in a row: layer 0's piece
  /// starts the view), and the matrix of stored_weights it is when read in place.
  const float* weights::*view = nullptr;
  std::vector<kernels::cpu::quant_matrix> stored_weights::*matrix = nullptr;
  int32_t layer = -1;
};

/// The pieces of a GGUF model's tensors in llama2.c's order, then the architecture's extras.
std::vector<tensor_piece> tensor_pieces(const gguf_file& f, const architecture& a, const model_config& c,
                                        const std::optional<moe_weights>& moe) {
  using w = weights;
  using q = stored_weights;
  const int64_t dim = c.dim, hidden = c.hidden_dim, qd = c.q_dim(), kv = c.kv_dim(), vocab = c.vocab_size;
  const bool fused_qkv = a.may_fuse_qkv && f.tensor("blk.0.attn_qkv.weight") != nullptr;
  const std::vector<int64_t> qkv = {dim, qd + 2 * kv}, up = {dim, 2 * hidden};
  const auto part = [](const char* name, std::vector<int64_t> dims, const float* w::*view, int64_t first = 0,
                       int64_t rows = 0) { return tensor_piece{name, std::move(dims), first, rows, view}; };
  const auto matrix = [&](const char* name, std::vector<int64_t> dims, const float* w::*view,
                          std::vector<kernels::cpu::quant_matrix> q::*m, int64_t first = 0, int64_t rows = 0) {
    tensor_piece p = part(name, std::move(dims), view, first, rows);
    p.matrix = m;
    return p;
  };
  std::vector<tensor_piece> per_layer = {
      part("attn_norm.weight", {dim}, &w::rms_att),
      fused_qkv ? matrix("attn_qkv.weight", qkv, &w::wq, &q::wq, 0, qd) : matrix("attn_q.weight", {dim, qd}, &w::wq, &q::wq),
      fused_qkv ? matrix("attn_qkv.weight", qkv, &w::wk, &q::wk, qd, kv) : matrix("attn_k.weight", {dim, kv}, &w::wk, &q::wk),
      fused_qkv ? matrix("attn_qkv.weight", qkv, &w::wv, &q::wv, qd + kv, kv)
                : matrix("attn_v.weight", {dim, kv}, &w::wv, &q::wv),
      matrix("attn_output.weight", {qd, dim}, &w::wo, &q::wo),
      part("ffn_norm.weight", {dim}, &w::rms_ffn)};
  if (moe)
    per_layer.push_back(part("ffn_gate_inp.weight", {dim, moe->n_experts}, &w::router));
  else
    per_layer.insert(per_layer.end(), {a.fused_ffn_up ? matrix("ffn_up.weight", up, &w::w1, &q::w1, 0, hidden)
                                                      : matrix("ffn_gate.weight", {dim, hidden}, &w::w1, &q::w1),
                                       matrix("ffn_down.weight", {hidden, dim}, &w::w2, &q::w2),
                                       a.fused_ffn_up ? matrix("ffn_up.weight", up, &w::w3, &q::w3, hidden, hidden)
                                                      : matrix("ffn_up.weight", {dim, hidden}, &w::w3, &q::w3)});
  std::vector<tensor_piece> extras;
  if (a.qkv_bias)
    extras = {part("attn_q.bias", {qd}, &w::bq), part("attn_k.bias", {kv}, &w::bk), part("attn_v.bias", {kv}, &w::bv)};
  if (a.qk_norm)
    extras.insert(extras.end(), {part("attn_q_norm.weight", {c.head_size()}, &w::q_norm),
                                 part("attn_k_norm.weight", {c.head_size()}, &w::k_norm)});
  if (c.post_norms)
    extras.insert(extras.end(), {part("post_attention_norm.weight", {dim}, &w::rms_att_post),
                                 part("post_ffw_norm.weight", {dim}, &w::rms_ffn_post)});
  const auto add_layers = [&](std::vector<tensor_piece>& out, const std::vector<tensor_piece>& kinds) {
    for (const tensor_piece& k : kinds)
      for (int32_t l = 0; l < c.n_layers; l++) {
        out.push_back(k);
        out.back().name = "blk." + std::to_string(l) + "." + k.name;
        out.back().layer = l;
      }
  };
  std::vector<tensor_piece> out = {part("token_embd.weight", {dim, vocab}, &w::token_embedding)};
  add_layers(out, per_layer);
  // A mixture's experts: each (layer, expert) a row range of its layer's 3-D tensor, in that
  // order (a float32 model's expert matrices then lie as moe_weights' (layer, expert, ...)).
  if (moe) {
    const int64_t n = moe->n_experts;
    const tensor_piece kinds[] = {matrix("ffn_gate_exps.weight", {dim, hidden, n}, &w::w1, &q::w1, 0, hidden),
                                  matrix("ffn_down_exps.weight", {hidden, dim, n}, &w::w2, &q::w2, 0, dim),
                                  matrix("ffn_up_exps.weight", {dim, hidden, n}, &w::w3, &q::w3, 0, hidden)};
    for (const tensor_piece& k : kinds)
      for (int32_t l = 0; l < c.n_layers; l++)
        for (int32_t e = 0; e < n; e++) {
          out.push_back(k);
          out.back().name = "blk." + std::to_string(l) + "." + k.name;
          out.back().first_row = e * k.rows;
          out.back().layer = static_cast<int32_t>(l * n + e);  // its view starts at (0, 0)'s
        }
  }
  out.push_back(part("output_norm.weight", {dim}, &w::rms_final));
  if (!c.shared_classifier) out.push_back(part("output.weight", {dim, vocab}, &w::wcls));
  add_layers(out, extras);
  return out;
}

/// Refuses a file whose tensors are not exactly `pieces`' (and rope_freqs.weight, read by
/// read_rope_freqs), in the shapes they say, before any is dequantized.
expected<void> check_tensors(const gguf_file& f, const architecture& a, const std::vector<tensor_piece>& pieces,
                             const std::string& path) {
  std::set<std::string_view> names;
  if (!a.gemma) names.insert("rope_freqs.weight");  // llama.cpp's gemma reads no such tensor
  for (const tensor_piece& p : pieces) names.insert(p.name);
  for (const gguf_tensor& t : f.tensors)
    if (!names.count(t.name))
      return fail(errc::malformed_file, where(path) + "tensor '" + echo(t.name) + "' is not supported (troupe's " +
                                            std::string(a.name) + " reads no such tensor)");
  for (const tensor_piece& p : pieces) {
    const gguf_tensor* t = f.tensor(p.name);
    if (!t) return fail(errc::malformed_file, where(path) + "no tensor '" + p.name + "'");
    if (t->dims != p.dims) {
      std::string want, got;
      for (int64_t d : p.dims) want += (want.empty() ? "" : ", ") + std::to_string(d);
      for (int64_t d : t->dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
      return fail(errc::malformed_file, where(path) + "tensor '" + p.name + "' has shape [" + got + "], expected [" +
                                            want + "] for this model's metadata");
    }
  }
  return {};
}

/// A GGUF model's weights as troupe holds them: float32 views into `floats` (converted), and the
/// matrices in place in the file, in their own types (`stored`; the vectors are converted still),
/// unless an all-F32 file was asked for as float32 views (load_options::float32_views).
struct gguf_weights {
  std::string architecture;
  model_config config;
  std::vector<float> floats;
  weights views;
  std::optional<stored_weights> stored;
  std::optional<moe_weights> moe;
};

/// Whether `p` is the classifier: output.weight, or token_embd.weight when it is shared.
bool is_classifier(const tensor_piece& p, const model_config& c) {
  return p.view == &weights::wcls || (c.shared_classifier && p.view == &weights::token_embedding);
}

/// Reads `pieces` (checked by check_tensors) into `out`: the matrices in place and the other
/// pieces as float32, or, with `float32_views` and every matrix (the embedding and the classifier
/// too) F32, all of them as float32. Then the views.
void read_pieces(std::string_view bytes, const gguf_file& f, const std::vector<tensor_piece>& pieces,
                 bool float32_views, gguf_weights& out) {
  const model_config& c = out.config;
  const auto is_matrix = [&](const tensor_piece& p) {
    return p.matrix != nullptr || is_classifier(p, c) || p.view == &weights::token_embedding;
  };
  const bool in_place = !float32_views || std::any_of(pieces.begin(), pieces.end(), [&](const tensor_piece& p) {
    return is_matrix(p) && f.tensor(p.name)->type != ggml_type::f32;
  });
  const auto rows = [&](const tensor_piece& p) { return p.rows == 0 ? f.tensor(p.name)->num_elements() / p.dims[0] : p.rows; };
  const auto as_floats = [&](const tensor_piece& p) { return !in_place || !is_matrix(p); };
  int64_t num_floats = 0;
  for (const tensor_piece& p : pieces)
    if (as_floats(p)) num_floats += rows(p) * p.dims[0];
  out.floats.reserve(static_cast<size_t>(num_floats));
  std::vector<size_t> starts;  // each piece's in floats
  for (const tensor_piece& p : pieces) {
    starts.push_back(out.floats.size());
    if (!as_floats(p)) continue;
    const std::vector<float> v = tensor_floats(bytes, f, *f.tensor(p.name));
    const auto first = v.begin() + p.first_row * p.dims[0];
    out.floats.insert(out.floats.end(), first, first + rows(p) * p.dims[0]);
  }
  if (in_place) out.stored.emplace();
  for (size_t i = 0; i < pieces.size(); i++) {
    const tensor_piece& p = pieces[i];
    if (as_floats(p) && p.layer <= 0) out.views.*p.view = out.floats.data() + starts[i];
    if (as_floats(p)) continue;
    const gguf_tensor& t = *f.tensor(p.name);
    const kernels::cpu::quant_matrix m{tensor_data(bytes, f, t) + p.first_row * kernels::cpu::row_bytes(t.type, p.dims[0]),
                                       t.type, static_cast<int32_t>(rows(p)), static_cast<int32_t>(p.dims[0])};
    if (p.matrix != nullptr) ((*out.stored).*p.matrix).push_back(m);
    if (is_classifier(p, c)) out.stored->wcls = m;
    if (p.view == &weights::token_embedding) out.stored->token_embedding = m;
  }
  if (!in_place && c.shared_classifier) out.views.wcls = out.views.token_embedding;
}

/// A GGUF model's shape and its weights (gguf_weights), with its RoPE and RMS-norm settings
/// (read_rope_and_norm). Refuses what troupe's transformer would compute differently: another
/// architecture, RoPE over part of a head, a scaling type other than none, linear or Llama 3's,
/// an `<arch>.*` key or a tensor it does not read.
expected<gguf_weights> from_gguf(std::string_view bytes, const std::string& path, bool float32_views) {
  auto f = parse_gguf(bytes, path);
  if (!f) return tl::unexpected(f.error());
  auto arch = read_architecture(*f, path);
  if (!arch) return tl::unexpected(arch.error());
  const architecture& a = **arch;
  auto shape = read_shape(*f, a, path);
  if (!shape) return tl::unexpected(shape.error());
  model_config& c = *shape;
  if (auto ok = read_rope_and_norm(bytes, *f, a, c, path); !ok) return tl::unexpected(ok.error());
  const gguf_tensor* embedding = f->tensor("token_embd.weight");
  if (!embedding || embedding->dims.size() != 2)
    return fail(errc::malformed_file, where(path) + "no 2-D tensor 'token_embd.weight'");
  if (embedding->dims[1] > max_dimension)
    return fail(errc::malformed_file, where(path) + "a vocabulary of " + std::to_string(embedding->dims[1]) +
                                          " tokens is out of range");
  c.vocab_size = static_cast<int32_t>(embedding->dims[1]);
  c.shared_classifier = f->tensor("output.weight") == nullptr;
  if (a.gemma)
    if (auto ok = read_gemma(*f, a, c, path); !ok) return tl::unexpected(ok.error());
  auto moe = read_moe(*f, a, c, path);
  if (!moe) return tl::unexpected(moe.error());

  // Each weight takes at least half a byte of the file (Q4_0's and Q4_K's 4.5 bits): more than
  // its size can hold cannot be there; reserving for it first would allocate what the header
  // claims.
  const std::optional<int64_t> floats = num_weight_floats(c, *moe ? (*moe)->n_experts : 0);
  if (!floats || *floats / 2 > static_cast<int64_t>(bytes.size()))
    return fail(errc::malformed_file, where(path) + "its metadata (dim " + std::to_string(c.dim) + ", " +
                                          std::to_string(c.n_layers) + " layers, feed_forward_length " +
                                          std::to_string(c.hidden_dim) + ") implies more weights than its " +
                                          std::to_string(bytes.size()) + " bytes can hold");
  const std::vector<tensor_piece> pieces = tensor_pieces(*f, a, c, *moe);
  if (auto ok = check_tensors(*f, a, pieces, path); !ok) return tl::unexpected(ok.error());
  gguf_weights out;
  out.architecture = a.name;
  out.config = c;
  read_pieces(bytes, *f, pieces, float32_views, out);
  if (*moe) {  // the experts' views were the FFN's: an MoE's weights have no w1, w2, w3
    moe_weights& m = out.moe.emplace(**moe);
    m.router_weight = out.views.router;
    std::tie(m.w1, m.w2, m.w3) = std::tie(out.views.w1, out.views.w2, out.views.w3);
    out.views.w1 = out.views.w2 = out.views.w3 = nullptr;
  }
  return out;
}

}  // namespace

namespace {

/// The shape in a header's 7 int32 fields (llama2.c's order); a negative vocab_size means an
/// unshared classifier where `negative_vocab_unshares` (the legacy format), an error otherwise.
expected<model_config> header_config(const int32_t (&h)[7], bool negative_vocab_unshares, const std::string& path) {
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads",
                          "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; i++) {
    const int64_t v = i == 5 && negative_vocab_unshares ? std::abs(static_cast<int64_t>(h[i])) : h[i];
    if (v <= 0 || v > max_dimension)
      return fail(errc::malformed_file, where(path) + "header field " + names[i] + " = " +
                                            std::to_string(h[i]) + " is out of range (1.." +
                                            std::to_string(max_dimension) + ")");
  }
  model_config c;  // RoPE and RMS norm: llama2.c's defaults
  std::tie(c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads) = std::tie(h[0], h[1], h[2], h[3], h[4]);
  c.vocab_size = std::abs(h[5]);
  c.seq_len = h[6];
  c.shared_classifier = h[5] > 0;
  if (auto ok = check_shape(c, path); !ok) return tl::unexpected(ok.error());
  return c;
}

/// Whether a file of `file_size` bytes has the `expected_size` its header implies (nullopt:
/// the header's sizes overflow int64, which no file matches).
expected<void> check_file_size(const model_config& c, int64_t file_size, std::optional<int64_t> expected_size,
                               const std::string& path) {
  if (expected_size == file_size) return {};
  const std::string shape = "its header (dim " + std::to_string(c.dim) + ", " + std::to_string(c.n_layers) +
                            " layers, hidden_dim " + std::to_string(c.hidden_dim) + ", vocab " +
                            std::to_string(c.vocab_size) + ") implies ";
  if (!expected_size)
    return fail(errc::malformed_file, where(path) + "size is " + std::to_string(file_size) + " bytes but " + shape +
                                          "more than 2^63 bytes (a crafted or corrupt header)");
  return fail(errc::malformed_file,
              where(path) + "size is " + std::to_string(file_size) + " bytes but " + shape +
                  std::to_string(*expected_size) + (file_size < *expected_size ? " (truncated?)" : " (trailing data?)"));
}

/// Bytes of one Q8_0 tensor of `count` values: the int8 values, then a float scale per group.
int64_t q80_tensor_bytes(int64_t count, int32_t group_size) { return count + count / group_size * 4; }

/// The Q8_0 matrices of a version-2 file in file order: name, number of them (1 or n_layers),
/// rows and columns of each.
struct q80_tensor_kind {
  const char* name;
  std::vector<kernels::cpu::q80_matrix> q80_weights::*per_layer;  // nullptr: one tensor
  int64_t count;
  int32_t d;
  int32_t n;
};

std::vector<q80_tensor_kind> q80_tensor_kinds(const model_config& c) {
  std::vector<q80_tensor_kind> kinds = {
      {"token_embedding", nullptr, 1, c.vocab_size, c.dim},
      {"wq", &q80_weights::wq, c.n_layers, c.q_dim(), c.dim},
      {"wk", &q80_weights::wk, c.n_layers, c.kv_dim(), c.dim},
      {"wv", &q80_weights::wv, c.n_layers, c.kv_dim(), c.dim},
      {"wo", &q80_weights::wo, c.n_layers, c.dim, c.q_dim()},
      {"w1", &q80_weights::w1, c.n_layers, c.hidden_dim, c.dim},
      {"w2", &q80_weights::w2, c.n_layers, c.dim, c.hidden_dim},
      {"w3", &q80_weights::w3, c.n_layers, c.hidden_dim, c.dim}};
  if (!c.shared_classifier) kinds.push_back({"wcls", nullptr, 1, c.vocab_size, c.dim});
  return kinds;
}

/// Bytes of a version-2 file for `c`; nullopt where the count overflows int64.
std::optional<int64_t> q80_file_bytes(const model_config& c, int32_t group_size) {
  checked_count n;
  n.add({q80_header_bytes}).add({4, 2, c.n_layers, c.dim}).add({4, c.dim});  // the header, the norms
  for (const q80_tensor_kind& k : q80_tensor_kinds(c))  // d * n <= 2^40: one tensor's bytes fit
    n.add({k.count, q80_tensor_bytes(static_cast<int64_t>(k.d) * k.n, group_size)});
  return n.value();
}

}  // namespace

expected<model_config> parse_header(const int32_t (&h)[7], int64_t file_size,
                                    const std::string& path) {
  auto c = header_config(h, true, path);
  if (!c) return c;
  if (auto ok = check_file_size(*c, file_size, float_file_bytes(header_bytes, num_weight_floats(*c)), path); !ok)
    return tl::unexpected(ok.error());
  return c;
}

expected<std::pair<model_config, int32_t>> parse_q80_header(std::string_view bytes, const std::string& path) {
  TROUPE_ASSERT(bytes.size() >= static_cast<size_t>(q80_header_bytes));
  int32_t version = 0, h[7], group_size = 0;
  std::memcpy(&version, bytes.data() + 4, sizeof version);
  if (version != 2)
    return fail(errc::malformed_file, where(path) + "llama2.c checkpoint version " + std::to_string(version) +
                                          " is not supported (troupe reads the legacy format and version 2, Q8_0)");
  std::memcpy(h, bytes.data() + 8, sizeof h);
  auto c = header_config(h, false, path);
  if (!c) return tl::unexpected(c.error());
  const auto shared = static_cast<uint8_t>(bytes[36]);
  if (shared > 1)
    return fail(errc::malformed_file, where(path) + "shared_classifier byte is " + std::to_string(shared) +
                                          " (0 or 1)");
  c->shared_classifier = shared == 1;
  std::memcpy(&group_size, bytes.data() + 37, sizeof group_size);  // unaligned, as export.py packs it
  if (group_size <= 0 || c->dim % group_size != 0 || c->hidden_dim % group_size != 0)
    return fail(errc::malformed_file, where(path) + "group size " + std::to_string(group_size) +
                                          " does not divide dim " + std::to_string(c->dim) + " and hidden_dim " +
                                          std::to_string(c->hidden_dim));
  if (auto ok = check_file_size(*c, static_cast<int64_t>(bytes.size()), q80_file_bytes(*c, group_size), path); !ok)
    return tl::unexpected(ok.error());
  return std::make_pair(*c, group_size);
}

expected<std::pair<model_config, moe_weights>> parse_moe_header(std::string_view bytes, const std::string& path) {
  TROUPE_ASSERT(bytes.size() >= static_cast<size_t>(moe_header_bytes));
  int32_t f[12];  // version, the 7 shape fields, shared_classifier, n_experts, top_k, router
  std::memcpy(f, bytes.data() + 4, sizeof f);
  if (f[0] != moe_version)
    return fail(errc::malformed_file, where(path) + "MoE checkpoint version " + std::to_string(f[0]) +
                                          " is not supported (troupe reads version " + std::to_string(moe_version) + ")");
  int32_t h[7];
  std::copy_n(f + 1, 7, h);
  auto c = header_config(h, false, path);
  if (!c) return tl::unexpected(c.error());
  const auto out_of_range = [&path](const char* field, int32_t value, const std::string& range) {
    return fail(errc::malformed_file, where(path) + "header field " + field + " = " + std::to_string(value) +
                                          " is out of range (" + range + ")");
  };
  if (f[8] != 0 && f[8] != 1) return out_of_range("shared_classifier", f[8], "0 or 1");
  c->shared_classifier = f[8] == 1;
  moe_weights m;
  m.n_experts = f[9];
  if (m.n_experts < 1 || m.n_experts > moe_experts_max)
    return out_of_range("n_experts", m.n_experts, "1.." + std::to_string(moe_experts_max));
  if (static_cast<int64_t>(m.n_experts) * c->hidden_dim > max_dimension)
    return fail(errc::malformed_file, where(path) + std::to_string(m.n_experts) + " experts of hidden_dim " +
                                          std::to_string(c->hidden_dim) + " exceed " + std::to_string(max_dimension) +
                                          " hidden units per layer");
  m.top_k = f[10];
  if (m.top_k < 1 || m.top_k > m.n_experts) return out_of_range("top_k", m.top_k, "1..n_experts");
  if (f[11] != 0 && f[11] != 1) return out_of_range("router", f[11], "0 = top_k or 1 = all");
  m.router = static_cast<moe::router_kind>(f[11]);
  if (m.router == moe::router_kind::all && m.top_k != m.n_experts)
    return fail(errc::malformed_file, where(path) + "router 'all' with top_k " + std::to_string(m.top_k) +
                                          " of " + std::to_string(m.n_experts) + " experts (it routes to every expert)");
  constexpr size_t used = 4 + sizeof f;
  for (size_t i = used; i < static_cast<size_t>(moe_header_bytes); i++)
    if (bytes[i] != 0)
      return fail(errc::malformed_file, where(path) + "header byte " + std::to_string(i) + " is not zero (bytes " +
                                            std::to_string(used) + ".." + std::to_string(moe_header_bytes - 1) +
                                            " are reserved)");
  const std::optional<int64_t> size = float_file_bytes(moe_header_bytes, num_weight_floats(*c, m.n_experts));
  if (auto ok = check_file_size(*c, static_cast<int64_t>(bytes.size()), size, path); !ok)
    return tl::unexpected(ok.error());
  return std::make_pair(*c, m);
}

std::string describe(const checkpoint& ck, int64_t resident_bytes) {
  const model_config& c = ck.config();
  // Parameters by the type they are computed in: the matrices', and the vectors' float32.
  std::map<std::string, int64_t> by_type;
  const int64_t layers = c.n_layers, dim = c.dim, experts = ck.moe() ? ck.moe()->n_experts : 1;
  const int64_t matrices = layers * (int64_t{c.q_dim()} * dim * 2 + int64_t{c.kv_dim()} * dim * 2 +
                                     3 * dim * c.hidden_dim * experts) +
                           int64_t{c.vocab_size} * dim * (c.shared_classifier ? 1 : 2);
  if (const stored_weights* g = ck.stored()) {
    const auto add = [&](const kernels::cpu::quant_matrix& m) { by_type[kernels::cpu::type_name(m.type)] += int64_t{m.d} * m.n; };
    add(g->token_embedding);
    if (!c.shared_classifier) add(g->wcls);
    for (const auto* kind : {&g->wq, &g->wk, &g->wv, &g->wo, &g->w1, &g->w2, &g->w3})
      for (const kernels::cpu::quant_matrix& m : *kind) add(m);
  } else {
    by_type[ck.q80() ? "Q8_0" : "F32"] += matrices;
  }
  int64_t vectors = layers * dim * 2 + dim + (c.qkv_bias ? layers * (c.q_dim() + 2 * int64_t{c.kv_dim()}) : 0) +
                    (c.qk_norm ? layers * 2 * c.head_size() : 0) + (c.post_norms ? layers * 2 * dim : 0);
  if (const moe_weights* m = ck.moe()) vectors += layers * m->n_experts * (dim + 1);  // the router
  by_type["F32"] += vectors;
  int64_t total = 0;
  for (const auto& [type, n] : by_type) total += n;
  std::vector<std::pair<int64_t, std::string>> shares;
  for (const auto& [type, n] : by_type) shares.emplace_back(-n, type);
  std::sort(shares.begin(), shares.end());
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, total >= 1'000'000'000 ? "%.2f B" : "%.1f M",
                static_cast<double>(total) / (total >= 1'000'000'000 ? 1e9 : 1e6));
  std::string out = ck.architecture() + (ck.moe() ? " (mixture of experts)" : "") + ", " + buffer + " parameters (";
  for (size_t i = 0; i < shares.size(); i++) {
    const double percent = -100.0 * static_cast<double>(shares[i].first) / static_cast<double>(total);
    std::snprintf(buffer, sizeof buffer, percent < 1 ? "%.1f%%" : "%.0f%%", percent);
    out += (i ? ", " : "") + shares[i].second + " " + buffer;
  }
  std::snprintf(buffer, sizeof buffer, "%.1f MiB", static_cast<double>(resident_bytes) / (1 << 20));
  return out + "), " + buffer + " of weights resident";
}

expected<void> require_llama2c(const checkpoint& ck, const std::string& what) {
  if (const stored_weights* g = ck.stored())
    return fail(errc::invalid_argument, "model file '" + ck.path() + "' stores its matrices as " +
                                            kernels::cpu::type_name(g->wq.front().type) + " (or a mix of types); " +
                                            what + " reads float32 models: give it an F32 GGUF file");
  if (ck.config().is_llama2c()) return {};
  return fail(errc::invalid_argument, "model file '" + ck.path() + "' computes what a llama2.c-format file cannot " +
                                          "hold (its RoPE, RMS epsilon, head width, biases or norms); " + what +
                                          " writes llama2.c-format models");
}

namespace {

/// Whether `count` 16-bit floats at `p` (stride `stride` bytes) are all finite: F16's exponent
/// bits are `f16_exponent`, BF16's `bf16_exponent`.
bool halves_finite(const uint8_t* p, int64_t count, int64_t stride, uint16_t exponent) {
  for (int64_t i = 0; i < count; i++, p += stride) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    if ((h & exponent) == exponent) return false;
  }
  return true;
}
constexpr uint16_t f16_exponent = 0x7c00, bf16_exponent = 0x7f80;

/// Whether row `r` of `m` holds only finite values: its floats, or its blocks' f16 scales (a
/// block's other fields are integers).
bool row_finite(const kernels::cpu::quant_matrix& m, int64_t r) {
  using kernels::cpu::weight_type;
  std::vector<uint8_t> copy;  // of a row not laid out as ggml's
  if (m.layout != kernels::cpu::matrix_layout::rows) {
    copy.resize(static_cast<size_t>(kernels::cpu::row_bytes(m.type, m.n)));
    kernels::cpu::copy_row(m, r, copy.data());
  }
  const uint8_t* row = copy.empty() ? m.row(r) : copy.data();
  const int64_t blocks = m.n / kernels::cpu::block_elements(m.type), size = kernels::cpu::block_bytes(m.type);
  switch (m.type) {
    case weight_type::f32:
      return first_non_finite(reinterpret_cast<const float*>(row), m.n) < 0;
    case weight_type::f16: return halves_finite(row, m.n, 2, f16_exponent);
    case weight_type::bf16: return halves_finite(row, m.n, 2, bf16_exponent);
    case weight_type::q8_0: case weight_type::q4_0: return halves_finite(row, blocks, size, f16_exponent);
    case weight_type::q4_k: case weight_type::q5_k:  // d and dmin
      return halves_finite(row, blocks, size, f16_exponent) && halves_finite(row + 2, blocks, size, f16_exponent);
    case weight_type::q6_k: return halves_finite(row + 208, blocks, size, f16_exponent);  // d, after the quants
    case weight_type::q8_k: break;
  }
  TROUPE_ASSERT_MSG(false, "Q8_K weights are never loaded");
  return false;
}

/// check_finite for the matrices of a GGUF model read in place: the first row holding a NaN or an
/// infinity, by tensor, layer and row.
expected<void> check_stored_finite(const stored_weights& g, const model_config& c, const std::string& path,
                                   bool laid_out_checked) {
  std::vector<std::pair<const char*, const std::vector<kernels::cpu::quant_matrix>*>> kinds = {
      {"wq", &g.wq}, {"wk", &g.wk}, {"wv", &g.wv}, {"wo", &g.wo}, {"w1", &g.w1}, {"w2", &g.w2}, {"w3", &g.w3}};
  const std::vector<kernels::cpu::quant_matrix> embedding = {g.token_embedding}, classifier = {g.wcls};
  kinds.insert(kinds.begin(), {"token_embedding", &embedding});
  if (!c.shared_classifier) kinds.push_back({"wcls", &classifier});
  for (const auto& [name, matrices] : kinds)
    for (size_t l = 0; l < matrices->size(); l++) {
      const kernels::cpu::quant_matrix& m = (*matrices)[l];
      if (laid_out_checked && m.layout == kernels::cpu::matrix_layout::rows16) continue;
      for (int64_t r = 0; r < m.d; r++) {
        if (row_finite(m, r)) continue;
        const bool per_layer = matrices != &embedding && matrices != &classifier;
        const size_t experts = matrices->size() / static_cast<size_t>(c.n_layers);  // an MoE's w1, w2, w3: > 1
        const std::string layer = !per_layer   ? ""
                                  : experts > 1 ? "layer " + std::to_string(l / experts) + ", expert " +
                                                      std::to_string(l % experts) + ", "
                                                : "layer " + std::to_string(l) + ", ";
        return fail(errc::malformed_file, where(path) + "weight tensor " + name + " (" + kernels::cpu::type_name(m.type) +
                                              ") holds NaN or an infinity (" + layer + "row " + std::to_string(r) +
                                              "); the file is corrupt or the model diverged");
      }
    }
  return {};
}

}  // namespace

expected<void> check_finite(const checkpoint& ck, bool laid_out_checked) {
  const model_config& c = ck.config();
  const weights& w = ck.w();
  const int64_t dim = c.dim, layers = c.n_layers, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  std::vector<tensor_view> tensors = {
      {"token_embedding", w.token_embedding, 0, c.vocab_size * dim},
      {"rms_att", w.rms_att, layers, dim},
      {"rms_ffn", w.rms_ffn, layers, dim},
      {"rms_final", w.rms_final, 0, dim},
  };
  if (c.qkv_bias)
    tensors.insert(tensors.end(),
                   {{"bq", w.bq, layers, c.q_dim()}, {"bk", w.bk, layers, kv_dim}, {"bv", w.bv, layers, kv_dim}});
  if (c.qk_norm)
    tensors.insert(tensors.end(),
                   {{"q_norm", w.q_norm, layers, c.head_size()}, {"k_norm", w.k_norm, layers, c.head_size()}});
  if (c.post_norms)
    tensors.insert(tensors.end(), {{"rms_att_post", w.rms_att_post, layers, dim}, {"rms_ffn_post", w.rms_ffn_post, layers, dim}});
  if (const moe_weights* m = ck.moe()) {  // the router is float32 in every format
    tensors.push_back({"router_weight", m->router_weight, layers, m->n_experts * dim});
    if (m->router_bias != nullptr) tensors.push_back({"router_bias", m->router_bias, layers, m->n_experts});
  }
  if (const q80_weights* q = ck.q80()) {  // int8 values are finite: check the scales
    for (const q80_tensor_kind& k : q80_tensor_kinds(c)) {
      if (k.per_layer == nullptr) continue;  // the embedding is checked dequantized
      const auto& first = ((*q).*k.per_layer).front();
      tensors.push_back({k.name, first.s, layers, static_cast<int64_t>(k.d) * k.n / q->group_size});
    }
    if (!c.shared_classifier) tensors.push_back({"wcls", q->wcls.s, 0, c.vocab_size * dim / q->group_size});
  } else if (const stored_weights* g = ck.stored()) {
    tensors.erase(tensors.begin());  // the embedding is one of the matrices here
    if (auto ok = check_stored_finite(*g, c, ck.path(), laid_out_checked); !ok) return ok;
  } else {
    const int64_t q_dim = c.q_dim();
    tensors.insert(tensors.end(), {{"wq", w.wq, layers, q_dim * dim},
                                   {"wk", w.wk, layers, kv_dim * dim},
                                   {"wv", w.wv, layers, kv_dim * dim},
                                   {"wo", w.wo, layers, dim * q_dim}});
    if (const moe_weights* m = ck.moe()) {
      const int64_t experts = m->n_experts;
      tensors.insert(tensors.end(), {{"w1", m->w1, layers, experts * hidden * dim},
                                     {"w2", m->w2, layers, experts * dim * hidden},
                                     {"w3", m->w3, layers, experts * hidden * dim}});
    } else {
      tensors.insert(tensors.end(), {{"w1", w.w1, layers, hidden * dim},
                                     {"w2", w.w2, layers, dim * hidden},
                                     {"w3", w.w3, layers, hidden * dim}});
    }
    if (!c.shared_classifier) tensors.push_back({"wcls", w.wcls, 0, c.vocab_size * dim});
  }
  for (const tensor_view& t : tensors) {
    const int64_t count = std::max<int64_t>(t.num_layers, 1) * t.layer_size;
    const int64_t i = first_non_finite(t.data, count);
    if (i < 0) continue;
    const float v = t.data[i];
    const std::string value = std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
    const std::string at = t.num_layers > 0 ? "layer " + std::to_string(i / t.layer_size) + ", element " +
                                                  std::to_string(i % t.layer_size)
                                            : "element " + std::to_string(i);
    return fail(errc::malformed_file, where(ck.path()) + "weight tensor " + t.name + (ck.q80() ? " (scales)" : "") +
                                          " holds " + value + " (" + at + "); the file is corrupt or the model diverged");
  }
  return {};
}

namespace {

/// Views of a version-2 file (`bytes`, already validated by parse_q80_header): the norms in
/// place, the matrices into `q` with their scales copied into `scales` (a tensor's int8 values
/// need not leave its scales float-aligned), the token embedding dequantized into `embedding`
/// as runq.c does: x[i] = q[i] * s[i / group_size].
weights q80_views(const model_config& c, int32_t group_size, std::string_view bytes, q80_weights& q,
                  std::vector<float>& scales, std::vector<float>& embedding) {
  const char* p = bytes.data() + q80_header_bytes;
  const auto floats = [&p](int64_t count) {
    const auto* f = reinterpret_cast<const float*>(p);
    p += count * 4;
    return f;
  };
  weights w;
  w.rms_att = floats(static_cast<int64_t>(c.n_layers) * c.dim);
  w.rms_ffn = floats(static_cast<int64_t>(c.n_layers) * c.dim);
  w.rms_final = floats(c.dim);
  q.group_size = group_size;
  const std::vector<q80_tensor_kind> kinds = q80_tensor_kinds(c);
  int64_t num_scales = 0;
  for (const q80_tensor_kind& k : kinds) num_scales += k.count * k.d * k.n / group_size;
  scales.resize(static_cast<size_t>(num_scales));
  float* s = scales.data();
  for (const q80_tensor_kind& k : kinds) {
    for (int64_t l = 0; l < k.count; l++) {
      const int64_t values = static_cast<int64_t>(k.d) * k.n, groups = values / group_size;
      const kernels::cpu::q80_matrix m{reinterpret_cast<const int8_t*>(p), s, k.d, k.n, group_size};
      std::memcpy(s, p + values, static_cast<size_t>(groups) * 4);
      p += q80_tensor_bytes(values, group_size);
      s += groups;
      if (k.per_layer != nullptr)
        (q.*k.per_layer).push_back(m);
      else if (k.name == std::string_view("wcls"))
        q.wcls = m;
      else
        q.token_embedding = m;
    }
  }
  TROUPE_ASSERT(p == bytes.data() + bytes.size());
  if (c.shared_classifier) q.wcls = q.token_embedding;
  const int64_t num_values = static_cast<int64_t>(c.vocab_size) * c.dim;
  embedding.resize(static_cast<size_t>(num_values));
  for (int64_t i = 0; i < num_values; i++)
    embedding[static_cast<size_t>(i)] = q.token_embedding.q[i] * q.token_embedding.s[i / group_size];
  w.token_embedding = embedding.data();
  return w;
}

}  // namespace

expected<model_header> read_header(const std::string& path) {
  auto file = mapped_file::open(path);
  if (!file) return fail(errc::io_error, where(path) + "cannot open: " + file.error().message);
  const std::string_view bytes = file->bytes();
  model_header out;
  out.file_bytes = static_cast<int64_t>(bytes.size());
  if (is_gguf(bytes)) {
    auto f = parse_gguf(bytes, path);
    if (!f) return tl::unexpected(f.error());
    auto arch = read_architecture(*f, path);
    if (!arch) return tl::unexpected(arch.error());
    auto shape = read_shape(*f, **arch, path);
    if (!shape) return tl::unexpected(shape.error());
    out.config = *shape;
    out.float32 = std::all_of(f->tensors.begin(), f->tensors.end(),
                              [](const gguf_tensor& t) { return t.type == ggml_type::f32; });
    return out;
  }
  // The llama2.c formats are mapped in place (a Q8_0 file's scales aside): loading reads nothing.
  load_options header_only;
  header_only.check_finite = false;
  header_only.prefault = false;
  auto ck = checkpoint::load(path, header_only);
  if (!ck) return tl::unexpected(ck.error());
  out.config = ck->config();
  return out;
}

/// The matrices laid out for the kernels (those fast::takes_rows16, in a multiple of 16 rows),
/// each one's offset in the copy, the copy's size, and a description of them for the layout
/// cache's key (each one's place in the file and shape).
struct checkpoint::layout_plan {
  std::vector<kernels::cpu::quant_matrix*> matrices;
  std::vector<int64_t> starts;
  int64_t total = 0;
  bool tied = false;  // the classifier is the token embedding: read by copy_row once laid out
  std::string description;

  /// Points the matrices at their copy in `data`.
  void use(stored_weights& g, const uint8_t* data) const {
    for (size_t i = 0; i < matrices.size(); i++) {
      matrices[i]->data = data + starts[i];
      matrices[i]->layout = kernels::cpu::matrix_layout::rows16;
    }
    if (tied) g.token_embedding = g.wcls;
  }
};

checkpoint::layout_plan checkpoint::plan_layout(mapping& map) {
  namespace cpu = kernels::cpu;
  stored_weights& g = *map.stored;
  layout_plan plan;
  const auto take = [&](cpu::quant_matrix& m) {
    if (!cpu::fast::takes_rows16(m.type) || m.layout != cpu::matrix_layout::rows || m.d % 16 != 0) return;
    plan.matrices.push_back(&m);
    plan.starts.push_back(plan.total);
    plan.total += int64_t{m.d} * cpu::row_bytes(m.type, m.n);
    const int64_t place[] = {m.data - reinterpret_cast<const uint8_t*>(map.file->bytes().data()),
                             static_cast<int64_t>(m.type), m.d, m.n};
    plan.description.append(reinterpret_cast<const char*>(place), sizeof place);
  };
  for (std::vector<cpu::quant_matrix>* kind : {&g.wq, &g.wk, &g.wv, &g.wo, &g.w1, &g.w2, &g.w3})
    for (cpu::quant_matrix& m : *kind) take(m);
  plan.tied = g.wcls.data == g.token_embedding.data;
  take(g.wcls);
  return plan;
}

/// Lays the plan's matrices out as rows16 (kernels/cpu/quants.hpp)
/// in one buffer of huge pages, on every core at once, a slice of ~4 MiB at a time (a slice's
/// groups of sixteen rows are laid out just as in the whole matrix), and gives back the file's
/// pages each slice was read from as soon as it is done: the file and its copy are never both
/// resident beyond a few slices. The same bytes whatever the threads.
void checkpoint::repack_stored(mapping& map, const layout_plan& plan, kernels::cpu::thread_pool& pool) {
  namespace cpu = kernels::cpu;
  struct slice {
    cpu::quant_matrix from;  // rows of one matrix, whole groups of 16
    int64_t to;              // its offset in `repacked`
  };
  constexpr int64_t slice_bytes = int64_t{4} << 20;
  std::vector<slice> slices;
  for (size_t i = 0; i < plan.matrices.size(); i++) {
    const cpu::quant_matrix& m = *plan.matrices[i];
    const int64_t row = cpu::row_bytes(m.type, m.n), rows = std::max<int64_t>(16, slice_bytes / row / 16 * 16);
    for (int64_t first = 0; first < m.d; first += rows) {
      cpu::quant_matrix part = m;
      part.data = m.row(first);
      part.d = static_cast<int32_t>(std::min<int64_t>(rows, m.d - first));
      slices.push_back({part, plan.starts[i] + first * row});
    }
  }
  map.repacked = page_buffer<uint8_t>(static_cast<size_t>(plan.total), page_buffer<uint8_t>::pages::huge);
  // the slices on every core: no two write one byte
  pool.parallel_for(static_cast<int64_t>(slices.size()), [&](int32_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
      const slice& s = slices[static_cast<size_t>(i)];
      (void)cpu::fast::repack_rows16(s.from, map.repacked.data() + s.to);
      map.file->release(s.from.data, int64_t{s.from.d} * cpu::row_bytes(s.from.type, s.from.n));
    }
  });
  plan.use(*map.stored, map.repacked.data());
}

bool checkpoint::map_layout_cache(mapping& map, const layout_plan& plan, const layout_cache_entry& entry,
                                  const load_options& options, kernels::cpu::thread_pool& pool, std::string& note) {
  // What is read of the file besides the laid-out matrices, then the cache entry: one progress.
  std::vector<std::pair<int64_t, int64_t>> skip;  // [begin, end) of each laid-out matrix in the file
  const auto* base = reinterpret_cast<const uint8_t*>(map.file->bytes().data());
  for (const kernels::cpu::quant_matrix* m : plan.matrices)
    skip.emplace_back(m->data - base, m->data - base + int64_t{m->d} * kernels::cpu::row_bytes(m->type, m->n));
  std::sort(skip.begin(), skip.end());
  const int64_t file_bytes = static_cast<int64_t>(map.file->bytes().size());
  std::vector<std::pair<int64_t, int64_t>> read;  // the gaps
  int64_t at = 0, rest = 0;
  for (const auto& [begin, end] : skip) {
    if (begin > at) read.emplace_back(at, begin);
    at = std::max(at, end);
  }
  if (at < file_bytes) read.emplace_back(at, file_bytes);
  for (const auto& [begin, end] : read) rest += end - begin;
  const int64_t total = rest + layout_cache_header_bytes + plan.total;
  auto cached = open_layout_cache(entry, pool, [&](int64_t done, int64_t) {
    if (options.progress) options.progress(done, total);
  });
  if (!cached) {
    note = cached.error().code == errc::not_found ? "" : "layout cache entry not used (" + cached.error().message + ")";
    return false;
  }
  int64_t done = layout_cache_header_bytes + plan.total;
  for (const auto& [begin, end] : read) {
    if (options.prefault) map.file->prefault(begin, end - begin);
    done += end - begin;
    if (options.progress) options.progress(done, total);
  }
  map.cache = std::move(*cached);
  plan.use(*map.stored, reinterpret_cast<const uint8_t*>(map.cache->bytes().data()) + layout_cache_header_bytes);
  note = "mapped the laid-out matrices from the layout cache: " + entry.path;
  return true;
}

void checkpoint::release_embedding(const mapping& map) {
  const kernels::cpu::quant_matrix& e = map.stored->token_embedding;
  const char* data = reinterpret_cast<const char*>(e.data);
  const std::string_view file = map.file->bytes();
  // a classifier (tied) reads every row each step; a copy (converted, laid out) is not the file
  if (e.data == map.stored->wcls.data || data < file.data() || data >= file.data() + file.size()) return;
  map.file->release(e.data, int64_t{e.d} * kernels::cpu::row_bytes(e.type, e.n));
}

expected<checkpoint> checkpoint::load(const std::string& path, load_options options) {
  // With a layout cache the file is read once its tensors are known (map_layout_cache).
  const bool defer_prefault = options.prefault && !options.layout_cache.empty();
  auto file = mapped_file::open(path, options.prefault && !defer_prefault, options.progress);
  if (!file) return fail(errc::io_error, where(path) + "cannot open: " + file.error().message);
  const std::string_view bytes = file->bytes();
  if (bytes.size() < static_cast<size_t>(header_bytes))
    return fail(errc::malformed_file, where(path) + "only " + std::to_string(bytes.size()) +
                                          " bytes; a llama2.c checkpoint starts with a 28-byte header, a GGUF "
                                          "file with a longer one");
  auto map = std::make_shared<mapping>();
  checkpoint ck;
  ck.path_ = path;
  uint32_t magic = 0;
  std::memcpy(&magic, bytes.data(), sizeof magic);
  if (is_gguf(bytes)) {
    auto gguf = from_gguf(bytes, path, options.float32_views);
    if (!gguf) return tl::unexpected(gguf.error());
    ck.config_ = gguf->config;
    ck.architecture_ = std::move(gguf->architecture);
    ck.weights_ = gguf->views;  // into the vector moved below (its buffer moves with it)
    map->owned = std::move(gguf->floats);
    map->stored = std::move(gguf->stored);
    ck.moe_ = gguf->moe;
    if (map->stored) map->file = std::move(*file);  // read in place; else unmapped below
  } else if (magic == q80_magic) {
    if (bytes.size() < static_cast<size_t>(q80_header_bytes))
      return fail(errc::malformed_file, where(path) + "only " + std::to_string(bytes.size()) +
                                            " bytes; a version-2 checkpoint starts with a 256-byte header (truncated?)");
    auto header = parse_q80_header(bytes, path);
    if (!header) return tl::unexpected(header.error());
    ck.config_ = header->first;
    map->q80.emplace();
    ck.weights_ = q80_views(ck.config_, header->second, bytes, *map->q80, map->scales, map->owned);
    map->file = std::move(*file);  // the int8 values are read in place
  } else if (magic == moe_magic) {
    if (bytes.size() < static_cast<size_t>(moe_header_bytes))
      return fail(errc::malformed_file, where(path) + "only " + std::to_string(bytes.size()) +
                                            " bytes; an MoE checkpoint starts with a 256-byte header (truncated?)");
    auto header = parse_moe_header(bytes, path);
    if (!header) return tl::unexpected(header.error());
    ck.config_ = header->first;
    ck.moe_ = header->second;
    map->file = std::move(*file);
    ck.weights_ = views(ck.config_, reinterpret_cast<const float*>(map->file->bytes().data() + moe_header_bytes),
                        false, &*ck.moe_);
  } else {
    int32_t header[7];
    std::memcpy(header, bytes.data(), sizeof(header));
    auto config = parse_header(header, static_cast<int64_t>(bytes.size()), path);
    if (!config) return tl::unexpected(config.error());
    ck.config_ = *config;
    map->file = std::move(*file);
    ck.weights_ = views(ck.config_, reinterpret_cast<const float*>(map->file->bytes().data() + header_bytes), true);
  }
  ck.map_ = map;
  std::optional<layout_plan> plan;
  if (options.repack && map->stored) plan = plan_layout(*map);
  if (plan && plan->matrices.empty()) plan.reset();
  std::optional<kernels::cpu::thread_pool> pool;  // every core, for this load only
  if (plan) pool.emplace(load_threads());
  std::optional<expected<layout_cache_entry>> entry;  // where the layout is cached, when it is
  if (plan && !options.layout_cache.empty() && plan->total >= options.layout_cache_min_bytes)
    entry = layout_cache_entry_for(options.layout_cache, path, plan->description, plan->total);
  const bool cached = entry && *entry && map_layout_cache(*map, *plan, **entry, options, *pool, ck.layout_note_);
  if (defer_prefault && !cached && map->file)
    map->file->prefault(0, static_cast<int64_t>(map->file->bytes().size()), options.progress);
  if (options.check_finite) {
    if (auto ok = check_finite(ck, cached); !ok) return tl::unexpected(ok.error());
  }
  if (map->stored) release_embedding(*map);  // before the layout's copy adds to what is resident
  if (plan && !cached) {
    repack_stored(*map, *plan, *pool);
    if (entry) {
      const std::string made = "laid out " + std::to_string(plan->total >> 20) + " MiB of matrices for the kernels";
      const std::string before = ck.layout_note_.empty() ? "" : "; " + ck.layout_note_;
      ck.layout_note_ = *entry ? made + ", writing them to the layout cache: " + (*entry)->path + before
                               : made + "; not cached: " + entry->error().message + before;
      if (*entry)  // in the background: the model serves meanwhile (~mapping waits for it)
        map->cache_writer = std::thread([e = **entry, data = map->repacked.data(), report = options.layout_cache_report] {
          kernels::cpu::thread_pool pool(load_threads());
          auto written = write_layout_cache(e, data, pool);
          if (report)
            report(written ? "kept the laid-out matrices in the layout cache: " + e.path
                           : "laid-out matrices not cached: " + written.error().message);
        });
    }
  }
  if (options.max_context > 0) ck.config_.seq_len = std::min(ck.config_.seq_len, options.max_context);
  return ck;
}

}  // namespace troupe::model
