// llama.cpp's vocabulary tests: every ggml-vocab-*.gguf in the shared data's vocab/ directory
// (found by listing it, so a vocabulary dropped in is tested too) tokenizes its FILE.inp texts
// into exactly the ids of FILE.out (add_special = false, parse_special = false), decodes back
// to the text, and streams the same text.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/common/gguf.hpp"
#include "runtime/sampling/random_stream.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/stream_detokenizer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/golden.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

/// FILE.inp: texts, each followed by a line "__ggml_vocab_test__".
std::vector<std::string> vocab_inputs(const std::string& text) {
  std::vector<std::string> out;
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::size_t begin = 0;
  for (std::size_t at; (at = text.find(sep, begin)) != std::string::npos; begin = at + sep.size())
    out.push_back(text.substr(begin, at - begin));
  return out;
}

/// FILE.out: one line per text, each id preceded by a space.
std::vector<std::string> vocab_outputs(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// The vocabularies under `dir`, by file name.
std::vector<std::string> vocab_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ggml-vocab-", 0) == 0 && e.path().extension() == ".gguf") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The tokenizer of a ggml-vocab-*.gguf file (its `tokenizer.ggml.*` metadata).
expected<tokenizer> vocab_tokenizer(const std::string& path, const std::string& bytes) {
  auto f = model::parse_gguf(bytes, path);
  if (!f) return tl::unexpected(f.error());
  auto tokens = f->get_array("tokenizer.ggml.tokens", model::gguf_type::string, path);
  if (!tokens) return tl::unexpected(tokens.error());
  return tokenizer::from_bytes(bytes, static_cast<std::int32_t>((*tokens)->size()), path);
}

/// Tokenizes one vocabulary's cases; returns the number of mismatches (each also reported).
int check_vocabulary(const std::string& path) {
  SCOPED_TRACE(path);
  const std::string bytes = testing::read_file(path);
  auto tok = vocab_tokenizer(path, bytes);
  EXPECT_TRUE(tok) << tok.error().message;
  if (!tok) return 1;
  tok->check_invariants();
  const std::vector<std::string> inputs = vocab_inputs(testing::read_file(path + ".inp"));
  const std::vector<std::string> outputs = vocab_outputs(testing::read_file(path + ".out"));
  EXPECT_EQ(inputs.size(), outputs.size());
  EXPECT_GT(inputs.size(), 10u);
  int mismatches = 0;
  for (std::size_t i = 0; i < std::min(inputs.size(), outputs.size()); i++) {
    auto ids = tok->encode(inputs[i], false, false);
    EXPECT_TRUE(ids) << i << ": " << ids.error().message;
    if (!ids) continue;
    std::string got;
    for (std::int32_t id : *ids) got += " " + std::to_string(id);
    if (got != outputs[i]) mismatches++;
    EXPECT_EQ(got, outputs[i]) << "case " << i << ": '" << inputs[i] << "'";
    // Decoding is lossless, but for SentencePiece's dummy-prefix space.
    const std::string want = tok->spm() && !inputs[i].empty() ? " " + inputs[i] : inputs[i];
    EXPECT_EQ(tok->decode(*ids), want) << "case " << i;
    stream_detokenizer stream(*tok);
    std::string streamed;
    for (std::int32_t id : *ids) streamed += stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, want) << "case " << i;
  }
  return mismatches;
}

TEST(Vocab, EveryLlamaCppVocabularyTokenizesItsTestCasesExactly) {
  TROUPE_SHARED_DATA_OR_SKIP(dir, "vocab");
  const std::vector<std::string> files = vocab_files(dir);
  ASSERT_FALSE(files.empty()) << "no ggml-vocab-*.gguf in " << dir;
  for (const std::string& path : files) {
    EXPECT_EQ(check_vocabulary(path), 0) << path;
    std::printf("[ vocab    ] %s\n", fs::path(path).filename().c_str());
  }
}

/// A request's text built at random from every special token's text (control and
/// user-defined), pieces of them and ordinary characters.
std::string hostile_text(const tokenizer& tok, const std::vector<std::int32_t>& specials, sampling::random_stream& rng) {
  static const std::vector<std::string> ordinary = {"<", "|", ">", "\n", " ", "a", "think", "\xe2\x82\xac", "[", "]"};
  std::string text;
  const auto n = static_cast<int64_t>(rng.uniform_below(16));
  for (int64_t i = 0; i < n; i++) {
    if (rng.uniform_below(3) == 0) {
      text += ordinary[rng.uniform_below(ordinary.size())];
      continue;
    }
    std::string piece(tok.piece_text(specials[rng.uniform_below(specials.size())]));
    if (rng.uniform_below(4) == 0) piece = piece.substr(0, rng.uniform_below(piece.size() + 1));  // a part of one
    text += piece;
  }
  return text;
}

// Issue 47 (provenance): on every vocabulary of the shared data, text from a request (any role:
// user or tool segments, or a plain prompt) built from every special token's text never
// yields a special token id — user-defined ones included (before this change a BPE
// vocabulary cut them out of any text, as llama.cpp does) — while a template segment spelling
// one yields it.
TEST(Vocab, RequestTextMadeOfSpecialTokenTextsNeverYieldsASpecialId) {
  TROUPE_SHARED_DATA_OR_SKIP(dir, "vocab");
  for (const std::string& path : vocab_files(dir)) {
    SCOPED_TRACE(path);
    const std::string bytes = testing::read_file(path);
    auto tok = vocab_tokenizer(path, bytes);
    ASSERT_TRUE(tok) << tok.error().message;
    std::vector<std::int32_t> specials;
    for (std::int32_t id = 0; id < tok->vocab_size(); id++)
      if (tok->is_special(id) && !tok->piece_text(id).empty()) specials.push_back(id);
    ASSERT_FALSE(specials.empty());
    int64_t num_encoded = 0;
    for (uint64_t seed = 0; seed < 200; seed++) {
      sampling::random_stream rng(seed, 0, 0);
      const std::string text = hostile_text(*tok, specials, rng);
      for (const origin from : {origin::user, origin::tool}) {
        auto ids = encode_segments(*tok, {segment{text, from}}, /*add_bos=*/false);
        if (!ids) continue;  // a byte the vocabulary cannot spell: a clear error
        num_encoded++;
        for (const std::int32_t id : *ids) EXPECT_FALSE(tok->is_special(id)) << "seed " << seed << " id " << id;
        EXPECT_EQ(*ids, *tok->encode(text, false, false));
      }
    }
    EXPECT_GT(num_encoded, 200) << path;
    // A template's text names them: each special token's text alone is a special token (itself,
    // or the lowest id of the tokens that share its text without surrounding whitespace).
    for (const std::int32_t id : specials) {
      const std::string text(tok->piece_text(id));
      if (text.find_first_not_of(" \n\t\r") == std::string::npos) continue;  // blank: not nameable
      auto ids = encode_segments(*tok, {segment{text, origin::template_text}}, false);
      ASSERT_TRUE(ids) << ids.error().message;
      EXPECT_TRUE(std::any_of(ids->begin(), ids->end(), [&](std::int32_t t) { return tok->is_special(t); }))
          << path << " token " << id;
    }
    std::printf("[ vocab    ] %s: %zu special tokens\n", fs::path(path).filename().c_str(), specials.size());
  }
}

}  // namespace
}  // namespace troupe
