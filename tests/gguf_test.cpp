// GGUF: the bundled model converted (troupe convert's function) reads back bit for bit and
// tokenizes the same; the format's value and tensor types; every class of malformed file is a
// clear error, and no truncation of a valid file crashes the reader.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <tuple>

#include "runtime/common/gguf.hpp"
#include "runtime/common/string_table.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/convert.hpp"
#include "runtime/model/quantize.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/random_llama.hpp"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;
using testing::bundled_model;
using testing::bundled_tokenizer;

std::string bundled_gguf_bytes() {
  auto ck = checkpoint::load(bundled_model());
  auto tok = tokenizer::load(bundled_tokenizer(), 512);
  EXPECT_TRUE(ck && tok);
  return to_gguf(*ck, *tok->spm(), "stories260K");
}

/// `path` loaded with an all-F32 file's matrices as float32 views (load_options::float32_views),
/// which these tests read.
expected<checkpoint> load_float32_views(const std::string& path) {
  load_options o;
  o.float32_views = true;
  return checkpoint::load(path, o);
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  const fs::path p = fs::temp_directory_path() / ("troupe_gguf_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

TEST(Gguf, TheConvertedBundledModelHasTheSameWeightsBitForBit) {
  const std::string path = write_temp("model.gguf", bundled_gguf_bytes());
  auto bin = checkpoint::load(bundled_model());
  auto gguf = load_float32_views(path);
  fs::remove(path);
  ASSERT_TRUE(bin);
  ASSERT_TRUE(gguf) << gguf.error().message;
  const model_config& a = bin->config();
  const model_config& b = gguf->config();
  EXPECT_EQ(std::tie(a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, a.vocab_size, a.seq_len,
                     a.shared_classifier),
            std::tie(b.dim, b.hidden_dim, b.n_layers, b.n_heads, b.n_kv_heads, b.vocab_size, b.seq_len,
                     b.shared_classifier));
  const int64_t dim = a.dim, l = a.n_layers, kv = a.kv_dim(), h = a.hidden_dim;
  const weights& x = bin->w();
  const weights& y = gguf->w();
  const std::tuple<const char*, const float*, const float*, int64_t> tensors[] = {
      {"token_embedding", x.token_embedding, y.token_embedding, a.vocab_size * dim},
      {"rms_att", x.rms_att, y.rms_att, l * dim},   {"wq", x.wq, y.wq, l * dim * dim},
      {"wk", x.wk, y.wk, l * kv * dim},             {"wv", x.wv, y.wv, l * kv * dim},
      {"wo", x.wo, y.wo, l * dim * dim},            {"rms_ffn", x.rms_ffn, y.rms_ffn, l * dim},
      {"w1", x.w1, y.w1, l * h * dim},              {"w2", x.w2, y.w2, l * dim * h},
      {"w3", x.w3, y.w3, l * h * dim},              {"rms_final", x.rms_final, y.rms_final, dim},
      {"wcls", x.wcls, y.wcls, a.vocab_size * dim}};
  for (const auto& [name, p, q, n] : tensors)
    EXPECT_EQ(std::memcmp(p, q, static_cast<size_t>(n) * sizeof(float)), 0) << name;
}

TEST(Gguf, TheConvertedTokenizerHasTheSamePiecesAndScoresAndEncodesTheSame) {
  const std::string bytes = bundled_gguf_bytes();
  auto bin = tokenizer::load(bundled_tokenizer(), 512);
  auto gguf = tokenizer::from_bytes(bytes, 512, "stories260K.gguf");
  ASSERT_TRUE(bin);
  ASSERT_TRUE(gguf) << gguf.error().message;
  for (int32_t id = tokenizer::first_byte_id; id < 512; id++) {
    EXPECT_EQ(bin->piece_text(id), gguf->piece_text(id)) << id;
    EXPECT_EQ(bin->spm()->score(id), gguf->spm()->score(id)) << id;
  }
  for (const char* text : {"Once upon a time, there was a little girl named Lily.", "  two  spaces\nnewline",
                           "caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x99\x82"}) {
    EXPECT_EQ(*bin->encode(text, true, false), *gguf->encode(text, true, false)) << text;
  }
  // The file spells spaces U+2581 and the control tokens as llama.cpp does.
  auto f = parse_gguf(bytes, "stories260K.gguf");
  ASSERT_TRUE(f);
  const gguf_array& tokens = **f->get_array("tokenizer.ggml.tokens", gguf_type::string, "x");
  EXPECT_EQ(tokens.string(1), "<s>");
  EXPECT_EQ(tokens.string(2), "</s>");
  const auto space = bin->find_piece(" t");
  ASSERT_TRUE(space);
  EXPECT_EQ(tokens.string(static_cast<size_t>(*space)), "\xe2\x96\x81t");
  EXPECT_EQ(*f->get_string("general.architecture", "x"), "llama");
  EXPECT_EQ(*f->get_int("llama.block_count", "x"), 5);
  EXPECT_EQ(f->tensors.size(), 2u + 9u * 5u);
}

/// The config of a random llama file (tests/support/random_llama.hpp) of `spec`, metadata edited
/// by `edit`; or the loader's error message.
expected<model_config> random_llama_config(const testing::random_llama_spec& spec,
                                           const std::function<void(testing::gguf_metadata&)>& edit = {}) {
  const std::string path = write_temp("random.gguf", testing::random_llama_gguf(spec, edit));
  auto ck = checkpoint::load(path);
  fs::remove(path);
  if (!ck) return tl::unexpected(ck.error());
  return ck->config();
}

/// A random file of a spec, edited: refused as malformed, with a message that contains the text.
using refusal = std::tuple<testing::random_llama_spec, std::function<void(testing::gguf_metadata&)>, const char*>;

void expect_refused(const std::vector<refusal>& cases) {
  for (const auto& [spec, edit, message] : cases) {
    auto c = random_llama_config(spec, edit);
    ASSERT_FALSE(c) << message;
    EXPECT_EQ(c.error().code, errc::malformed_file);
    EXPECT_NE(c.error().message.find(message), std::string::npos) << c.error().message;
  }
}

TEST(Gguf, ANonFiniteScaleOrWeightOfAStoredMatrixIsRefusedByTensorLayerAndRow) {
  // Each type's non-integer fields: an F16 weight, a Q8_0 block's scale (first), a Q4_K block's
  // dmin (second), a Q6_K block's scale (last, after the quants).
  struct poison {
    ggml_type type;
    const char* tensor;
    int64_t row, offset_in_row;  // the byte offset of the f16 made NaN or infinite
    uint16_t value;
    const char* message;
  };
  const poison cases[] = {
      {ggml_type::f16, "token_embd.weight", 5, 2 * 7, 0x7c00,
       "weight tensor token_embedding (F16) holds NaN or an infinity (row 5)"},
      {ggml_type::q8_0, "blk.1.attn_q.weight", 3, 34, 0x7e00, "weight tensor wq (Q8_0) holds NaN or an infinity (layer 1, row 3)"},
      {ggml_type::q4_k, "blk.1.ffn_down.weight", 2, 144 + 2, 0xfc00,
       "weight tensor w2 (Q4_K) holds NaN or an infinity (layer 1, row 2)"},
      {ggml_type::q6_k, "output.weight", 9, 208, 0x7e01, "weight tensor wcls (Q6_K) holds NaN or an infinity (row 9)"},
  };
  for (const poison& p : cases) {
    testing::random_llama_spec spec;
    spec.type = p.type;
    if (kernels::cpu::block_elements(p.type) == 256) spec.dim = 256, spec.hidden_dim = 512;
    std::string bytes = testing::random_llama_gguf(spec);
    auto f = parse_gguf(bytes, "poisoned.gguf");
    ASSERT_TRUE(f) << f.error().message;
    const gguf_tensor* t = f->tensor(p.tensor);
    ASSERT_NE(t, nullptr) << p.tensor;
    ASSERT_EQ(t->type, p.type) << p.tensor;
    const uint64_t at = f->data_offset + t->offset +
                        static_cast<uint64_t>(p.row * kernels::cpu::row_bytes(t->type, t->dims[0]) + p.offset_in_row);
    std::memcpy(&bytes[at], &p.value, 2);
    const std::string path = write_temp("poisoned.gguf", bytes);
    auto ck = checkpoint::load(path);
    fs::remove(path);
    ASSERT_FALSE(ck) << p.message;
    EXPECT_EQ(ck.error().code, errc::malformed_file);
    EXPECT_NE(ck.error().message.find(p.message), std::string::npos) << ck.error().message;
  }
}

TEST(Gguf, AnUnknownLlamaKeyOrTensorIsRefusedByName) {
  testing::random_llama_spec spec;
  auto known = random_llama_config(spec, [](auto& meta) {  // read or harmless: accepted
    testing::set_key(meta, "llama.vocab_size", gguf_value::of_int(gguf_type::u32, 313));
    testing::set_key(meta, "general.quantized_by", gguf_value::of_string("someone"));
    testing::set_key(meta, "quantize.imatrix.file", gguf_value::of_string("x.dat"));
  });
  ASSERT_TRUE(known) << known.error().message;
  auto moe = random_llama_config(spec, [](auto& meta) {
    testing::set_key(meta, "llama.expert_shared_count", gguf_value::of_int(gguf_type::u32, 1));
  });
  ASSERT_FALSE(moe);
  EXPECT_EQ(moe.error().code, errc::malformed_file);
  EXPECT_NE(moe.error().message.find(
                "metadata key 'llama.expert_shared_count' is not supported (troupe's llama reads no such key)"),
            std::string::npos)
      << moe.error().message;
  spec.extra_tensor = "blk.0.attn_q.bias";
  auto bias = random_llama_config(spec);
  ASSERT_FALSE(bias);
  EXPECT_NE(bias.error().message.find("tensor 'blk.0.attn_q.bias' is not supported (troupe's llama reads no such tensor)"),
            std::string::npos)
      << bias.error().message;
}

TEST(Gguf, GemmaReadsItsWindowsCapsAndNormsAsLlamaCppDoes) {
  std::vector<testing::random_llama_family> families = testing::random_llama_families();
  const testing::random_llama_spec gemma2 = families[4].spec, gemma3 = families[5].spec;
  ASSERT_EQ(gemma2.arch, "gemma2");
  ASSERT_EQ(gemma3.arch, "gemma3");
  auto g2 = random_llama_config(gemma2);
  ASSERT_TRUE(g2) << g2.error().message;
  // gemma2: the file's window (6) and score cap (1); the default logit cap (30); every other
  // layer slides, turning as the global ones; GeGLU, post norms, a scaled embedding, tied.
  EXPECT_EQ(g2->activation, ffn_activation::gelu);
  EXPECT_TRUE(g2->scale_embedding && g2->post_norms && g2->shared_classifier);
  EXPECT_EQ(g2->sliding_window, 6);
  EXPECT_TRUE(g2->is_sliding(0));
  EXPECT_FALSE(g2->is_sliding(1));
  EXPECT_EQ(g2->attn_softcap, 1.0f);
  EXPECT_EQ(g2->final_softcap, 30.0f);
  EXPECT_EQ(g2->rope_freq_base_swa, 10000.0f);
  EXPECT_EQ(g2->attn_divisor, 0.0f);
  EXPECT_FALSE(g2->is_llama2c());
  // gemma3: Q/K norms, no score cap, no logit cap unless the file says; sliding layers at base
  // 10000 while the global ones turn at the file's 1000000; the pattern from the file (2).
  auto g3 = random_llama_config(gemma3);
  ASSERT_TRUE(g3) << g3.error().message;
  EXPECT_TRUE(g3->qk_norm);
  EXPECT_EQ(g3->attn_softcap, 0.0f);
  EXPECT_EQ(g3->final_softcap, 0.0f);
  EXPECT_EQ(g3->sliding_window, 5);
  EXPECT_TRUE(g3->is_sliding(0));
  EXPECT_FALSE(g3->is_sliding(1));
  EXPECT_EQ(g3->rope_freq_base, 1000000.0f);
  EXPECT_EQ(g3->rope_freq_base_swa, 10000.0f);
  // gemma3 without a window slides nowhere; with one and no pattern, 5 layers in 6.
  testing::random_llama_spec no_window = gemma3;
  no_window.sliding_window = no_window.sliding_window_pattern = 0;
  auto g3_global = random_llama_config(no_window);
  ASSERT_TRUE(g3_global) << g3_global.error().message;
  EXPECT_FALSE(g3_global->is_sliding(0));
  testing::random_llama_spec six = gemma3;
  six.sliding_window_pattern = 0;
  six.n_layers = 7;
  auto g3_six = random_llama_config(six);
  ASSERT_TRUE(g3_six) << g3_six.error().message;
  for (int32_t l = 0; l < 7; l++) EXPECT_EQ(g3_six->is_sliding(l), l != 5) << l;
  // The 27B shapes divide scores by sqrt(dim / heads): gemma2's 46 layers.
  testing::random_llama_spec big = gemma2;
  big.n_layers = 46;
  big.dim = 32, big.hidden_dim = 32, big.head_dim = 16;  // dim / heads = 8, heads 16 wide
  auto g2_27b = random_llama_config(big);
  ASSERT_TRUE(g2_27b) << g2_27b.error().message;
  EXPECT_EQ(g2_27b->attn_divisor, std::sqrt(8.0f));

  const std::vector<refusal> refused = {
      {gemma2, [](auto& m) { testing::set_key(m, "gemma2.attention.sliding_window", gguf_value::of_int(gguf_type::u32, 0)); },
       "gemma2.attention.sliding_window = 0 is out of range (1..1048576)"},
      {gemma3, [](auto& m) { testing::set_key(m, "gemma3.final_logit_softcapping", gguf_value::of_float(-1.0)); },
       "gemma3.final_logit_softcapping = -1 is out of range (a soft cap must be in (0, 10000])"},
      {gemma3, [](auto& m) { testing::set_key(m, "gemma3.expert_count", gguf_value::of_int(gguf_type::u32, 8)); },
       "metadata key 'gemma3.expert_count' is not supported (troupe's gemma3 reads no such key)"},
  };
  expect_refused(refused);
  // gemma2 classifies by its embedding: an output.weight, or Llama 3's rope_freqs.weight, is
  // a tensor llama.cpp's gemma2 does not read.
  for (const char* extra : {"output.weight", "rope_freqs.weight"}) {
    testing::random_llama_spec with = gemma2;
    with.extra_tensor = extra;
    auto c = random_llama_config(with);
    ASSERT_FALSE(c) << extra;
    EXPECT_NE(c.error().message.find("tensor '" + std::string(extra) + "' is not supported (troupe's gemma2 reads no such tensor)"),
              std::string::npos)
        << c.error().message;
  }
}

/// The tensor `name` of a random file's bytes, as float32.
std::vector<float> tensor_of(const std::string& bytes, const std::string& name) {
  auto f = parse_gguf(bytes, "x");
  EXPECT_TRUE(f);
  return tensor_floats(bytes, *f, *f->tensor(name));
}

TEST(Gguf, AMixtureOfExpertsReadsItsCountsAndExpertTensors) {
  std::vector<testing::random_llama_family> families = testing::random_llama_families();
  const testing::random_llama_spec mixtral = families[6].spec, qwen3moe = families[7].spec;
  ASSERT_EQ(mixtral.n_experts, 4);
  ASSERT_EQ(qwen3moe.arch, "qwen3moe");
  const std::string bytes = testing::random_llama_gguf(mixtral);
  const std::string path = write_temp("moe.gguf", bytes);
  auto ck = load_float32_views(path);
  fs::remove(path);
  ASSERT_TRUE(ck) << ck.error().message;
  const moe_weights* m = ck->moe();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->n_experts, 4);
  EXPECT_EQ(m->top_k, 2);
  EXPECT_EQ(m->router_bias, nullptr);
  EXPECT_EQ(ck->w().w1, nullptr);
  // Expert 3 of layer 1: rows 3 * 192 .. of ffn_gate_exps; the router's row 2 of layer 1.
  const std::vector<float> gate = tensor_of(bytes, "blk.1.ffn_gate_exps.weight");
  const std::vector<float> down = tensor_of(bytes, "blk.1.ffn_down_exps.weight");
  EXPECT_EQ(m->w1[m->expert_offset(ck->config(), 1, 3) + 5], gate[3 * 192 * 64 + 5]);
  EXPECT_EQ(m->w2[m->expert_offset(ck->config(), 1, 3) + 7], down[3 * 64 * 192 + 7]);
  EXPECT_EQ(m->router_weight[(4 + 2) * 64 + 1], tensor_of(bytes, "blk.1.ffn_gate_inp.weight")[2 * 64 + 1]);
  // qwen3moe's experts are expert_feed_forward_length wide.
  auto q = random_llama_config(qwen3moe, [](auto& meta) {
    testing::set_key(meta, "qwen3moe.feed_forward_length", gguf_value::of_int(gguf_type::u32, 768));
  });
  ASSERT_TRUE(q) << q.error().message;
  EXPECT_EQ(q->hidden_dim, 192);

  const std::vector<refusal> refused = {
      {mixtral, [](auto& m) { testing::set_key(m, "llama.expert_used_count", gguf_value::of_int(gguf_type::u32, 5)); },
       "llama.expert_used_count = 5 is more than expert_count 4"},
      {mixtral, [](auto& m) { testing::set_key(m, "llama.expert_count", gguf_value::of_int(gguf_type::u32, 1)); },
       "llama.expert_count = 1 is out of range (2..1048576)"},
      {mixtral, [](auto& m) { testing::set_key(m, "llama.expert_count", gguf_value::of_int(gguf_type::u32, 4096)); },
       "llama.expert_count = 4096 is out of range (2..1024)"},
      {mixtral, [](auto& m) { testing::set_key(m, "llama.expert_count", gguf_value::of_int(gguf_type::u32, 8)); },
       "tensor 'blk.0.ffn_gate_inp.weight' has shape [64, 4], expected [64, 8]"},
      {qwen3moe, [](auto& m) {
         m.erase(std::remove_if(m.begin(), m.end(), [](const auto& kv) { return kv.first == "qwen3moe.expert_count"; }),
                 m.end());
       },
       "no key 'qwen3moe.expert_count'"},
  };
  expect_refused(refused);
}

TEST(Gguf, EachArchitectureReadsItsOwnTensorsAndKeys) {
  testing::random_llama_spec qwen2, qwen3, phi3;  // dim 64, 4 heads, 2 KV heads, hidden 192
  qwen2.arch = "qwen2";
  qwen3.arch = "qwen3";
  qwen3.head_dim = 32;  // Q 128 wide over a width of 64
  phi3.arch = "phi3";
  const auto load = [](const std::string& bytes) {
    const std::string path = write_temp("arch.gguf", bytes);
    auto ck = load_float32_views(path);
    fs::remove(path);
    EXPECT_TRUE(ck) << ck.error().message;
    return std::move(*ck);
  };
  const std::string qwen2_bytes = testing::random_llama_gguf(qwen2);
  const checkpoint q2 = load(qwen2_bytes);
  EXPECT_EQ(q2.config().rope, rope_style::neox);
  EXPECT_TRUE(q2.config().qkv_bias);
  EXPECT_FALSE(q2.config().is_llama2c());
  EXPECT_EQ(q2.w().bk[32 + 5], tensor_of(qwen2_bytes, "blk.1.attn_k.bias")[5]);  // layer 1 of (2, kv_dim 32)
  EXPECT_EQ(q2.w().bv[7], tensor_of(qwen2_bytes, "blk.0.attn_v.bias")[7]);

  const std::string qwen3_bytes = testing::random_llama_gguf(qwen3);
  const checkpoint q3 = load(qwen3_bytes);
  EXPECT_EQ(q3.config().head_size(), 32);
  EXPECT_EQ(q3.config().q_dim(), 128);
  EXPECT_EQ(q3.config().kv_dim(), 64);
  EXPECT_TRUE(q3.config().qk_norm);
  EXPECT_EQ(q3.w().k_norm[32 + 3], tensor_of(qwen3_bytes, "blk.1.attn_k_norm.weight")[3]);
  EXPECT_EQ(q3.w().wo[64 * 128 + 127], tensor_of(qwen3_bytes, "blk.1.attn_output.weight")[127]);  // (dim, q_dim)

  // phi3's fused tensors split by rows: attn_qkv is Q's 64 rows, K's 32, V's 32; ffn_up the
  // gate's 192 rows, then the up projection's.
  const std::string phi3_bytes = testing::random_llama_gguf(phi3);
  const checkpoint p3 = load(phi3_bytes);
  const std::vector<float> qkv = tensor_of(phi3_bytes, "blk.1.attn_qkv.weight");
  const std::vector<float> up = tensor_of(phi3_bytes, "blk.1.ffn_up.weight");
  EXPECT_EQ(p3.w().wq[64 * 64 + 70], qkv[70]);
  EXPECT_EQ(p3.w().wk[32 * 64 + 70], qkv[64 * 64 + 70]);
  EXPECT_EQ(p3.w().wv[32 * 64 + 70], qkv[96 * 64 + 70]);
  EXPECT_EQ(p3.w().w1[192 * 64 + 70], up[70]);
  EXPECT_EQ(p3.w().w3[192 * 64 + 70], up[192 * 64 + 70]);
  // phi3's sliding window is read and ignored, as llama.cpp ignores it.
  EXPECT_TRUE(random_llama_config(phi3, [](auto& meta) {
    testing::set_key(meta, "phi3.attention.sliding_window", gguf_value::of_int(gguf_type::u32, 2047));
  }));

  const std::vector<refusal> refused = {
      {qwen2, [](auto& m) { testing::set_key(m, "qwen2.expert_count", gguf_value::of_int(gguf_type::u32, 8)); },
       "metadata key 'qwen2.expert_count' is not supported (troupe's qwen2 reads no such key)"},
      {qwen2, [](auto& m) { testing::set_key(m, "qwen2.attention.sliding_window", gguf_value::of_int(gguf_type::u32, 8)); },
       "metadata key 'qwen2.attention.sliding_window' is not supported"},
      {qwen3, [](auto& m) { testing::set_key(m, "qwen3.attention.value_length", gguf_value::of_int(gguf_type::u32, 16)); },
       "qwen3.attention.value_length = 16 is not supported (heads are 32 wide, and keys, values and RoPE span all of a "
       "head)"},
      {qwen3, [](auto& m) { testing::set_key(m, "qwen3.attention.key_length", gguf_value::of_int(gguf_type::u32, 33)); },
       "qwen3.attention.key_length = 33 is out of range (an even width in 2..1048576)"},
      {phi3, [](auto& m) { testing::set_key(m, "phi3.rope.dimension_count", gguf_value::of_int(gguf_type::u32, 8)); },
       "phi3.rope.dimension_count = 8 is not supported"},
      {phi3, [](auto& m) { testing::set_key(m, "general.architecture", gguf_value::of_string("falcon")); },
       "architecture 'falcon' is not supported (llama, qwen2, qwen3, qwen3moe, phi3, gemma2 and gemma3 are)"},
  };
  expect_refused(refused);
  // A qwen3 tensor in a qwen2 file is refused by name.
  testing::random_llama_spec mixed = qwen2;
  mixed.extra_tensor = "blk.0.attn_q_norm.weight";
  auto refused_tensor = random_llama_config(mixed);
  ASSERT_FALSE(refused_tensor);
  EXPECT_NE(refused_tensor.error().message.find("tensor 'blk.0.attn_q_norm.weight' is not supported (troupe's qwen2 "
                                                "reads no such tensor)"),
            std::string::npos)
      << refused_tensor.error().message;
}

TEST(Gguf, ToolsThatWriteLlama2cFilesRefuseModelsTheyCannotHold) {
  testing::random_llama_spec qwen2;
  qwen2.arch = "qwen2";
  const std::string path = write_temp("qwen2.gguf", testing::random_llama_gguf(qwen2));
  auto ck = load_float32_views(path);
  fs::remove(path);
  ASSERT_TRUE(ck) << ck.error().message;
  auto q = to_q80(*ck, 32);
  ASSERT_FALSE(q);
  EXPECT_EQ(q.error().code, errc::invalid_argument);
  EXPECT_NE(q.error().message.find("computes what a llama2.c-format file cannot hold (its RoPE, RMS epsilon, head "
                                   "width, biases or norms); quantize writes llama2.c-format models"),
            std::string::npos)
      << q.error().message;
}

TEST(Gguf, RopeAndRmsNormSettingsAreReadFromTheMetadata) {
  testing::random_llama_spec spec;  // heads of 16: 8 rotated pairs
  auto plain = random_llama_config(spec, [](auto& meta) {
    testing::erase_key(meta, "llama.rope.freq_base");
    testing::erase_key(meta, "llama.attention.layer_norm_rms_epsilon");
  });
  ASSERT_TRUE(plain) << plain.error().message;  // absent: llama2.c's (and llama.cpp's) defaults
  EXPECT_EQ(std::tie(plain->rope_freq_base, plain->rope_freq_scale, plain->rms_norm_eps), std::tuple(10000.0f, 1.0f, 1e-5f));
  EXPECT_TRUE(plain->rope_freq_factors.empty());
  spec.rope_freq_base = 500000.0f;
  spec.rms_norm_eps = 1e-6f;
  spec.llama3_factor = 8.0f;  // Llama 3.1's rope_scaling: low 1, high 4, original context 8192
  auto llama3 = random_llama_config(spec);
  ASSERT_TRUE(llama3) << llama3.error().message;
  EXPECT_EQ(std::tie(llama3->rope_freq_base, llama3->rope_freq_scale, llama3->rms_norm_eps),
            std::tuple(500000.0f, 1.0f, 1e-6f));
  // Wavelengths 2 pi * 500000^(i/16) for i = 0, 2, .. 14: 6.3 .. 862 keep their frequency
  // (shorter than 8192 / 4), 4443 is blended (1 / ((1 - s) / 8 + s) with s = (8192 / 4443 - 1) / 3),
  // the rest (longer than 8192 / 1) are slowed 8 times.
  const double wavelength = 2 * M_PI / (1.0 / std::pow(500000.0, 8.0 / 16)), smooth = (8192 / wavelength - 1) / 3;
  const std::vector<float> expected = {1, 1, 1, 1, static_cast<float>(1 / ((1 - smooth) / 8 + smooth)), 8, 8, 8};
  EXPECT_EQ(llama3->rope_freq_factors, expected);
  auto linear = random_llama_config({}, [](auto& meta) {
    testing::set_key(meta, "llama.rope.scaling.type", gguf_value::of_string("linear"));
    testing::set_key(meta, "llama.rope.scaling.factor", gguf_value::of_float(4.0f));
  });
  ASSERT_TRUE(linear) << linear.error().message;
  EXPECT_EQ(linear->rope_freq_scale, 0.25f);
  auto none = random_llama_config({}, [](auto& meta) {  // llama.cpp never scales with type none
    testing::set_key(meta, "llama.rope.scaling.type", gguf_value::of_string("none"));
    testing::set_key(meta, "llama.rope.scaling.factor", gguf_value::of_float(4.0f));
  });
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_EQ(none->rope_freq_scale, 1.0f);
  auto zero = random_llama_config({}, [](auto& meta) {  // 0 means no scaling to llama.cpp
    testing::set_key(meta, "llama.rope.scaling.factor", gguf_value::of_float(0.0f));
  });
  ASSERT_TRUE(zero) << zero.error().message;
  EXPECT_EQ(zero->rope_freq_scale, 1.0f);
}

TEST(Gguf, BadRopeAndRmsNormValuesAreRefusedNamingTheKey) {
  const float nan = std::nanf("");
  const auto with = [](const std::string& key, gguf_value value) {
    return [key, value](testing::gguf_metadata& meta) { testing::set_key(meta, key, value); };
  };
  const auto f = [](float x) { return gguf_value::of_float(x); };
  const auto u32 = [](int64_t x) { return gguf_value::of_int(gguf_type::u32, x); };
  const std::string eps = "llama.attention.layer_norm_rms_epsilon", base = "llama.rope.freq_base",
                    factor = "llama.rope.scaling.factor";
  const std::vector<std::pair<std::function<void(testing::gguf_metadata&)>, std::string>> cases = {
      {with(eps, f(0)), eps + " = 0 is out of range (an RMS-norm epsilon must be in (0, 1])"},
      {with(eps, f(-1e-5f)), eps + " = -1e-05 is out of range"},
      {with(eps, f(nan)), eps + " = nan is out of range"},
      {with(eps, f(2)), eps + " = 2 is out of range"},
      {with(eps, gguf_value::of_string("small")), "'" + eps + "'"},
      {with(base, f(-10000)), base + " = -10000 is out of range (a RoPE frequency base must be in (1, 1e+10])"},
      {with(base, f(nan)), base + " = nan is out of range"},
      {with(base, f(INFINITY)), base + " = inf is out of range"},
      {with(base, f(1)), base + " = 1 is out of range"},
      {with(base, f(1e11f)), base + " = 1e+11 is out of range"},
      {with(factor, f(-2)), factor + " = -2 is out of range (a RoPE scaling factor must be in (0, 1024])"},
      {with(factor, f(nan)), factor + " = nan is out of range"},
      {with(factor, f(5000)), factor + " = 5000 is out of range"},
      {with("llama.rope.scale_linear", f(-1)), "llama.rope.scale_linear = -1 is out of range"},
      {with("llama.rope.scaling.type", gguf_value::of_string("yarn")),
       "llama.rope.scaling.type 'yarn' is not supported (none and linear are; Llama 3's scaling is the tensor "
       "rope_freqs.weight)"},
      {with("llama.rope.dimension_count", u32(8)),
       "llama.rope.dimension_count = 8 is not supported (heads are 16 wide, and keys, values and RoPE span all of a "
       "head)"},
      // Heads of 32, which RoPE (rotating 16) would not span.
      {with("llama.attention.key_length", u32(32)),
       "llama.rope.dimension_count = 16 is not supported (heads are 32 wide"},
      {with("llama.attention.value_length", u32(32)), "llama.attention.value_length = 32 is not supported"},
  };
  for (const auto& [edit, message] : cases) {
    auto c = random_llama_config({}, edit);
    ASSERT_FALSE(c) << message;
    EXPECT_EQ(c.error().code, errc::malformed_file);
    EXPECT_NE(c.error().message.find(message), std::string::npos) << c.error().message;
  }
}

TEST(Gguf, BadLlama3RopeDivisorsAreRefusedNamingTheTensor) {
  testing::random_llama_spec spec;  // heads of 16: 8 rotated pairs
  for (const auto& [value, message] :
       {std::pair{std::nanf(""), "rope_freqs.weight[5] = nan is out of range (a RoPE frequency divisor must be in "
                                 "[1/1024, 1024])"},
        std::pair{5000.0f, "rope_freqs.weight[5] = 5000 is out of range"},
        std::pair{0.0f, "rope_freqs.weight[5] = 0 is out of range"},
        std::pair{-8.0f, "rope_freqs.weight[5] = -8 is out of range"}}) {
    spec.rope_freqs = {1, 1, 1, 1, 2, value, 8, 8};
    auto c = random_llama_config(spec);
    ASSERT_FALSE(c) << message;
    EXPECT_NE(c.error().message.find(message), std::string::npos) << c.error().message;
  }
  spec.rope_freqs = {1, 1, 1, 1, 2, 8, 8};
  auto short_tensor = random_llama_config(spec);
  ASSERT_FALSE(short_tensor);
  EXPECT_NE(short_tensor.error().message.find(
                "tensor 'rope_freqs.weight' must hold head_size / 2 = 8 values (one per rotated pair)"),
            std::string::npos)
      << short_tensor.error().message;
}

/// A GGUF file by hand: `meta` entries already encoded, one tensor of `type` with `data`.
struct raw_file {
  std::string bytes;
  void u32(uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    u64(s.size());
    bytes += s;
  }
};

std::string one_tensor_file(uint32_t type, std::vector<uint64_t> dims, const std::string& data, uint64_t offset = 0) {
  raw_file f;
  f.bytes = "GGUF";
  f.u32(3);
  f.u64(1);  // tensors
  f.u64(0);  // metadata
  f.str("t");
  f.u32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) f.u64(d);
  f.u32(type);
  f.u64(offset);
  f.bytes.resize((f.bytes.size() + 31) / 32 * 32, '\0');
  f.bytes += data;
  return f.bytes;
}

