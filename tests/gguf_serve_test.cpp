// One model of each family troupe serves (issue 48), served as `troupe serve -m X.gguf
// --http-port 0`: the official `openai` npm client's greedy completion
// (tests/clients/openai_completion.cjs), whole and streamed, is llama.cpp's text byte for byte,
// and so is what `troupe generate -m X.gguf` prints.
// The models are random_llama_families()'s in F16, written under the build tree; llama.cpp (npm
// node-llama-cpp 3.21.1 through tests/clients/llama_oracle.mjs, one node process for all)
// tokenizes the prompt text, runs greedily and detokenizes its tokens up to the first end of
// generation. F16, because there troupe's logits differ from llama.cpp's by at most ~0.03
// (tests/llama_oracle_test.cpp), far below llama.cpp's smallest lead on these runs (printed):
// running free, the two must choose the same tokens. Without node or the packages the test
// skips, naming what is missing.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/npm_packages.hpp"
#include "tests/support/random_llama.hpp"
#include "tests/support/server_process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// Each family's prompt: two-letter tokens of the synthetic vocabulary and byte tokens (the
/// spaces), after BOS for llama3, phi3 and gemma (qwen's vocabularies add none). Random models
/// meet near ties (tests/llama_oracle_test.cpp), so these are picked from 150 random such prompts
/// per family: llama.cpp's smallest lead on each run is 0.22 or more (8 times F16's difference),
/// and each runs 32 tokens or more before an end of generation (gemma's, mixtral's, qwen3moe's:
/// among those, one with more than a few distinct tokens). qwen3's ends after 33 (finish "stop"), the others run to max_tokens (finish
/// "length").
const std::map<std::string, std::string> prompts = {
    {"llama3", "da ej"},        {"qwen2", "eh db ei bh"}, {"qwen3", "de bb cj ag"},   {"phi3", "ba ef"},
    {"mixtral", "ak dg aa ej"}, {"qwen3moe", "bf ai"},    {"gemma2", "eh dc cd cd"}, {"gemma3", "bc cj"}};
constexpr int32_t max_tokens = 40;
/// Each family's text must span at least this many tokens before any end of generation.
constexpr size_t num_compared_tokens_min = 32;

/// What `openai_completion.cjs` prints for `troupe serve -m model`'s greedy completion of
/// `prompt`; the server's FIFO and logs go in `dir`.
void serve_completion(const fs::path& dir, const std::string& model, const std::string& prompt, json& out) {
  fs::create_directories(dir);
  server_process server(dir, {"serve", "-m", model, "--port", "0", "--http-port", "0"});
  ASSERT_TRUE(server.started());
  const std::string startup = server.read_until(http_listening_line);
  const std::string url = http_url_in(startup);
  ASSERT_FALSE(url.empty()) << startup << server.err();
  const cli_result r =
      run_node("tests/clients/openai_completion.cjs", {url + "/v1", prompt, std::to_string(max_tokens)}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err << server.err();
  out = json::parse(r.out);
}

/// llama.cpp's smallest lead of its top token over the next (in logits) in the first `num_steps`
/// steps of `answer` (llama_oracle.mjs's "top").
double smallest_lead(const json& answer, size_t num_steps) {
  double lead = 1e30;
  for (size_t step = 0; step < num_steps; step++) {
    const json& best = answer["top"][step];
    if (best.size() > 1) lead = std::min(lead, best[0][1].get<double>() - best[1][1].get<double>());
  }
  return lead;
}

TEST(GgufServe, TheOpenaiClientAndGenerateGetLlamaCppsGreedyTextFromOneModelOfEachFamily) {
  const fs::path dir = fs::path(TROUPE_BUILD_DIR) / "gguf_serve";
  fs::remove_all(dir);  // an earlier run's FIFOs
  fs::create_directories(dir);
  if (const std::string missing = npm_package_missing("node-llama-cpp@3.21.1 and openai@4", dir); !missing.empty())
    GTEST_SKIP() << missing;
  std::vector<random_llama_family> families = random_llama_families();
  json requests = json::array();
  for (random_llama_family& f : families) {
    f.spec.type = model::ggml_type::f16;
    const std::string path = (dir / (f.name + "_f16.gguf")).string();
    std::ofstream(path, std::ios::binary) << random_llama_gguf(f.spec);
    requests.push_back({{"model", path}, {"prompt", prompts.at(f.name)}, {"n", max_tokens}, {"top", 2}});
  }
  const std::string cases_path = (dir / "cases.json").string();
  std::ofstream(cases_path) << requests.dump();
  const cli_result oracle = run_node("tests/clients/llama_oracle.mjs", {cases_path}, dir);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.err;
  std::istringstream lines(oracle.out);
  for (const random_llama_family& f : families) {
    SCOPED_TRACE(f.name);
    const std::string model = (dir / (f.name + "_f16.gguf")).string();
    const std::string& prompt = prompts.at(f.name);
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << "llama.cpp answered fewer than " << families.size() << " models\n"
                                           << oracle.err;
    const json answer = json::parse(line);
    // The server reads the prompt as llama.cpp does: troupe's tokenizer from the same file.
    int32_t vocab_size = 0;
    random_llama_vocab(f.spec, &vocab_size);
    const auto tok = tokenizer::load(model, vocab_size);
    ASSERT_TRUE(tok) << tok.error().message;
    const auto ids = tok->encode(prompt, tok->adds_bos(), /*add_eos=*/false);
    ASSERT_TRUE(ids) << ids.error().message;
    EXPECT_EQ(*ids, answer["prompt"].get<std::vector<int32_t>>());

    json served;
    ASSERT_NO_FATAL_FAILURE(serve_completion(dir / f.name, model, prompt, served));
    // Troupe stops at an end of generation, llama.cpp's oracle runs on past it.
    const int32_t eog = answer["eog"].get<int32_t>();
    const json expected = {{"text", answer["text"]}, {"finish_reason", eog < 0 ? "length" : "stop"}};
    const size_t num_text_tokens = eog < 0 ? static_cast<size_t>(max_tokens) : static_cast<size_t>(eog);
    const size_t num_chosen = std::min(num_text_tokens + 1, static_cast<size_t>(max_tokens));  // and the end
    std::printf("%-6s %zu tokens, finish %s; llama.cpp's smallest lead %.3g\n  llama.cpp: %s\n  whole:     %s\n"
                "  streamed:  %s\n",
                f.name.c_str(), num_text_tokens, expected["finish_reason"].get<std::string>().c_str(),
                smallest_lead(answer, num_chosen), answer["text"].dump().c_str(), served["whole"].dump().c_str(),
                served["streamed"].dump().c_str());
    EXPECT_GE(num_text_tokens, num_compared_tokens_min);
    EXPECT_EQ(served["whole"], expected);
    EXPECT_EQ(served["streamed"], expected);
    // `troupe generate` prints the same text, through the actors and through the reference
    // generator.
    for (const bool reference : {false, true}) {
      std::vector<std::string> args = {"generate", "-m", model, "-i", prompt, "--no-echo", "-t", "0", "-n",
                                       std::to_string(max_tokens)};
      if (reference) args.push_back("--reference");
      const cli_result g = run_troupe(args, dir);
      EXPECT_EQ(g.exit_code, 0) << g.err;
      EXPECT_EQ(g.out, answer["text"].get<std::string>() + "\n") << (reference ? "generate --reference" : "generate");
    }
  }
}

}  // namespace
}  // namespace troupe::testing
