#pragma once

// Random-weight GGUF files of troupe's architectures (llama and its Mixtral layout, qwen2, qwen3,
// qwen3moe, phi3, gemma2, gemma3) for tests that run llama.cpp beside troupe
// (tests/llama_oracle_test.cpp, tests/gguf_serve_test.cpp) and for the loader's metadata tests
// (tests/gguf_test.cpp).
//
// The vocabulary is synthetic byte-level BPE (tokenizer.ggml.model "gpt2", pre-tokenizer
// "gpt-2"), which llama.cpp accepts: ids 0..255 are the 256 byte characters, 256
// "<|begin_of_text|>" (control, BOS), 257 "<|eot_id|>" (control, EOS), then the two-letter
// tokens "aa".."ek" with their merges. Weights are drawn from a fixed-seed generator, scaled so
// the classifier's logits spread over tens of units: greedy choices then win by wide margins,
// far beyond the rounding in which two correct implementations differ.

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/gguf.hpp"
#include "tests/support/bpe_vocab_file.hpp"

namespace troupe::testing {

/// The shape and settings of a random model.
struct random_llama_spec {
  /// general.architecture: llama; qwen2 (Q/K/V biases); qwen3 (Q/K norms); phi3 (fused QKV and
  /// gate/up tensors); qwen3moe (qwen3's with experts); gemma2 and gemma3 (post norms, GeGLU, a scaled embedding that also
  /// classifies; gemma3's Q/K norms). All but llama rotate GPT-NeoX's halves.
  std::string arch = "llama";
  int32_t dim = 64;
  int32_t hidden_dim = 192;  // a multiple of 32: Q8_0 rows of ffn_down
  int32_t n_layers = 2;
  int32_t n_heads = 4;
  int32_t n_kv_heads = 2;
  int32_t head_dim = 0;  ///< written as attention.key_length and value_length when > 0
  int32_t context_length = 256;
  float rope_freq_base = 10000.0f;
  float rms_norm_eps = 1e-5f;
  /// Llama 3's RoPE scaling (rope_freqs.weight) from these rope_scaling values, when factor > 0.
  float llama3_factor = 0.0f;
  float llama3_low_freq_factor = 1.0f;
  float llama3_high_freq_factor = 4.0f;
  float llama3_original_context_length = 8192.0f;
  /// Written as rope_freqs.weight as they are, when not empty (in place of Llama 3's).
  std::vector<float> rope_freqs;
  model::ggml_type type = model::ggml_type::f32;  // of the matrices and the embedding; norms stay F32
  /// When set, attn_v, ffn_down and the classifier in this type, the rest in `type`: llama.cpp's
  /// Q4_K_M gives them Q6_K's extra bits (every layer's here, where llama.cpp picks some).
  std::optional<model::ggml_type> wide_type;
  std::string extra_tensor;  ///< written (4 F32 values) beside llama's tensors, when not empty
  /// The vocabulary padded to this many tokens with reserved control tokens, as Llama 3's is
  /// (a real model's shape for benchmarks); 0: the synthetic vocabulary's own size.
  int32_t vocab_size = 0;
  bool add_bos_token = true;  ///< tokenizer.ggml.add_bos_token: whether a prompt starts with BOS
  bool tied_classifier = false;  ///< no output.weight: the token embedding classifies (Llama 3.2 1B; gemma)
  // Gemma's metadata, each written when > 0:
  int32_t sliding_window = 0;          ///< attention.sliding_window
  int32_t sliding_window_pattern = 0;  ///< attention.sliding_window_pattern
  float attn_softcap = 0.0f;           ///< attn_logit_softcapping
  float final_softcap = 0.0f;          ///< final_logit_softcapping
  /// A mixture of experts when > 0 (llama: Mixtral's layout; qwen3moe must have them): this many
  /// experts of hidden_dim per layer, each row to `experts_used` of them.
  int32_t n_experts = 0;
  int32_t experts_used = 0;
  uint64_t seed = 1;
};

/// A random model of a named family.
struct random_llama_family {
  std::string name;
  random_llama_spec spec;
};

/// One model of each family troupe serves, F32 and 64 wide, seed 4 (the seed
/// tests/llama_oracle_test.cpp's cases were checked over; callers set the weight type): Llama
/// 3.x's RoPE (base 500000 scaled by rope_freqs.weight, eps 1e-6); qwen2 (Q/K/V biases, base
/// 1000000, eps 1e-6); qwen3 (Q/K norms, heads of 32 over a width of 64: Q is twice the width,
/// base 1000000); phi3 (fused tensors); gemma2 (its own layer 0 sliding over 6 positions, scores
/// capped at 1 so the cap bites, the logits at the default 30; its embedding classifies, as
/// gemma2's must); gemma3 (Q/K norms, layer 0 of every 2 sliding over 5 positions at base 10000,
/// layer 1 at base 1000000, its own output.weight); mixtral (llama's layout with 4 experts, 2
/// per row, base 1000000); qwen3moe (qwen3's with 4 experts, 2 per row). The Qwen vocabularies
/// add no BOS, as Qwen's files say.
inline std::vector<random_llama_family> random_llama_families() {
  random_llama_spec llama3, qwen2, qwen3, phi3, gemma2, gemma3, mixtral, qwen3moe;
  llama3.rope_freq_base = 500000.0f;
  llama3.llama3_factor = 8.0f;
  llama3.rms_norm_eps = 1e-6f;
  qwen2.arch = "qwen2";
  qwen2.rope_freq_base = 1000000.0f;
  qwen2.rms_norm_eps = 1e-6f;
  qwen3.arch = "qwen3";
  qwen3.rope_freq_base = 1000000.0f;
  qwen3.head_dim = 32;
  qwen2.add_bos_token = qwen3.add_bos_token = false;
  phi3.arch = "phi3";
  gemma2.arch = "gemma2";
  gemma2.rms_norm_eps = gemma3.rms_norm_eps = 1e-6f;
  gemma2.tied_classifier = true;
  gemma2.sliding_window = 6;
  gemma2.attn_softcap = 1.0f;
  gemma3.arch = "gemma3";
  gemma3.rope_freq_base = 1000000.0f;
  gemma3.sliding_window = 5;
  gemma3.sliding_window_pattern = 2;
  mixtral.rope_freq_base = 1000000.0f;
  mixtral.n_experts = qwen3moe.n_experts = 4;
  mixtral.experts_used = qwen3moe.experts_used = 2;
  qwen3moe.arch = "qwen3moe";
  qwen3moe.rope_freq_base = 1000000.0f;
  qwen3moe.rms_norm_eps = 1e-6f;
  qwen3moe.head_dim = 32;
  qwen3moe.add_bos_token = false;
  llama3.seed = qwen2.seed = qwen3.seed = phi3.seed = gemma2.seed = gemma3.seed = mixtral.seed = qwen3moe.seed = 4;
  return {{"llama3", llama3}, {"qwen2", qwen2},   {"qwen3", qwen3},     {"phi3", phi3},
          {"gemma2", gemma2}, {"gemma3", gemma3}, {"mixtral", mixtral}, {"qwen3moe", qwen3moe}};
}

/// llama.cpp's general.file_type for a file of `s`'s types (LLAMA_FTYPE_*).
inline int64_t random_llama_file_type(const random_llama_spec& s) {
  using model::ggml_type;
  if (s.wide_type) return s.type == ggml_type::q5_k ? 17 : 15;  // Q5_K_M, Q4_K_M
  switch (s.type) {
    case ggml_type::f32: return 0;
    case ggml_type::f16: return 1;
    case ggml_type::q4_0: return 2;
    case ggml_type::q8_0: return 7;
    case ggml_type::q4_k: return 14;  // Q4_K_S
    case ggml_type::q5_k: return 16;  // Q5_K_S
    case ggml_type::q6_k: return 18;
    case ggml_type::bf16: return 32;
    case ggml_type::q8_k: break;
  }
  return 0;
}

inline constexpr int32_t random_llama_bos = 256;
inline constexpr int32_t random_llama_eot = 257;

/// Llama 3's per-pair RoPE divisors for heads of `head_size`, computed from rope_scaling's values
/// as Meta's reference and llama.cpp's converter define them: a pair whose wavelength is shorter
/// than original_context_length / high_freq_factor keeps its frequency (1), one longer than
/// original_context_length / low_freq_factor is slowed by `factor`, and those between blend the
/// two smoothly.
inline std::vector<float> llama3_rope_divisors(const random_llama_spec& s, int32_t head_size) {
  std::vector<float> out;
  const double low_wavelength = s.llama3_original_context_length / s.llama3_low_freq_factor;
  const double high_wavelength = s.llama3_original_context_length / s.llama3_high_freq_factor;
  for (int32_t i = 0; i < head_size; i += 2) {
    const double frequency = 1.0 / std::pow(static_cast<double>(s.rope_freq_base), static_cast<double>(i) / head_size);
    const double wavelength = 2 * M_PI / frequency;
    if (wavelength < high_wavelength) {
      out.push_back(1.0f);
    } else if (wavelength > low_wavelength) {
      out.push_back(s.llama3_factor);
    } else {
      const double smooth = (s.llama3_original_context_length / wavelength - s.llama3_low_freq_factor) /
                            (s.llama3_high_freq_factor - s.llama3_low_freq_factor);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / s.llama3_factor + smooth)));
    }
  }
  return out;
}