TEST(Gguf, F16AndQ8_0TensorsAreDequantizedExactly) {
  // 1, -2, 0.5, 65504 (largest half), 2^-24 (smallest subnormal), -0, +inf, 1/3 rounded to half.
  const uint16_t halves[] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x3555};
  const std::string f16 = one_tensor_file(1, {8}, std::string(reinterpret_cast<const char*>(halves), sizeof halves));
  auto f = parse_gguf(f16, "f16");
  ASSERT_TRUE(f) << f.error().message;
  const std::vector<float> v = tensor_floats(f16, *f, f->tensors[0]);
  const std::vector<float> want = {1.0f, -2.0f, 0.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f, INFINITY,
                                   0.333251953125f};
  ASSERT_EQ(v.size(), want.size());
  for (size_t i = 0; i < v.size(); i++) EXPECT_EQ(v[i], want[i]) << i;
  EXPECT_TRUE(std::signbit(v[5]));
  // Q8_0: one block, scale 0.5 (half 0x3800), values -128, -1, 0, 1, 127, then 27 zeros.
  std::string block("\x00\x38", 2);
  for (int8_t q : {-128, -1, 0, 1, 127}) block += static_cast<char>(q);
  block += std::string(27, '\0');
  const std::string q8 = one_tensor_file(8, {32}, block);
  auto g = parse_gguf(q8, "q8");
  ASSERT_TRUE(g) << g.error().message;
  const std::vector<float> d = tensor_floats(q8, *g, g->tensors[0]);
  EXPECT_EQ(std::vector<float>(d.begin(), d.begin() + 5), (std::vector<float>{-64.0f, -0.5f, 0.0f, 0.5f, 63.5f}));
}

