#include "runtime/model/convert.hpp"

#include <tuple>
#include <utility>
#include <vector>

#include "runtime/common/gguf.hpp"

namespace troupe::model {
namespace {

/// llama.cpp's token types (llama_token_type).
enum token_type : int32_t { normal = 1, unknown = 2, control = 3, byte = 6 };

}  // namespace

std::string to_gguf(const checkpoint& ck, const spm_vocab& tok, const std::string& name) {
  const model_config& c = ck.config();
  TROUPE_ASSERT(c.vocab_size == tok.vocab_size());
  TROUPE_ASSERT_MSG(ck.moe() == nullptr, "GGUF export writes dense checkpoints");
  using v = gguf_value;
  const auto u32 = [](int64_t x) { return v::of_int(gguf_type::u32, x); };
  std::vector<gguf_value> tokens, scores, types;
  for (int32_t id = 0; id < tok.vocab_size(); id++) {
    std::string piece(tok.piece_text(id));
    int32_t type = normal;
    if (id == spm_vocab::unk_id) {
      piece = "<unk>", type = unknown;
    } else if (id == spm_vocab::bos) {
      piece = "<s>", type = control;  // llama2.c's files spell them "\n<s>\n" and "\n</s>\n"
    } else if (id == spm_vocab::eos) {
      piece = "</s>", type = control;
    } else if (spm_vocab::is_byte(id)) {
      type = byte;
    } else {
      for (size_t at; (at = piece.find(' ')) != std::string::npos;) piece.replace(at, 1, spm_vocab::sentencepiece_space);
    }
    tokens.push_back(v::of_string(std::move(piece)));
    scores.push_back(v::of_float(tok.score(id)));
    types.push_back(v::of_int(gguf_type::i32, type));
  }
  const std::vector<std::pair<std::string, gguf_value>> metadata = {
      {"general.architecture", v::of_string("llama")},
      {"general.name", v::of_string(name)},
      {"general.file_type", u32(0)},  // all F32
      {"llama.context_length", u32(c.seq_len)},
      {"llama.embedding_length", u32(c.dim)},
      {"llama.block_count", u32(c.n_layers)},
      {"llama.feed_forward_length", u32(c.hidden_dim)},
      {"llama.rope.dimension_count", u32(c.head_size())},
      {"llama.attention.head_count", u32(c.n_heads)},
      {"llama.attention.head_count_kv", u32(c.n_kv_heads)},
      {"llama.attention.layer_norm_rms_epsilon", v::of_float(1e-5f)},
      {"llama.rope.freq_base", v::of_float(10000.0f)},
      {"tokenizer.ggml.model", v::of_string("llama")},
      {"tokenizer.ggml.tokens", v::of_array(gguf_type::string, std::move(tokens))},
      {"tokenizer.ggml.scores", v::of_array(gguf_type::f32, std::move(scores))},
      {"tokenizer.ggml.token_type", v::of_array(gguf_type::i32, std::move(types))},
      {"tokenizer.ggml.unknown_token_id", u32(spm_vocab::unk_id)},
      {"tokenizer.ggml.bos_token_id", u32(spm_vocab::bos)},
      {"tokenizer.ggml.eos_token_id", u32(spm_vocab::eos)},
  };
  const weights& w = ck.w();
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv_dim = c.kv_dim(), vocab = c.vocab_size;
  std::vector<gguf_tensor_data> tensors = {{"token_embd.weight", {dim, vocab}, w.token_embedding}};
  // llama2.c stacks each per-layer tensor; GGUF names one tensor per layer.
  const std::tuple<const char*, const float*, std::vector<int64_t>> per_layer[] = {
      {"attn_norm", w.rms_att, {dim}},          {"attn_q", w.wq, {dim, dim}},
      {"attn_k", w.wk, {dim, kv_dim}},          {"attn_v", w.wv, {dim, kv_dim}},
      {"attn_output", w.wo, {dim, dim}},        {"ffn_norm", w.rms_ffn, {dim}},
      {"ffn_gate", w.w1, {dim, hidden}},        {"ffn_down", w.w2, {hidden, dim}},
      {"ffn_up", w.w3, {dim, hidden}}};
  for (const auto& [suffix, data, dims] : per_layer) {
    int64_t layer_size = 1;
    for (int64_t d : dims) layer_size *= d;
    for (int32_t l = 0; l < c.n_layers; l++)
      tensors.push_back({"blk." + std::to_string(l) + "." + suffix + ".weight", dims, data + l * layer_size});
  }
  tensors.push_back({"output_norm.weight", {dim}, w.rms_final});
  if (!c.shared_classifier) tensors.push_back({"output.weight", {dim, vocab}, w.wcls});
  return write_gguf(metadata, tensors);
}

}  // namespace troupe::model
