#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/golden.hpp"

namespace troupe::generate {
namespace {

/// The bundled model and tokenizer, loaded once for the whole binary.
class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ck = model::checkpoint::load(testing::bundled_model());
    ASSERT_TRUE(ck) << ck.error().message;
    checkpoint_ = new model::checkpoint(std::move(*ck));
    auto tok = tokenizer::load(testing::bundled_tokenizer(), checkpoint_->config().vocab_size);
    ASSERT_TRUE(tok) << tok.error().message;
    tokenizer_ = new tokenizer(std::move(*tok));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete checkpoint_;
  }

  static generate_params from_bos(int32_t max_new_tokens, float temperature, uint64_t seed) {
    generate_params p;
    p.prompt = {tokenizer::bos};
    p.max_new_tokens = max_new_tokens;
    p.sampling.temperature = temperature;
    p.seed = seed;
    return p;
  }

  static const model::model_config& config() { return checkpoint_->config(); }

  static model::checkpoint* checkpoint_;
  static tokenizer* tokenizer_;
};

model::checkpoint* Generate::checkpoint_ = nullptr;
tokenizer* Generate::tokenizer_ = nullptr;

struct golden_run {
  const char* case_name;  ///< in derived/token_ids_by_case.json
  const char* text_file;  ///< in golden/
  int32_t steps;          ///< llama2.c's -n (its default is 256)
};

const golden_run golden_runs[] = {
    {"t0_n200", "llama2c_test_all__t0_n200.txt", 200},
    {"t0_default256", "llama2c_doc__t0_default256.txt", 256},
};

TEST_F(Generate, GreedyFromBosMatchesLlama2cTextAndIds) {
  for (const golden_run& run : golden_runs) {
    const std::string golden_file = std::string("stories260K/golden/") + run.text_file;
    const std::string text = testing::read_file(testing::test_data(golden_file));
    const testing::golden_case golden = testing::golden(run.case_name);
    ASSERT_EQ(golden.token_ids.front(), tokenizer::bos);
    const std::vector<int32_t> ids(golden.token_ids.begin() + 1, golden.token_ids.end());
    ASSERT_EQ(ids.size(), static_cast<size_t>(run.steps)) << run.case_name;
    for (auto path : {model::kernel_path::reference, model::kernel_path::fast}) {
      model::transformer t(*checkpoint_, path);
      auto out = generate(t, *tokenizer_, from_bos(run.steps, 0.0f, 7));
      ASSERT_TRUE(out) << out.error().message;
      EXPECT_EQ(out->text, text) << run.case_name;
      EXPECT_EQ(out->text, golden.text) << run.case_name;
      EXPECT_EQ(out->tokens, ids) << run.case_name;
      EXPECT_EQ(out->logprobs.size(), ids.size()) << run.case_name;
    }
  }
}

TEST_F(Generate, CallbackStreamsExactlyTheResult) {
  model::transformer t(*checkpoint_);
  for (float temperature : {0.0f, 1.0f}) {
    std::string streamed;
    std::vector<int32_t> tokens;
    auto on_token = [&](int32_t token, const std::string& text) {
      tokens.push_back(token);
      streamed += text;
    };
    auto out = generate(t, *tokenizer_, from_bos(256, temperature, 133742), on_token);
    ASSERT_TRUE(out) << out.error().message;
    EXPECT_FALSE(out->text.empty());
    EXPECT_EQ(streamed, out->text) << temperature;
    EXPECT_EQ(tokens, out->tokens) << temperature;
  }
}

TEST_F(Generate, PromptIsNotPartOfTheOutput) {
  auto prompt = tokenizer_->encode("There was a big", /*add_bos=*/true, /*add_eos=*/false);
  ASSERT_TRUE(prompt);
  generate_params p = from_bos(20, 0.0f, 0);
  p.prompt = *prompt;
  model::transformer t(*checkpoint_);
  auto out = generate(t, *tokenizer_, p);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(out->tokens.size(), 20u);
  std::vector<int32_t> all = *prompt;
  all.insert(all.end(), out->tokens.begin(), out->tokens.end());
  EXPECT_EQ(tokenizer_->decode(*prompt) + out->text, tokenizer_->decode(all));
  EXPECT_EQ(out->text.rfind(", red ball.", 0), 0u) << out->text;
}

TEST_F(Generate, SeededSamplingIsReproducible) {
  model::transformer t(*checkpoint_);
  generate_params p = from_bos(200, 1.0f, 42);
  p.sampling.top_p = 0.9f;
  auto a = generate(t, *tokenizer_, p);
  auto b = generate(t, *tokenizer_, p);
  p.seed = 43;
  auto c = generate(t, *tokenizer_, p);
  ASSERT_TRUE(a && b && c);
  EXPECT_GT(a->tokens.size(), 20u);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->logprobs, b->logprobs);
  EXPECT_EQ(a->text, b->text);
  EXPECT_NE(a->tokens, c->tokens);
  EXPECT_NE(a->text, c->text);
}