TEST(Gguf, F16AndQ8_0TensorsAreWrittenAsGgmlRoundsThem) {
  // Nearest half, ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (rounds to 1);
  // 2^-25 halfway between 0 and 2^-24 (to 0); 65520 past the largest half (to +inf).
  const std::pair<float, uint16_t> halves[] = {
      {1.0f, 0x3c00},     {-2.0f, 0xc000},  {65504.0f, 0x7bff}, {65520.0f, 0x7c00}, {std::ldexp(1.0f, -24), 0x0001},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00}, {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},
      {std::ldexp(1.0f, -25), 0x0000}, {-0.0f, 0x8000}, {INFINITY, 0x7c00}, {std::nanf(""), 0x7e00}};
  for (const auto& [value, bits] : halves) EXPECT_EQ(float_to_half(value), bits) << value;
  // A Q8_0 block: scale max |x| / 127 stored as half, each value round(x / scale).
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); i++) x[i] = static_cast<float>(i) - 20.5f;  // block 0: -20.5 .. 10.5
  const std::string bytes = write_gguf({}, {{"q", {64}, x.data(), ggml_type::q8_0}, {"h", {64}, x.data(), ggml_type::f16}});
  auto f = parse_gguf(bytes, "w");
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->tensors[0].type, ggml_type::q8_0);
  EXPECT_EQ(f->tensors[0].num_bytes, 2u * 34u);
  const std::vector<float> q = tensor_floats(bytes, *f, f->tensors[0]);
  const float scale0 = 0.161376953125f;  // 20.5 / 127 = 0.16142 as the nearest half
  EXPECT_EQ(q[0], -127 * scale0);
  EXPECT_EQ(q[31], std::round(10.5f / (20.5f / 127)) * scale0);
  EXPECT_EQ(tensor_floats(bytes, *f, f->tensors[1]), x);  // halves hold these exactly
}

