// Byte-level BPE: the pre-tokenizers' splits, encoding and decoding of a small vocabulary by
// hand (user-defined tokens cut out, control tokens never from text, streaming across a
// character split between tokens), and every class of bad vocabulary file is an error naming
// the problem.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/tokenizer/pre_tokenizer.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/stream_detokenizer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "runtime/tokenizer/utf8.hpp"
#include "tests/support/bpe_vocab_file.hpp"

namespace troupe {
namespace {

using ids_t = std::vector<std::int32_t>;
using testing::byte_char;
using testing::gguf_metadata;
using testing::small_bpe_gguf;
using v = model::gguf_value;

/// The words `kind` cuts UTF-8 `text` into.
std::vector<std::string> words(pre_tokenizer kind, const std::string& text) {
  const std::u32string cps = utf8::decode(text);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (const std::size_t n : split_words(kind, cps)) {
    std::string word;
    for (std::size_t i = 0; i < n; ++i) utf8::append(word, cps[at + i]);
    out.push_back(word);
    at += n;
  }
  EXPECT_EQ(at, cps.size());
  return out;
}

using strings = std::vector<std::string>;

TEST(PreTokenizer, Gpt2SplitsContractionsRunsAndKeepsTheLastSpaceForTheNextWord) {
  EXPECT_EQ(words(pre_tokenizer::gpt2, "I'm  ok 123\n\n"), (strings{"I", "'m", " ", " ok", " 123", "\n\n"}));
  EXPECT_EQ(words(pre_tokenizer::gpt2, "we'll they're 'x !!?"), (strings{"we", "'ll", " they", "'re", " '", "x", " !!?"}));
  // Letters of any script are \p{L}; a digit run is one word; the 'S is not a contraction.
  EXPECT_EQ(words(pre_tokenizer::gpt2, "Ünïcödé 42x IT'S"), (strings{"Ünïcödé", " 42", "x", " IT", "'", "S"}));
  EXPECT_EQ(words(pre_tokenizer::gpt2, "a \t b   "), (strings{"a", " \t", " b", "   "}));
  EXPECT_EQ(words(pre_tokenizer::gpt2, ""), strings{});
}

TEST(PreTokenizer, StarcoderSplitsEveryDigitFirst) {
  EXPECT_EQ(words(pre_tokenizer::starcoder, "a12 b 3c"), (strings{"a", "1", "2", " b", " ", "3", "c"}));
  EXPECT_EQ(words(pre_tokenizer::gpt2, "a12 b 3c"), (strings{"a", "12", " b", " 3", "c"}));
}

TEST(PreTokenizer, DeepseekCoderKeepsMatchesAndTheTextBetweenThem) {
  EXPECT_EQ(words(pre_tokenizer::deepseek_coder, "Hi, 世界\n42"),
            (strings{"Hi", ",", " ", "世界", "\n", "4", "2"}));
  // \s?\p{P}+ takes one space before punctuation; a space before a symbol stays alone.
  EXPECT_EQ(words(pre_tokenizer::deepseek_coder, "x = (y)\r\n"), (strings{"x", " =", " (", "y", ")", "\r", "\n"}));
  EXPECT_EQ(words(pre_tokenizer::deepseek_coder, "한국어 text"), (strings{"한국어", " text"}));
}

// Expected splits: Python's `re` running the same rules (\p{L} as [^\W\d_], \p{N} as \d, which
// agree on these texts), written down by hand.
TEST(PreTokenizer, Llama3TakesUpToThreeDigitsAndALeadingNonLetterWithAWord) {
  EXPECT_EQ(words(pre_tokenizer::llama3, "I'm  12345 $x\n\n  y"),
            (strings{"I", "'m", " ", " ", "123", "45", " $", "x", "\n\n", " ", " y"}));
  EXPECT_EQ(words(pre_tokenizer::llama3, "Hello WORLD'S end!!\r\n\tok"),
            (strings{"Hello", " WORLD", "'S", " end", "!!\r\n", "\tok"}));
  EXPECT_EQ(words(pre_tokenizer::llama3, "a_b  __init__ 3.14159"),
            (strings{"a", "_b", " ", " __", "init", "__", " ", "3", ".", "141", "59"}));
  EXPECT_EQ(words(pre_tokenizer::llama3, "¿Qué tal? 你好 ...\n"), (strings{"¿Qué", " tal", "?", " 你好", " ...\n"}));
  EXPECT_EQ(words(pre_tokenizer::llama3, "x\n \n y  "), (strings{"x", "\n \n", " y", "  "}));
}

TEST(PreTokenizer, Qwen2IsLlama3WithOneDigitPerWord) {
  EXPECT_EQ(words(pre_tokenizer::qwen2, "I'm  12345 $x"),
            (strings{"I", "'m", " ", " ", "1", "2", "3", "4", "5", " $", "x"}));
  EXPECT_EQ(words(pre_tokenizer::qwen2, "a_b  __init__ 3.14159"),
            (strings{"a", "_b", " ", " __", "init", "__", " ", "3", ".", "1", "4", "1", "5", "9"}));
}

TEST(PreTokenizer, BloomCutsAtSpacesAndSentencePunctuation) {
  EXPECT_EQ(words(pre_tokenizer::bloom, "Hello, world! (ok)  end。"),
            (strings{"Hello", ",", " world", "! (", "ok", ") ", " end", "。"}));  // the text between matches: one word
}

TEST(PreTokenizer, TekkenSplitsCaseRunsDigitsAndSlashes) {
  EXPECT_EQ(words(pre_tokenizer::tekken, "HELLOworld helloWorld ABc"), (strings{"HELLOworld", " hello", "World", " ABc"}));
  EXPECT_EQ(words(pre_tokenizer::tekken, "I'm 2024 a/b//\n\nÉcole éÉ"),
            (strings{"I", "'m", " ", "2", "0", "2", "4", " a", "/b", "//\n\n", "École", " éÉ"}));
  EXPECT_EQ(words(pre_tokenizer::tekken, "x_Y  (z) ..\r\n/ ok"), (strings{"x", "_Y", " ", " (", "z", ")", " ..\r\n/", " ok"}));
}

TEST(PreTokenizer, DeepseekLlmKeepsCasedScriptsPunctuationAndTrailingSpaces) {
  EXPECT_EQ(words(pre_tokenizer::deepseek_llm, "Hello, world! 123\n你好 ok  "),
            (strings{"Hello", ",", " world", "!", " ", "123", "\n", "你好", " ok", "  "}));
  EXPECT_EQ(words(pre_tokenizer::deepseek_llm, "Привет мир"), (strings{"Привет", " мир"}));
  EXPECT_EQ(words(pre_tokenizer::deepseek_llm, "é—x"), (strings{"é", "—", "x"}));  // U+2014 is in neither class
}

// The expected splits of these rules were derived with Python's `re` running llama.cpp's regexes in
// order (ASCII text: \p{L} = [A-Za-z], \p{N} = [0-9], \p{P} = the ASCII punctuation).
TEST(PreTokenizer, DefaultAndFalconCutPunctuationRunsFirstThenDigitsByThree) {
  EXPECT_EQ(words(pre_tokenizer::default_bpe, "Hello, world!! x+=12345 $a|b  ok"),
            (strings{"Hello", ",", " world", "!!", " x", "+=", "123", "45", " ", "$", "a", "|", "b", " ", " ok"}));
  EXPECT_EQ(words(pre_tokenizer::default_bpe, "it's 1234567 a`b"),
            (strings{"it", "'", "s", " ", "123", "456", "7", " a", "`", "b"}));  // ` is no \p{P}: the gpt-2 rule takes it
  EXPECT_EQ(words(pre_tokenizer::falcon, "Hello, world!! x+=12345 $a|b  ok"),
            (strings{"Hello", ",", " world", "!!", " x", "+=", "123", "45", " ", "$", "a", "|", "b", " ", " ok"}));
  EXPECT_EQ(words(pre_tokenizer::falcon, "it's 1234567 a`b"), (strings{"it", "'", "s", " ", "123", "456", "7", " a", "`", "b"}));
}

TEST(PreTokenizer, VikingIsBloomThenEachDigit) {
  EXPECT_EQ(words(pre_tokenizer::viking, "Hello 2024, world! x1y22"),
            (strings{"Hello", " ", "2", "0", "2", "4", ",", " world", "!", " x", "1", "y", "2", "2"}));
}

TEST(PreTokenizer, SeedCoderIsQwen2WithoutLineBreaksAfterPunctuation) {
  EXPECT_EQ(words(pre_tokenizer::seed_coder, "Hi!!\n\nthere ..\n ok 123 it's"),
            (strings{"Hi", "!!", "\n\n", "there", " ..", "\n", " ok", " ", "1", "2", "3", " it", "'s"}));
  EXPECT_EQ(words(pre_tokenizer::qwen2, "Hi!!\n\nthere"), (strings{"Hi", "!!\n\n", "there"}));
}

TEST(PreTokenizer, Gpt4oIsTekkenWithContractionsAndThreeDigits) {
  EXPECT_EQ(words(pre_tokenizer::gpt4o, "HELLOworld's I'M 12345 helloWorld's a/b//\n\n x"),
            (strings{"HELLOworld's", " I'M", " ", "123", "45", " hello", "World's", " a", "/b", "//\n\n", " x"}));
  EXPECT_EQ(words(pre_tokenizer::gpt4o, "ABCdef DEFg'LL x'd 7"), (strings{"ABCdef", " DEFg'LL", " x'd", " ", "7"}));
}

TEST(PreTokenizer, UnknownNamesAreRefusedListingTheSupportedOnes) {
  EXPECT_EQ(*parse_pre_tokenizer("starcoder", "f"), pre_tokenizer::starcoder);
  EXPECT_EQ(*parse_pre_tokenizer("llama-bpe", "f"), pre_tokenizer::llama3);
  EXPECT_EQ(*parse_pre_tokenizer("deepseek-r1-qwen", "f"), pre_tokenizer::qwen2);
  EXPECT_EQ(*parse_pre_tokenizer("command-r", "f"), pre_tokenizer::starcoder);
  EXPECT_EQ(*parse_pre_tokenizer("olmo", "f"), pre_tokenizer::gpt2);
  EXPECT_EQ(pre_tokenizer_name(pre_tokenizer::deepseek_coder), "deepseek-coder");
  EXPECT_EQ(pre_tokenizer_name(pre_tokenizer::llama3), "llama3");
  EXPECT_EQ(*parse_pre_tokenizer("tekken", "f"), pre_tokenizer::tekken);
  EXPECT_EQ(*parse_pre_tokenizer("deepseek-llm", "f"), pre_tokenizer::deepseek_llm);
  EXPECT_TRUE(ignores_merges("tekken"));
  EXPECT_FALSE(ignores_merges("dbrx"));
  EXPECT_EQ(*parse_pre_tokenizer("default", "f"), pre_tokenizer::default_bpe);
  EXPECT_EQ(*parse_pre_tokenizer("poro-chat", "f"), pre_tokenizer::bloom);
  EXPECT_EQ(*parse_pre_tokenizer("gpt3-finnish", "f"), pre_tokenizer::bloom);
  EXPECT_EQ(*parse_pre_tokenizer("llama4", "f"), pre_tokenizer::gpt4o);
  EXPECT_EQ(*parse_pre_tokenizer("bailingmoe", "f"), pre_tokenizer::qwen2);
  EXPECT_EQ(pre_tokenizer_name(pre_tokenizer::gpt4o), "gpt-4o");
  EXPECT_EQ(pre_tokenizer_name(pre_tokenizer::viking), "viking");
  EXPECT_FALSE(parse_pre_tokenizer("", "f"));
  auto bad = parse_pre_tokenizer("chameleon", "f");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::malformed_file);
  const std::string listed = "f: tokenizer.ggml.pre 'chameleon' is not a supported pre-tokenizer (supported: gpt-2, phi-2, mpt";
  EXPECT_EQ(bad.error().message.substr(0, listed.size()), listed);
}

tokenizer small_tokenizer() {
  auto tok = tokenizer::from_bytes(small_bpe_gguf(), 261, "small.gguf");
  EXPECT_TRUE(tok) << tok.error().message;
  tok->check_invariants();
  return std::move(*tok);
}

TEST(Bpe, MergesByRankInsideEachWord) {
  const tokenizer tok = small_tokenizer();
  ASSERT_NE(tok.bpe(), nullptr);
  EXPECT_EQ(tok.bpe()->num_merges(), 3);
  EXPECT_EQ(*tok.encode("abc ab", false, false), (ids_t{257, 260}));
  EXPECT_EQ(*tok.encode("abc ab", true, true), (ids_t{258, 257, 260, 258}));
  // Ids 0..255 are the bytes' characters: " cab" is Ġ c ab, no rule joins c and ab.
  EXPECT_EQ(*tok.encode("ba cab", false, false), (ids_t{'b', 'a', ' ', 'c', 256}));
  EXPECT_EQ(tok.decode({257, 260, 'b', ' ', 'c'}), "abc abb c");
  EXPECT_EQ(tok.piece(tokenizer::no_token, 260), " ab");
  EXPECT_EQ(tok.piece_text(260), byte_char(' ') + "ab");
  EXPECT_EQ(tok.find_piece(" ab"), 260);
  EXPECT_EQ(tok.find_piece("<us>"), std::nullopt);  // user-defined, not ordinary
  EXPECT_EQ(tok.max_token_length(), 4);             // "<us>"; the control token decodes to ""
}

std::function<void(gguf_metadata&)> with_merges(std::vector<std::string> merges) {
  return [merges](gguf_metadata& meta) {
    std::vector<v> items;
    for (const std::string& m : merges) items.push_back(v::of_string(m));
    testing::set_key(meta, "tokenizer.ggml.merges", v::of_array(model::gguf_type::string, items));
  };
}

TEST(Bpe, Llama3TakesAWordThatIsATokenWholeWhateverTheMerges) {
  // Only "a b" merges: "abc" is a token no merge reaches. llama.cpp's ignore_merges (llama3)
  // takes the whole word; gpt-2 merges what it can.
  const auto load = [](const char* pre) {
    auto tok = tokenizer::from_bytes(small_bpe_gguf([&](gguf_metadata& m) {
                                       with_merges({"a b"})(m);
                                       testing::set_key(m, "tokenizer.ggml.pre", v::of_string(pre));
                                     }),
                                     261, "small.gguf");
    EXPECT_TRUE(tok) << tok.error().message;
    return std::move(*tok);
  };
  EXPECT_EQ(*load("llama-bpe").encode("abc abd", false, false), (ids_t{257, ' ', 256, 'd'}));
  EXPECT_EQ(*load("gpt-2").encode("abc abd", false, false), (ids_t{256, 'c', ' ', 256, 'd'}));
  // dbrx splits as llama3 does but merges as usual (llama.cpp sets ignore_merges by name).
  EXPECT_EQ(*load("dbrx").encode("abc abd", false, false), (ids_t{256, 'c', ' ', 256, 'd'}));
}

// Issue 47 (provenance): text used to have its user-defined tokens cut out first, as llama.cpp
// does, so a request could spell `<think>` or `<tool_call>` into those ids (this test's first
// line got {'a', 259, 'b', 259}). Only a template's text names them now.
TEST(Bpe, NeitherUserDefinedNorControlTokensComeFromText) {
  const tokenizer tok = small_tokenizer();
  EXPECT_EQ(*tok.encode("a<us>b<us>", false, false), (ids_t{'a', '<', 'u', 's', '>', 'b', '<', 'u', 's', '>'}));
  EXPECT_EQ(*encode_segments(tok, {segment{"a<us>b<us>", origin::template_text}}, false), (ids_t{'a', 259, 'b', 259}));
  EXPECT_EQ(*encode_segments(tok, {segment{"a<us>b<us>", origin::user}}, false),
            (ids_t{'a', '<', 'u', 's', '>', 'b', '<', 'u', 's', '>'}));
  EXPECT_EQ(tok.decode({'a', 259}), "a<us>");
  // The control token's text encodes as ordinary pieces and decodes to "" from its id.
  EXPECT_EQ(*tok.encode("<|end|>", false, false), (ids_t{'<', '|', 'e', 'n', 'd', '|', '>'}));
  EXPECT_TRUE(tok.is_control(258));
  EXPECT_FALSE(tok.is_control(259));
  EXPECT_TRUE(tok.is_special(258));
  EXPECT_TRUE(tok.is_special(259));
  EXPECT_FALSE(tok.is_special('a'));
  EXPECT_EQ(tok.decode({258, 'a', 258}), "a");
  EXPECT_EQ(tok.bos_id(), 258);
  EXPECT_EQ(tok.eos_id(), 258);
  EXPECT_TRUE(tok.adds_bos());
}

TEST(Bpe, StreamingHoldsACharacterSplitAcrossTokens) {
  const tokenizer tok = small_tokenizer();
  const ids_t ids = *tok.encode("\xC3\xA9!", false, false);  // é has no token: its two bytes' tokens
  EXPECT_EQ(ids, (ids_t{0xC3, 0xA9, '!'}));
  stream_detokenizer stream(tok);
  EXPECT_EQ(stream.push(0xC3), "");
  EXPECT_EQ(stream.num_pending_bytes(), 1u);
  stream.check_invariants();
  EXPECT_EQ(stream.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(stream.push(0xC3), "");
  EXPECT_EQ(stream.finish(), utf8::replacement_character);
  EXPECT_EQ(tok.decode({0xA9, 'a'}), std::string(utf8::replacement_character) + "a");
}

TEST(Bpe, BadTextIsAnErrorNamingTheOffset) {
  const tokenizer tok = small_tokenizer();
  auto bad = tok.encode("ab\xFF", false, false);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::invalid_utf8);
  EXPECT_NE(bad.error().message.find("byte offset 2"), std::string::npos) << bad.error().message;
  // A vocabulary without the character of byte 0xC3 cannot encode é.
  auto holey = tokenizer::from_bytes(small_bpe_gguf([](gguf_metadata& meta) {
                                       for (auto& [key, value] : meta)
                                         if (key == "tokenizer.ggml.tokens") {
                                           model::gguf_array tokens(model::gguf_type::string);
                                           for (size_t i = 0; i < value.array.size(); i++)
                                             tokens.push_string(i == 0xC3 ? "xy" : value.array.string(i));
                                           value.array = tokens;
                                         }
                                     }),
                                     261, "holey.gguf");
  ASSERT_TRUE(holey) << holey.error().message;
  auto missing = holey->encode("a\xC3\xA9", false, false);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::invalid_argument);
  EXPECT_EQ(missing.error().message, "the vocabulary has no token for byte 0xC3 (at byte offset 1 of the text)");
}

