// Encoding by provenance and chat templates (issue 19, points 3-4): only template segments
// become special tokens — a fuzz of hostile user text never does — parallel and sequential
// segment encoding agree, and the built-in templates render exactly.
#include "runtime/tokenizer/chat_template.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "runtime/sampling/random_stream.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/served_template.hpp"
#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe {
namespace {

/// The small BPE vocabulary of bpe_vocab_file.hpp with ChatML's two control tokens added.
tokenizer chatml_vocab() {
  const std::string bytes = testing::small_bpe_gguf([](testing::gguf_metadata& meta) {
    for (auto& [key, value] : meta) {
      if (key == "tokenizer.ggml.tokens")
        for (const char* t : {"<|im_start|>", "<|im_end|>"}) value.array.push_back(model::gguf_value::of_string(t));
      if (key == "tokenizer.ggml.token_type")
        for (int i = 0; i < 2; i++) value.array.push_back(model::gguf_value::of_int(model::gguf_type::i32, 3));
    }
  });
  auto tok = tokenizer::from_bytes(bytes, 263, "chatml.gguf");
  EXPECT_TRUE(tok.has_value()) << tok.error().message;
  return std::move(*tok);
}

const tokenizer& bundled() { return testing::model_and_tokenizer().tok; }

std::vector<std::int32_t> encode(const tokenizer& tok, const std::vector<segment>& s, kernels::cpu::thread_pool* pool = nullptr) {
  auto ids = encode_segments(tok, s, false, pool);
  EXPECT_TRUE(ids.has_value()) << ids.error().message;
  return ids.value_or(std::vector<std::int32_t>{});
}

TEST(Provenance, TemplateTextBecomesSpecialTokensUserTextNever) {
  const tokenizer& tok = bundled();  // control tokens <unk> 0, <s> 1, </s> 2
  const std::string text = "</s><s>hi";
  const std::vector<std::int32_t> as_template = encode(tok, {{text, origin::template_text}});
  ASSERT_GE(as_template.size(), 3u);
  EXPECT_EQ(as_template[0], 2);
  EXPECT_EQ(as_template[1], 1);
  EXPECT_EQ(std::vector<std::int32_t>(as_template.begin() + 2, as_template.end()), *tok.encode("hi", false, false));
  for (const origin o : {origin::user, origin::tool}) {
    const std::vector<std::int32_t> as_user = encode(tok, {{text, o}});
    EXPECT_EQ(as_user, *tok.encode(text, false, false));
    EXPECT_TRUE(std::none_of(as_user.begin(), as_user.end(), [&](std::int32_t id) { return tok.is_control(id); }));
  }
  // BOS comes from the encoder; an empty user segment adds nothing.
  EXPECT_EQ(*encode_segments(tok, {{"", origin::user}}, true), std::vector<std::int32_t>{tok.bos_id()});
}

TEST(Provenance, AFuzzOfHostileUserTextNeverYieldsASpecialToken) {
  // User strings built from special-token texts, template markers, byte fragments (some
  // invalid UTF-8) and ordinary text; on both vocabularies, sequential and on a pool.
  const tokenizer chatml = chatml_vocab();
  kernels::cpu::thread_pool pool(3);
  const std::vector<std::string> fragments = {"<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|end|>", "<us>",
                                              "[INST]", "<<SYS>>", "<|eot_id|>", "<", "|", ">", "s", "ab", "abc",
                                              " ", "\n", "\xe2\x82\xac", "\xe2\x82", "\xff", "Lily"};
  int64_t num_valid = 0;
  for (const tokenizer* tok : {&bundled(), &chatml}) {
    for (uint64_t seed = 0; seed < 300; seed++) {
      sampling::random_stream rng(seed, 0, 0);
      std::vector<segment> segments;
      const int64_t num_segments = 1 + static_cast<int64_t>(rng.uniform_below(6));
      for (int64_t s = 0; s < num_segments; s++) {
        std::string text;
        const int64_t n = static_cast<int64_t>(rng.uniform_below(12));
        for (int64_t i = 0; i < n; i++) text += fragments[rng.uniform_below(fragments.size())];
        const bool is_template = rng.uniform_below(3) == 0;
        // Markup naming <|im_start|> (a special of the ChatML vocabulary only) and </s> (of the
        // bundled one only): one special token either way.
        if (is_template) text = "<|im_start|>user\n</s>";
        segments.push_back({text, is_template ? origin::template_text : (rng.uniform_below(2) ? origin::user : origin::tool)});
      }
      auto sequential = encode_segments(*tok, segments, false);
      auto parallel = encode_segments(*tok, segments, false, &pool);
      ASSERT_EQ(sequential.has_value(), parallel.has_value()) << seed;
      if (!sequential) {
        EXPECT_EQ(sequential.error().message, parallel.error().message);
        continue;  // invalid UTF-8 in a user segment: a clear error, nothing encoded
      }
      num_valid++;
      EXPECT_EQ(*sequential, *parallel) << "seed " << seed;
      // Every special token (control or user-defined, `<us>`) comes from a template segment:
      // count them against the markup's.
      const auto num_control = std::count_if(sequential->begin(), sequential->end(),
                                             [&](std::int32_t id) { return tok->is_special(id); });
      const auto want = std::count_if(segments.begin(), segments.end(),
                                      [](const segment& s) { return s.from == origin::template_text; });
      EXPECT_EQ(num_control, want) << "seed " << seed;
    }
  }
  EXPECT_GT(num_valid, 200);
}

TEST(Provenance, ErrorsNameTheirSegment) {
  auto bad = encode_segments(bundled(), {{"ok", origin::template_text}, {"\xff", origin::user}}, false);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, errc::invalid_utf8);
  EXPECT_EQ(bad.error().message.rfind("segment 1: ", 0), 0u) << bad.error().message;
}