/// The control tokens a family's vocabulary has beside BOS and EOT, appended after the two-letter
/// tokens (ids 313 on): ChatML's for qwen2 and qwen3, Phi-3's for phi3, Gemma's turns for gemma2
/// and gemma3 (troupe's end ids include <|im_end|>, <|end|>, <|endoftext|> and <end_of_turn> by
/// name, as llama.cpp's do).
inline std::vector<std::string> family_tokens(const std::string& arch) {
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe") return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  if (arch == "phi3") return {"<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"};
  if (arch == "gemma2" || arch == "gemma3") return {"<start_of_turn>", "<end_of_turn>"};
  return {};
}

/// The synthetic vocabulary's metadata (see the file comment) for `s`'s architecture, padded to
/// s.vocab_size; its size is returned in `*size`.
inline gguf_metadata random_llama_vocab(const random_llama_spec& s, int32_t* size) {
  using v = model::gguf_value;
  std::vector<v> texts, types, merges;
  for (int b = 0; b < 256; ++b) {
    texts.push_back(v::of_string(byte_char(b)));
    types.push_back(v::of_int(model::gguf_type::i32, 1));
  }
  for (const char* special : {"<|begin_of_text|>", "<|eot_id|>"}) {
    texts.push_back(v::of_string(special));
    types.push_back(v::of_int(model::gguf_type::i32, 3));  // control
  }
  for (char a = 'a'; a <= 'e'; ++a)
    for (char b = 'a'; b <= 'k'; ++b) {
      texts.push_back(v::of_string(std::string{a, b}));
      types.push_back(v::of_int(model::gguf_type::i32, 1));
      merges.push_back(v::of_string(std::string{a, ' ', b}));
    }
  for (const std::string& special : family_tokens(s.arch)) {
    texts.push_back(v::of_string(special));
    types.push_back(v::of_int(model::gguf_type::i32, 3));  // control
  }
  while (static_cast<int32_t>(texts.size()) < s.vocab_size) {
    texts.push_back(v::of_string("<|reserved_special_token_" + std::to_string(texts.size()) + "|>"));
    types.push_back(v::of_int(model::gguf_type::i32, 3));  // control
  }
  *size = static_cast<int32_t>(texts.size());
  model::gguf_value add_bos;
  add_bos.type = model::gguf_type::boolean;
  add_bos.boolean = s.add_bos_token;
  return {{"tokenizer.ggml.model", v::of_string("gpt2")},
          {"tokenizer.ggml.pre", v::of_string("gpt-2")},
          {"tokenizer.ggml.tokens", v::of_array(model::gguf_type::string, std::move(texts))},
          {"tokenizer.ggml.token_type", v::of_array(model::gguf_type::i32, std::move(types))},
          {"tokenizer.ggml.merges", v::of_array(model::gguf_type::string, std::move(merges))},
          {"tokenizer.ggml.bos_token_id", v::of_int(model::gguf_type::u32, random_llama_bos)},
          {"tokenizer.ggml.eos_token_id", v::of_int(model::gguf_type::u32, random_llama_eot)},
          {"tokenizer.ggml.add_bos_token", add_bos}};
}