/// The error from_bytes gives for the small vocabulary after `edit` (vocabulary size `size`).
std::string load_error(const std::function<void(gguf_metadata&)>& edit, std::int32_t size = 261) {
  auto tok = tokenizer::from_bytes(small_bpe_gguf(edit), size, "bad.gguf");
  EXPECT_FALSE(tok);
  if (tok) return "";
  EXPECT_EQ(tok.error().code, errc::malformed_file);
  return tok.error().message;
}

std::function<void(gguf_metadata&)> with_extra_token(const std::string& text, int type) {
  return [=](gguf_metadata& meta) {
    for (auto& [key, value] : meta) {
      if (key == "tokenizer.ggml.tokens") value.array.push_back(v::of_string(text));
      if (key == "tokenizer.ggml.token_type") value.array.push_back(v::of_int(model::gguf_type::i32, type));
    }
  };
}

TEST(BpeLoad, EveryClassOfBadVocabularyIsAnErrorNamingIt) {
  const std::string prefix = "tokenizer file 'bad.gguf': ";
  EXPECT_EQ(load_error([](gguf_metadata& m) { testing::erase_key(m, "tokenizer.ggml.merges"); }),
            "GGUF file '" + prefix.substr(0, prefix.size() - 2) + "': no metadata key 'tokenizer.ggml.merges'");
  EXPECT_EQ(load_error(with_merges({"a b", "ab c", "ab xyz"})),
            prefix + "merge 2 'ab xyz' names 'xyz', which is not a token");
  EXPECT_EQ(load_error(with_merges({"q ab"})), prefix + "merge 0 'q ab' makes 'qab', which is not a token");
  EXPECT_EQ(load_error(with_merges({"a b", "abc"})), prefix + "merge 1 'abc' is not two tokens separated by a space");
  const std::string refused = prefix + "tokenizer.ggml.pre 'chameleon' is not a supported pre-tokenizer (supported: gpt-2, phi-2,";
  EXPECT_EQ(load_error([](gguf_metadata& m) { testing::set_key(m, "tokenizer.ggml.pre", v::of_string("chameleon")); })
                .substr(0, refused.size()),
            refused);
  EXPECT_NE(load_error([](gguf_metadata& m) { testing::erase_key(m, "tokenizer.ggml.pre"); })
                .find("no metadata key 'tokenizer.ggml.pre'"),
            std::string::npos);
  EXPECT_EQ(load_error([](gguf_metadata& m) {
              testing::set_key(m, "tokenizer.ggml.eos_token_id", v::of_int(model::gguf_type::u32, 261));
            }),
            prefix + "tokenizer.ggml.eos_token_id = 261, outside the vocabulary of 261");
  EXPECT_EQ(load_error(with_extra_token(" x", 1), 262),
            prefix + "token 261 ' x' is a normal token but not spelled in byte characters");
  EXPECT_EQ(load_error(with_extra_token("ab", 1), 262), prefix + "token 261 'ab' repeats an earlier token");
  EXPECT_EQ(load_error(with_extra_token("zz", 9), 262), prefix + "token 261 'zz' has token type 9 (0 to 6 exist)");
  EXPECT_EQ(load_error([](gguf_metadata& m) {
              testing::set_key(m, "tokenizer.ggml.token_type", v::of_array(model::gguf_type::i32, {}));
            }),
            prefix + "0 token types for 261 tokens");
  EXPECT_EQ(load_error({}, 300), prefix + "261 tokens for a vocabulary of 300");
}

TEST(BpeLoad, EveryTruncationOfTheMetadataIsAnErrorNotACrash) {
  const std::string bytes = small_bpe_gguf();
  ASSERT_TRUE(tokenizer::from_bytes(bytes, 261, "whole"));
  // The metadata ends with add_bos_token's byte 1; the zeros after it pad to the 32-byte
  // alignment, which a file without tensors does not need.
  const std::size_t metadata_end = bytes.find_last_not_of('\0') + 1;
  ASSERT_LT(bytes.size() - metadata_end, 32u);
  for (std::size_t n = 0; n < metadata_end; ++n) EXPECT_FALSE(tokenizer::from_bytes(bytes.substr(0, n), 261, "cut")) << n;
}

}  // namespace
}  // namespace troupe