TEST(Gguf, EveryWeightTypeIsWrittenAndReadBackWithinItsStep) {
  // A ramp with a jump, 512 values (two K-quant super-blocks, 16 blocks of 32): each type's
  // encoder (ggml_encode.cpp) and ggml's dequantizer must agree to within half a level of the
  // block's range, plus the rounding of its f16 scales.
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); i++) x[i] = 0.01f * static_cast<float>(i % 97) - (i % 64 < 5 ? 2.0f : 0.3f);
  const std::pair<ggml_type, float> types[] = {{ggml_type::f32, 0.0f},     {ggml_type::f16, 1e-3f},
                                               {ggml_type::bf16, 8e-3f},   {ggml_type::q8_0, 0.02f},
                                               {ggml_type::q4_0, 0.17f},   {ggml_type::q4_k, 0.12f},
                                               {ggml_type::q5_k, 0.06f},   {ggml_type::q6_k, 0.04f}};
  for (const auto& [type, step] : types) {
    const std::string bytes = write_gguf({}, {{"t", {512}, x.data(), type}});
    auto f = parse_gguf(bytes, "w");
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ(f->tensors[0].num_bytes, static_cast<uint64_t>(kernels::cpu::row_bytes(type, 512)));
    const std::vector<float> y = tensor_floats(bytes, *f, f->tensors[0]);
    float worst = 0;
    for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, std::fabs(y[i] - x[i]));
    EXPECT_LE(worst, step) << kernels::cpu::type_name(type);
    if (step > 0) {
      EXPECT_GT(worst, step / 100) << kernels::cpu::type_name(type) << ": suspiciously exact";
    }
  }
}