/// Uniform values in [-scale, scale) from splitmix64 (the same on every platform).
inline std::vector<float> random_values(uint64_t& state, int64_t count, float scale, float offset = 0.0f) {
  std::vector<float> out(static_cast<size_t>(count));
  for (float& x : out) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x = offset + scale * static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }
  return out;
}

/// A random GGUF file of `s`'s architecture and shape; `edit` may change the metadata before it is
/// written.
inline std::string random_llama_gguf(const random_llama_spec& s,
                                     const std::function<void(gguf_metadata&)>& edit = {}) {
  using v = model::gguf_value;
  using model::ggml_type;
  const auto u32 = [](int64_t x) { return v::of_int(model::gguf_type::u32, x); };
  int32_t vocab = 0;
  const std::string a = s.arch + ".";
  const int64_t head = s.head_dim > 0 ? s.head_dim : s.dim / s.n_heads;
  gguf_metadata meta = {{"general.architecture", v::of_string(s.arch)},
                        // Not naming the family: llama.cpp sets token attributes by a "phi3" in
                        // general.name, looking up SentencePiece's "</s>" and failing without it.
                        {"general.name", v::of_string("random model")},
                        {"general.file_type", u32(random_llama_file_type(s))},
                        {a + "context_length", u32(s.context_length)},
                        {a + "embedding_length", u32(s.dim)},
                        {a + "block_count", u32(s.n_layers)},
                        {a + "feed_forward_length", u32(s.hidden_dim)},
                        {a + "rope.dimension_count", u32(head)},
                        {a + "attention.head_count", u32(s.n_heads)},
                        {a + "attention.head_count_kv", u32(s.n_kv_heads)},
                        {a + "attention.layer_norm_rms_epsilon", v::of_float(s.rms_norm_eps)},
                        {a + "rope.freq_base", v::of_float(s.rope_freq_base)}};
  if (s.head_dim > 0) {
    meta.push_back({a + "attention.key_length", u32(s.head_dim)});
    meta.push_back({a + "attention.value_length", u32(s.head_dim)});
  }
  const std::pair<const char*, int32_t> ints[] = {{"attention.sliding_window", s.sliding_window},
                                                  {"attention.sliding_window_pattern", s.sliding_window_pattern}};
  for (const auto& [suffix, value] : ints)
    if (value > 0) meta.push_back({a + suffix, u32(value)});
  if (s.n_experts > 0) {
    meta.push_back({a + "expert_count", u32(s.n_experts)});
    meta.push_back({a + "expert_used_count", u32(s.experts_used)});
    if (s.arch == "qwen3moe") meta.push_back({a + "expert_feed_forward_length", u32(s.hidden_dim)});
  }
  const std::pair<const char*, float> floats[] = {{"attn_logit_softcapping", s.attn_softcap},
                                                  {"final_logit_softcapping", s.final_softcap}};
  for (const auto& [suffix, value] : floats)
    if (value > 0) meta.push_back({a + suffix, v::of_float(value)});
  for (auto& kv : random_llama_vocab(s, &vocab)) meta.push_back(std::move(kv));
  if (edit) edit(meta);
  const int64_t dim = s.dim, hidden = s.hidden_dim, q_dim = head * s.n_heads, kv_dim = head * s.n_kv_heads;
  uint64_t state = s.seed;
  std::vector<std::vector<float>> data;  // each tensor's values, kept alive until written
  std::vector<model::gguf_tensor_data> tensors;
  const auto add = [&](const std::string& name, std::vector<int64_t> dims, std::vector<float> values, ggml_type type) {
    data.push_back(std::move(values));
    tensors.push_back({name, std::move(dims), nullptr, type});
  };
  const auto joined = [](std::vector<float> x, const std::vector<float>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  const float in_dim = 1.0f / std::sqrt(static_cast<float>(dim)), in_hidden = 1.0f / std::sqrt(static_cast<float>(hidden));
  const ggml_type wide = s.wide_type.value_or(s.type);
  // Gemma multiplies the embedding by sqrt(dim): scaled to unit RMS, it does not drown the layers.
  // Tied, it must be large to classify, and each next token would echo the last: the post norms'
  // weights are then ~7 (below), so that the layers decide.
  const bool gemma = s.arch == "gemma2" || s.arch == "gemma3";
  const float embedding = gemma && !s.tied_classifier ? std::sqrt(3.0f / static_cast<float>(dim)) : 1.0f;
  add("token_embd.weight", {dim, vocab}, random_values(state, dim * vocab, embedding), s.type);
  for (int32_t l = 0; l < s.n_layers; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {dim}, random_values(state, dim, 0.2f, 1.0f), ggml_type::f32);
    std::vector<float> wq = random_values(state, dim * q_dim, 1.0f * in_dim);
    std::vector<float> wk = random_values(state, dim * kv_dim, 1.0f * in_dim);
    std::vector<float> wv = random_values(state, dim * kv_dim, 1.5f * in_dim);
    if (s.arch == "phi3") {
      add(p + "attn_qkv.weight", {dim, q_dim + 2 * kv_dim}, joined(joined(wq, wk), wv), s.type);
    } else {
      add(p + "attn_q.weight", {dim, q_dim}, wq, s.type);
      add(p + "attn_k.weight", {dim, kv_dim}, wk, s.type);
      add(p + "attn_v.weight", {dim, kv_dim}, wv, wide);
    }
    const float in_q = 1.0f / std::sqrt(static_cast<float>(q_dim));
    add(p + "attn_output.weight", {q_dim, dim}, random_values(state, q_dim * dim, 1.5f * in_q), s.type);
    add(p + "ffn_norm.weight", {dim}, random_values(state, dim, 0.2f, 1.0f), ggml_type::f32);
    const int64_t experts = std::max(s.n_experts, 1);
    std::vector<float> gate = random_values(state, dim * hidden * experts, 1.5f * in_dim);
    std::vector<float> down = random_values(state, hidden * dim * experts, 1.5f * in_hidden);
    std::vector<float> up = random_values(state, dim * hidden * experts, 1.5f * in_dim);
    if (s.n_experts > 0) {  // the router's logits spread by units: no near ties between experts
      add(p + "ffn_gate_inp.weight", {dim, experts}, random_values(state, dim * experts, 8.0f * in_dim), ggml_type::f32);
      add(p + "ffn_gate_exps.weight", {dim, hidden, experts}, gate, s.type);
      add(p + "ffn_up_exps.weight", {dim, hidden, experts}, up, s.type);
    } else if (s.arch == "phi3") {
      add(p + "ffn_up.weight", {dim, 2 * hidden}, joined(gate, up), s.type);  // the gate's rows first
    } else {
      add(p + "ffn_gate.weight", {dim, hidden}, gate, s.type);
      add(p + "ffn_up.weight", {dim, hidden}, up, s.type);
    }
    add(p + (s.n_experts > 0 ? "ffn_down_exps.weight" : "ffn_down.weight"),
        s.n_experts > 0 ? std::vector<int64_t>{hidden, dim, experts} : std::vector<int64_t>{hidden, dim}, down, wide);
    if (s.arch == "qwen2") {
      add(p + "attn_q.bias", {q_dim}, random_values(state, q_dim, 0.5f), ggml_type::f32);
      add(p + "attn_k.bias", {kv_dim}, random_values(state, kv_dim, 0.5f), ggml_type::f32);
      add(p + "attn_v.bias", {kv_dim}, random_values(state, kv_dim, 0.5f), ggml_type::f32);
    }
    if (gemma) {  // tied, the layers' outputs must outweigh the large embedding (above)
      const float post = s.tied_classifier ? 7.0f : 1.0f;
      add(p + "post_attention_norm.weight", {dim}, random_values(state, dim, 0.2f * post, post), ggml_type::f32);
      add(p + "post_ffw_norm.weight", {dim}, random_values(state, dim, 0.2f * post, post), ggml_type::f32);
    }
    if (s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3") {
      add(p + "attn_q_norm.weight", {head}, random_values(state, head, 0.2f, 1.0f), ggml_type::f32);
      add(p + "attn_k_norm.weight", {head}, random_values(state, head, 0.2f, 1.0f), ggml_type::f32);
    }
  }
  add("output_norm.weight", {dim}, random_values(state, dim, 0.2f, 1.0f), ggml_type::f32);
  // Logits = output · x with x of unit RMS: a standard deviation of about 10.
  if (!s.tied_classifier)
    add("output.weight", {dim, vocab}, random_values(state, dim * vocab, 17.0f * in_dim), wide);
  if (!s.rope_freqs.empty())
    add("rope_freqs.weight", {static_cast<int64_t>(s.rope_freqs.size())}, s.rope_freqs, ggml_type::f32);
  else if (s.llama3_factor > 0)
    add("rope_freqs.weight", {head / 2}, llama3_rope_divisors(s, static_cast<int32_t>(head)), ggml_type::f32);
  if (!s.extra_tensor.empty()) add(s.extra_tensor, {4}, random_values(state, 4, 1.0f), ggml_type::f32);
  for (size_t i = 0; i < tensors.size(); i++) tensors[i].data = data[i].data();
  return model::write_gguf(meta, tensors);
}

}  // namespace troupe::testing