TEST(ChatTemplate, ChatMLRendersAndEncodesExactly) {
  const tokenizer tok = chatml_vocab();
  ASSERT_TRUE(check_chat_template(chat_template::chatml, tok).has_value());
  auto segments = render_chat(chat_template::chatml, {{"system", "ab"}, {"user", "<|im_end|>abc"}}, true);
  ASSERT_TRUE(segments.has_value()) << segments.error().message;
  std::string text;
  for (const segment& s : *segments) text += s.text;
  EXPECT_EQ(text, "<|im_start|>system\nab<|im_end|>\n<|im_start|>user\n<|im_end|>abc<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<std::int32_t> ids = encode(tok, *segments);
  const std::int32_t start = 261, end = 262;
  // Three starts and two ends from the template; the user's "<|im_end|>" stays text.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), start), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), end), 2);
  EXPECT_EQ(ids.front(), start);
  EXPECT_EQ(chat_stop_ids(chat_template::chatml, tok), std::vector<std::int32_t>{end});
}

TEST(ChatTemplate, Llama2OnTheBundledVocabulary) {
  const tokenizer& tok = bundled();
  ASSERT_TRUE(check_chat_template(chat_template::llama2, tok).has_value());
  auto segments = render_chat(chat_template::llama2,
                              {{"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "</s>Bye"}}, true);
  ASSERT_TRUE(segments.has_value()) << segments.error().message;
  std::string text;
  for (const segment& s : *segments) text += s.text;
  EXPECT_EQ(text, "[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] </s>Bye [/INST]");
  auto ids = encode_segments(tok, *segments, true);
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(ids->front(), tok.bos_id());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tokenizer::eos), 1);  // the template's </s> only
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tokenizer::bos), 2);  // BOS and the template's <s>
  EXPECT_EQ(chat_stop_ids(chat_template::llama2, tok), std::vector<std::int32_t>{tokenizer::eos});
}

TEST(ChatTemplate, BadInputIsAClearError) {
  EXPECT_EQ(check_chat_template(chat_template::chatml, bundled()).error().message,
            "the chatml chat template needs the special token <|im_start|>, which this vocabulary does not have");
  EXPECT_EQ(render_chat(chat_template::chatml, {{"wizard", "x"}}, true).error().message,
            "message 0 has role 'wizard' (expected system, user, assistant or tool)");
  EXPECT_EQ(render_chat(chat_template::plain, {}, true).error().message, "a chat needs at least one message");
  EXPECT_FALSE(render_chat(chat_template::llama2, {{"user", "a"}, {"user", "b"}}, true).has_value());
  EXPECT_FALSE(render_chat(chat_template::llama2, {{"system", "a"}}, true).has_value());
  EXPECT_EQ(parse_chat_template("jinja").error().message,
            "unknown chat template 'jinja' (expected auto, bare, plain, chatml, llama2 or llama3)");
  EXPECT_EQ(*parse_chat_template("llama3"), chat_template::llama3);
  EXPECT_EQ(recognise_chat_template("{% for m in messages %}<|im_start|>{{m.role}}"), chat_template::chatml);
  EXPECT_EQ(recognise_chat_template("<|start_header_id|>"), chat_template::llama3);
  EXPECT_EQ(recognise_chat_template("[INST] {{ x }} [/INST]"), chat_template::llama2);
  EXPECT_FALSE(recognise_chat_template("{{ messages }}").has_value());
  // The plain template has no special token at all.
  auto plain = render_chat(chat_template::plain, {{"user", "hi"}}, true);
  ASSERT_TRUE(plain.has_value());
  std::string text;
  for (const segment& s : *plain) text += s.text;
  EXPECT_EQ(text, "user: hi\nassistant:");
}

TEST(ChatTemplate, BareJoinsContentsAndTheServedTemplateIsChosenAndChecked) {
  auto bare = render_chat(chat_template::bare, {{"system", "Tell a story."}, {"user", "<s>Once"}}, true);
  ASSERT_TRUE(bare.has_value());
  ASSERT_EQ(bare->size(), 1u);
  EXPECT_EQ((*bare)[0].text, "Tell a story.\n<s>Once");
  EXPECT_EQ((*bare)[0].from, origin::user);
  const auto choose = [](const std::string& name) {
    return choose_served_template(name, std::nullopt, bundled(), jinja_options_for(bundled(), {}));
  };
  ASSERT_TRUE(choose("auto").has_value());
  EXPECT_FALSE(choose("auto")->is_jinja());  // tok512 has no template text: the fallback
  EXPECT_EQ(choose("auto")->stop_format(), chat_template::bare);
  EXPECT_EQ(choose("auto")->description(), "the built-in bare chat format");
  EXPECT_EQ(choose("plain")->stop_format(), chat_template::plain);
  EXPECT_EQ(choose("chatml").error().message,
            "the chatml chat template needs the special token <|im_start|>, which this vocabulary does not have");
  EXPECT_EQ(choose("jinja").error().message,
            "unknown chat template 'jinja' (expected auto, bare, plain, chatml, llama2 or llama3)");
  EXPECT_EQ(bundled().chat_template_text(), "");
}

}  // namespace
}  // namespace troupe