TEST(Gguf, MalformedFilesAreErrorsNamingTheProblem) {
  const std::string four_floats(16, '\0');
  raw_file many;
  many.bytes = "GGUF";
  many.u32(3);
  many.u64(0);
  many.u64(1);
  many.str("k");
  many.u32(9);  // array
  many.u32(8);  // of strings
  many.u64(uint64_t{1} << 60);
  raw_file long_string;
  long_string.bytes = "GGUF";
  long_string.u32(3);
  long_string.u64(0);
  long_string.u64(1);
  long_string.u64(uint64_t{1} << 62);  // the key's length
  long_string.bytes += std::string(16, 'k');
  const std::pair<std::string, std::string> cases[] = {
      {"GGML" + std::string(20, '\0'), "not a GGUF file"},
      {"GGUF\x01\x00\x00\x00" + std::string(16, '\0'), "GGUF version 1 is not supported (2 and 3 are)"},
      {"GGUF\x03\x00\x00", "truncated while reading the version"},
      {many.bytes, "an array claims 1152921504606846976 elements, more than the file holds"},
      {long_string.bytes, "a metadata key claims 4611686018427387904 bytes, more than the file holds"},
      {one_tensor_file(3, {32}, std::string(20, '\0')), "tensor 't' has ggml type 3, which troupe does not read"},
      {one_tensor_file(15, {256}, std::string(292, '\0')), "has ggml type 15, which troupe does not read"},  // Q8_K
      {one_tensor_file(12, {128}, std::string(144, '\0')), "Q4_K tensor 't' has rows of 128 values, not a multiple of its block of 256"},
      {one_tensor_file(0, {4}, four_floats, 8), "starts at data offset 8, not a multiple of the alignment 32"},
      {one_tensor_file(0, {5}, four_floats), "tensor 't' (20 bytes at data offset 0) runs past the end of the file"},
      {one_tensor_file(0, {1, 1, 1, 1, 1}, four_floats), "tensor 't' has 5 dimensions (1 to 4 allowed)"},
      {one_tensor_file(0, {0}, four_floats), "tensor 't' has an empty or too large dimension"},
      {one_tensor_file(8, {16}, std::string(34, '\0')), "has rows of 16 values, not a multiple of its block of 32"},
  };
  for (const auto& [bytes, message] : cases) {
    auto f = parse_gguf(bytes, "bad.gguf");
    ASSERT_FALSE(f) << message;
    EXPECT_EQ(f.error().code, errc::malformed_file);
    EXPECT_NE(f.error().message.find(message), std::string::npos) << f.error().message;
    EXPECT_EQ(f.error().message.rfind("GGUF file 'bad.gguf': ", 0), 0u) << f.error().message;
  }
}

