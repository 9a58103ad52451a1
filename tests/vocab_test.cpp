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

#include "runtime/model/gguf.hpp"
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

/// Tokenizes one vocabulary's cases; returns the number of mismatches (each also reported).
int check_vocabulary(const std::string& path) {
  SCOPED_TRACE(path);
  const std::string bytes = testing::read_file(path);
  auto f = model::parse_gguf(bytes, path);
  EXPECT_TRUE(f) << f.error().message;
  if (!f) return 1;
  const auto vocab = static_cast<std::int32_t>((*f->get_array("tokenizer.ggml.tokens", model::gguf_type::string, path))->size());
  auto tok = tokenizer::from_bytes(bytes, vocab, path);
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
  const std::string dir = testing::shared_data_dir() + "/vocab";
  if (!fs::is_directory(dir))
    GTEST_SKIP() << "needs " << dir << ", absent (the project's shared data; set TROUPE_DATA_DIR to its directory)";
  const std::vector<std::string> files = vocab_files(dir);
  ASSERT_FALSE(files.empty()) << "no ggml-vocab-*.gguf in " << dir;
  for (const std::string& path : files) {
    EXPECT_EQ(check_vocabulary(path), 0) << path;
    std::printf("[ vocab    ] %s\n", fs::path(path).filename().c_str());
  }
}

}  // namespace
}  // namespace troupe