TEST_F(Generate, StopsAtEndOfSequenceUnlessIgnored) {
  // Greedy from BOS ends a story with BOS before 511 tokens (llama2.c stops there too).
  model::transformer t(*checkpoint_);
  auto stopped = generate(t, *tokenizer_, from_bos(511, 0.0f, 0));
  ASSERT_TRUE(stopped);
  ASSERT_LT(stopped->tokens.size(), 511u);
  EXPECT_EQ(stopped->tokens.back(), tokenizer::bos);
  for (size_t i = 0; i + 1 < stopped->tokens.size(); i++) {
    EXPECT_NE(stopped->tokens[i], tokenizer::bos) << i;
    EXPECT_NE(stopped->tokens[i], tokenizer::eos) << i;
  }
  generate_params p = from_bos(511, 0.0f, 0);
  p.ignore_eos = true;
  auto full = generate(t, *tokenizer_, p);
  ASSERT_TRUE(full);
  ASSERT_EQ(full->tokens.size(), 511u);
  EXPECT_TRUE(std::equal(stopped->tokens.begin(), stopped->tokens.end(), full->tokens.begin()));
  EXPECT_EQ(full->text.rfind(stopped->text, 0), 0u);
}

/// Expects `r` to fail with `code` and a message containing `part`.
void expect_error(const expected<void>& r, errc code, const std::string& part) {
  ASSERT_FALSE(r) << "expected an error containing '" << part << "'";
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_NE(r.error().message.find(part), std::string::npos) << r.error().message;
}

TEST_F(Generate, ValidateAcceptsTheLimits) {
  EXPECT_TRUE(validate(from_bos(511, 0.0f, 0), config()));  // 1 + 511 = seq_len
  generate_params p = from_bos(1, 0.0f, 0);
  p.sampling.top_p = 1.0f;
  EXPECT_TRUE(validate(p, config()));
}

TEST_F(Generate, ValidateRejectsBadRequests) {
  expect_error(validate(from_bos(512, 0.0f, 0), config()), errc::too_long,
               "prompt (1 tokens) + 512 new tokens exceeds the model's context of 512 tokens");
  generate_params long_prompt = from_bos(1, 0.0f, 0);
  long_prompt.prompt.assign(512, 300);
  expect_error(validate(long_prompt, config()), errc::too_long, "512 tokens) + 1 new tokens");
  expect_error(validate(from_bos(0, 0.0f, 0), config()), errc::invalid_argument,
               "number of tokens to generate must be > 0, got 0");
  expect_error(validate(from_bos(-3, 0.0f, 0), config()), errc::invalid_argument, "got -3");

  generate_params empty = from_bos(10, 0.0f, 0);
  empty.prompt.clear();
  expect_error(validate(empty, config()), errc::invalid_argument, "the prompt is empty");
  generate_params out_of_range = from_bos(10, 0.0f, 0);
  out_of_range.prompt.push_back(512);
  expect_error(validate(out_of_range, config()), errc::invalid_argument, "prompt token 512 is outside the vocabulary");

  for (float top_p : {0.0f, 1.5f, -0.1f}) {
    generate_params p = from_bos(10, 1.0f, 0);
    p.sampling.top_p = top_p;
    expect_error(validate(p, config()), errc::invalid_argument, "top_p must be in (0, 1]");
  }
  expect_error(validate(from_bos(10, -1.0f, 0), config()), errc::invalid_argument,
               "temperature must be a finite number >= 0, got -1");
}

TEST_F(Generate, GenerateReturnsTheValidationErrorWithoutStreaming) {
  model::transformer t(*checkpoint_);
  int32_t num_callbacks = 0;
  auto on_token = [&](int32_t, const std::string&) { num_callbacks++; };
  auto too_long = generate(t, *tokenizer_, from_bos(600, 0.0f, 0), on_token);
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().code, errc::too_long);
  EXPECT_NE(too_long.error().message.find("600 new tokens"), std::string::npos);
  generate_params bad_top_p = from_bos(10, 1.0f, 0);
  bad_top_p.sampling.top_p = 1.5f;
  auto sampling = generate(t, *tokenizer_, bad_top_p, on_token);
  ASSERT_FALSE(sampling);
  EXPECT_EQ(sampling.error().code, errc::invalid_argument);
  EXPECT_NE(sampling.error().message.find("top_p"), std::string::npos);
  EXPECT_EQ(num_callbacks, 0);
}

}  // namespace
}  // namespace troupe::generate