TEST(StringTable, FindsTheLowestIndexOfEachStringAndNothingElse) {
  string_table t;
  EXPECT_EQ(t.find("a"), -1);  // no index yet
  for (const char* s : {"", "a", "bc", "a", "\xc4\xa0the", "bc", "a much longer string than sixteen bytes"})
    t.push_back(s);
  t.build_index();
  t.check_invariants();
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[4], "\xc4\xa0the");
  EXPECT_EQ(t[0], "");
  EXPECT_EQ(t.find(""), 0);
  EXPECT_EQ(t.find("a"), 1);
  EXPECT_EQ(t.find("bc"), 2);
  EXPECT_EQ(t.find("a much longer string than sixteen bytes"), 6);
  EXPECT_EQ(t.find("b"), -1);
  EXPECT_EQ(t.find("abc"), -1);
  t.push_back("new");  // indexed again after more strings
  t.build_index();
  t.check_invariants();
  EXPECT_EQ(t.find("new"), 7);
  string_table empty;
  empty.build_index();
  empty.check_invariants();
  EXPECT_EQ(empty.find(""), -1);
}

TEST(Gguf, AnArrayHoldsEachElementTypeAndWritesBackTheSameBytes) {
  const std::vector<std::pair<std::string, gguf_value>> metadata = {
      {"s", gguf_value::of_array(gguf_type::string, {gguf_value::of_string(""), gguf_value::of_string("xyz")})},
      {"i", gguf_value::of_array(gguf_type::i8, {gguf_value::of_int(gguf_type::i8, -3), gguf_value::of_int(gguf_type::i8, 7)})},
      {"f", gguf_value::of_array(gguf_type::f32, {gguf_value::of_float(0.5f)})},
      {"b", gguf_value::of_array(gguf_type::boolean, {[] { gguf_value v; v.type = gguf_type::boolean; v.boolean = true; return v; }()})},
      {"n", gguf_value::of_array(gguf_type::array, {gguf_value::of_array(gguf_type::u16, {gguf_value::of_int(gguf_type::u16, 9)})})}};
  const std::string bytes = write_gguf(metadata, {});
  auto f = parse_gguf(bytes, "arrays");
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f->get_array("s", gguf_type::string, "x"))->string(1), "xyz");
  EXPECT_EQ((*f->get_array("s", gguf_type::string, "x"))->string(0), "");
  EXPECT_EQ((*f->get_array("i", gguf_type::i8, "x"))->integer(0), -3);
  EXPECT_EQ((*f->get_array("f", gguf_type::f32, "x"))->number(0), 0.5);
  EXPECT_EQ((*f->get_array("b", gguf_type::boolean, "x"))->integer(0), 1);
  EXPECT_TRUE((*f->get_array("b", gguf_type::boolean, "x"))->item(0).boolean);
  EXPECT_EQ((*f->get_array("n", gguf_type::array, "x"))->array(0).array.integer(0), 9);
  EXPECT_FALSE(f->get_array("s", gguf_type::i32, "x"));  // another element type
  std::vector<std::pair<std::string, gguf_value>> again;
  for (const auto& [key, value] : metadata) again.emplace_back(key, f->metadata.at(key));
  EXPECT_EQ(write_gguf(again, {}), bytes);
}

TEST(Gguf, EveryTruncationOfAValidFileIsAnErrorNotACrash) {
  std::vector<float> w(64, 1.0f);
  const std::string bytes =
      write_gguf({{"general.architecture", gguf_value::of_string("llama")},
                  {"a", gguf_value::of_array(gguf_type::string, {gguf_value::of_string("x"), gguf_value::of_string("yz")})},
                  {"b", gguf_value::of_int(gguf_type::i64, -5)},
                  {"c", gguf_value::of_float(0.25f)}},
                 {{"one", {8, 8}, w.data()}, {"two", {3}, w.data()}});
  auto whole = parse_gguf(bytes, "ok");
  ASSERT_TRUE(whole) << whole.error().message;
  EXPECT_EQ(*whole->get_int("b", "ok"), -5);
  EXPECT_EQ(*whole->get_float("c", "ok"), 0.25);
  EXPECT_EQ((*whole->get_array("a", gguf_type::string, "ok"))->string(1), "yz");
  EXPECT_FALSE(whole->get_int("a", "ok"));  // an array is not an integer
  EXPECT_EQ(whole->get_string("missing", "ok").error().message, "GGUF file 'ok': no metadata key 'missing'");
  EXPECT_EQ(whole->tensor("two")->offset, 256u);  // 64 floats, then the next 32-byte boundary
  for (size_t n = 0; n < bytes.size(); n++) EXPECT_FALSE(parse_gguf(bytes.substr(0, n), "cut")) << n;
}

TEST(Gguf, ModelsTroupeCannotRunAreRefusedNamingWhy) {
  const std::string good = bundled_gguf_bytes();
  auto f = parse_gguf(good, "x");
  ASSERT_TRUE(f);
  // Re-encode the bundled model's file with metadata entries changed (nullopt: removed) or one
  // tensor dropped.
  using changes = std::vector<std::pair<std::string, std::optional<gguf_value>>>;
  const auto rewrite_all = [&](const changes& changed, const std::string& drop = "") {
    std::vector<std::pair<std::string, gguf_value>> meta;
    for (const auto& [k, v] : f->metadata)
      if (std::none_of(changed.begin(), changed.end(), [&k = k](const auto& c) { return c.first == k; }))
        meta.emplace_back(k, v);
    for (const auto& [key, value] : changed)
      if (value) meta.emplace_back(key, *value);
    std::vector<std::vector<float>> data;
    std::vector<gguf_tensor_data> tensors;
    for (const gguf_tensor& t : f->tensors) {
      if (t.name == drop) continue;
      data.push_back(tensor_floats(good, *f, t));
      tensors.push_back({t.name, t.dims, nullptr});
    }
    for (size_t i = 0; i < tensors.size(); i++) tensors[i].data = data[i].data();
    return write_gguf(meta, tensors);
  };
  const auto rewrite = [&](const std::string& key, std::optional<gguf_value> value, const std::string& drop = "") {
    return rewrite_all({{key, value}}, drop);
  };
  // A 9 KB file whose metadata claims 2^20 layers of width 2^20: today's loader reserved the
  // 6 * 2^60 floats that implies before reading a tensor ("C++ exception with description
  // "vector::reserve" thrown in the test body").
  const auto huge = gguf_value::of_int(gguf_type::u32, 1 << 20);
  const std::string claims_too_much =
      rewrite_all({{"llama.embedding_length", huge}, {"llama.block_count", huge}, {"llama.feed_forward_length", huge},
                   {"llama.rope.dimension_count", std::nullopt}});
  const std::tuple<std::string, std::string, const char*> cases[] = {
      {"arch", rewrite("general.architecture", gguf_value::of_string("gpt2")), "architecture 'gpt2' is not supported"},
      {"layers", rewrite("llama.block_count", std::nullopt), "no metadata key 'llama.block_count'"},
      {"missing", rewrite("", std::nullopt, "blk.3.ffn_up.weight"), "no tensor 'blk.3.ffn_up.weight'"},
      {"heads", rewrite("llama.attention.head_count", gguf_value::of_int(gguf_type::u32, 5)),
       "dim 64 is not a multiple of n_heads 5"},
      {"huge", claims_too_much, "layers, feed_forward_length 1048576) implies more weights than its "},
  };
  for (const auto& [name, bytes, message] : cases) {
    const std::string path = write_temp(name + ".gguf", bytes);
    auto ck = checkpoint::load(path);
    fs::remove(path);
    ASSERT_FALSE(ck) << name;
    EXPECT_NE(ck.error().message.find(message), std::string::npos) << ck.error().message;
  }
  auto tok = tokenizer::from_bytes(rewrite("tokenizer.ggml.model", gguf_value::of_string("bert")), 512, "t.gguf");
  ASSERT_FALSE(tok);
  EXPECT_NE(tok.error().message.find("tokenizer.ggml.model 'bert' is not supported (llama, SentencePiece-style, and "
                                     "gpt2, byte-level BPE, are)"),
            std::string::npos)
      << tok.error().message;
  auto bos = tokenizer::from_bytes(rewrite("tokenizer.ggml.bos_token_id", gguf_value::of_int(gguf_type::u32, 5)), 512,
                                   "t.gguf");
  ASSERT_FALSE(bos);
  EXPECT_NE(bos.error().message.find("tokenizer.ggml.bos_token_id = 5"), std::string::npos);
  EXPECT_FALSE(tokenizer::from_bytes(good, 513, "t.gguf"));  // a vocabulary of another size
}

/// The bundled vocabulary as GGUF metadata with Phi-3's kind of added tokens after its 512:
/// 512 "<|endoftext|>" (control), 513 "<|assistant|>" (user-defined), 514 "<|end|>" (control),
/// EOS 512 (Phi-3's is 32000, its first added token); `edit` may change the metadata.
std::string phi3_like_vocab(const std::function<void(testing::gguf_metadata&)>& edit = {}) {
  const std::string bundled = bundled_gguf_bytes();
  auto f = parse_gguf(bundled, "x");
  EXPECT_TRUE(f);
  testing::gguf_metadata meta;
  for (const auto& [key, value] : f->metadata)
    if (key.rfind("tokenizer.", 0) == 0) meta.emplace_back(key, value);
  for (auto& [key, value] : meta) {
    if (key == "tokenizer.ggml.tokens")
      for (const char* text : {"<|endoftext|>", "<|assistant|>", "<|end|>"}) value.array.push_back(gguf_value::of_string(text));
    if (key == "tokenizer.ggml.scores")
      for (int i = 0; i < 3; i++) value.array.push_back(gguf_value::of_float(0.0f));
    if (key == "tokenizer.ggml.token_type")
      for (int type : {3, 4, 3}) value.array.push_back(gguf_value::of_int(gguf_type::i32, type));
  }
  testing::set_key(meta, "tokenizer.ggml.eos_token_id", gguf_value::of_int(gguf_type::u32, 512));
  if (edit) edit(meta);
  return write_gguf(meta, {});
}

TEST(GgufVocab, APhi3StyleVocabularyWithItsOwnEosLoadsAndEndsAtItsEndTokens) {
  auto tok = tokenizer::from_bytes(phi3_like_vocab(), 515, "phi3.gguf");
  ASSERT_TRUE(tok) << tok.error().message;
  EXPECT_EQ(tok->eos_id(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  // EOS by metadata, "<|end|>" by name (llama.cpp's end-of-generation list); BOS ends nothing,
  // as in llama.cpp.
  EXPECT_EQ(tok->end_ids(), (std::vector<int32_t>{512, 514}));
  EXPECT_TRUE(tok->is_control(512));
  EXPECT_FALSE(tok->is_control(513));
  EXPECT_TRUE(tok->is_control(514));
  EXPECT_EQ(tok->decode({514}), "");
  auto ids = tok->encode("<|end|><|endoftext|>", true, false);  // text never becomes a control token
  ASSERT_TRUE(ids);
  EXPECT_TRUE(std::none_of(ids->begin(), ids->end(), [](int32_t id) { return id == 512 || id == 514; }));
  EXPECT_TRUE(tok->adds_bos());
  auto no_bos = tokenizer::from_bytes(phi3_like_vocab([](auto& meta) {
                                        gguf_value no;
                                        no.type = gguf_type::boolean;
                                        testing::set_key(meta, "tokenizer.ggml.add_bos_token", no);
                                      }),
                                      515, "phi3.gguf");
  ASSERT_TRUE(no_bos) << no_bos.error().message;
  EXPECT_FALSE(no_bos->adds_bos());
  // The bundled llama2.c vocabulary keeps llama2.c's ends, BOS and EOS.
  auto bundled = tokenizer::load(bundled_tokenizer(), 512);
  ASSERT_TRUE(bundled);
  EXPECT_EQ(bundled->end_ids(), (std::vector<int32_t>{1, 2}));
}

TEST(GgufVocab, EotAndEomIdsFromTheMetadataEndGeneration) {
  auto tok = tokenizer::from_bytes(phi3_like_vocab([](auto& meta) {
                                     testing::set_key(meta, "tokenizer.ggml.eot_token_id", gguf_value::of_int(gguf_type::u32, 300));
                                     testing::set_key(meta, "tokenizer.ggml.eom_token_id", gguf_value::of_int(gguf_type::u32, 301));
                                     testing::set_key(meta, "tokenizer.ggml.padding_token_id", gguf_value::of_int(gguf_type::u32, 302));
                                   }),
                                   515, "phi3.gguf");
  ASSERT_TRUE(tok) << tok.error().message;
  EXPECT_EQ(tok->end_ids(), (std::vector<int32_t>{300, 301, 512, 514}));  // padding and BOS end nothing
  // A Llama-3-style BPE vocabulary: BOS 256 "<|begin_of_text|>", EOS 257 "<|eot_id|>".
  testing::random_llama_spec spec;
  auto llama = tokenizer::from_bytes(testing::random_llama_gguf(spec), 313, "llama3.gguf");
  ASSERT_TRUE(llama) << llama.error().message;
  EXPECT_EQ(llama->end_ids(), (std::vector<int32_t>{257}));
}

TEST(GgufVocab, BadEndIdsAreRefusedNamingTheKey) {
  const auto with = [](const std::string& key, int64_t id) {
    return phi3_like_vocab([key, id](auto& meta) { testing::set_key(meta, key, gguf_value::of_int(gguf_type::u32, id)); });
  };
  const std::pair<std::string, std::string> cases[] = {
      {with("tokenizer.ggml.eos_token_id", 513),
       "tokenizer.ggml.eos_token_id = 513; troupe's llama vocabulary needs 2 or a control token (type 3) after the "
       "byte tokens"},
      {with("tokenizer.ggml.eos_token_id", 515), "tokenizer.ggml.eos_token_id = 515; troupe's llama vocabulary needs"},
      {with("tokenizer.ggml.eos_token_id", 100), "tokenizer.ggml.eos_token_id = 100; troupe's llama vocabulary needs"},
      {with("tokenizer.ggml.bos_token_id", 512), "tokenizer.ggml.bos_token_id = 512; troupe's llama vocabulary needs 1"},
      {with("tokenizer.ggml.eot_token_id", 515), "tokenizer.ggml.eot_token_id = 515, outside the vocabulary of 515"},
      {with("tokenizer.ggml.eom_token_id", 9999), "tokenizer.ggml.eom_token_id = 9999, outside the vocabulary of 515"},
      {with("tokenizer.ggml.padding_token_id", 515), "tokenizer.ggml.padding_token_id = 515, outside the vocabulary"},
      {phi3_like_vocab([](auto& meta) { testing::set_key(meta, "tokenizer.ggml.add_bos_token", gguf_value::of_int(gguf_type::u32, 1)); }),
       "tokenizer.ggml.add_bos_token is not a boolean"},
  };
  for (const auto& [bytes, message] : cases) {
    auto tok = tokenizer::from_bytes(bytes, 515, "phi3.gguf");
    ASSERT_FALSE(tok) << message;
    EXPECT_EQ(tok.error().code, errc::malformed_file);
    EXPECT_NE(tok.error().message.find(message), std::string::npos) << tok.error().message;
  }
}

}  // namespace
}  // namespace troupe::model
