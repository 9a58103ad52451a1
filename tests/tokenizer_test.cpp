// Tests for runtime/tokenizer: llama2.c-exact BPE encode/decode on stories260K's tok512.bin,
// the streaming detokenizer, UTF-8 validation/repair, and clear errors on bad files and text.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/stream_detokenizer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "runtime/tokenizer/utf8.hpp"
#include "tests/support/golden.hpp"

namespace troupe {
namespace {

using ids_t = std::vector<std::int32_t>;

const std::string tok512_path = testing::bundled_tokenizer();
const std::string fffd(utf8::replacement_character);

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

tokenizer load_tok512() {
  expected<tokenizer> tok = tokenizer::load(tok512_path, 512);
  if (!tok) ADD_FAILURE() << tok.error().message;
  TROUPE_ASSERT(tok.has_value());
  return std::move(*tok);
}

ids_t encode_ok(const tokenizer& tok, std::string_view text, bool add_bos, bool add_eos = false) {
  expected<ids_t> ids = tok.encode(text, add_bos, add_eos);
  if (!ids) ADD_FAILURE() << "encode failed: " << ids.error().message;
  return ids.value_or(ids_t{});
}

using testing::golden_case;

/// Every case of derived/token_ids_by_case.json; each one's n_ids matches its ids.
std::vector<golden_case> load_golden_cases() { return testing::golden_cases(); }

/// Golden stdout files and the JSON case each one is the output of.
const std::vector<std::pair<std::string, std::string>> golden_files = {
    {"llama2c_test_all__t0_n200.txt", "t0_n200"},
    {"llama2c_doc__t0_default256.txt", "t0_default256"},
    {"llama2c_doc__t1_p0.9_s133742_default256.txt", "t1_p0.9_s133742_default256"},
    {"llama2zig__t1_p1.0_s42_n200.txt", "t1_p1.0_s42_n200"},
    {"llama2zig__t1_p0.95_s42_n200.txt", "t1_p0.95_s42_n200"},
    {"llama2zig__t1_p0.95_s42_n200_prompt.txt", "t1_p0.95_s42_n200_prompt"},
};

// ---- synthetic vocabularies ----------------------------------------------------------------

struct vocab_entry {
  float score = 0.0f;
  std::string piece;
};

void append_i32(std::string& out, std::int32_t value) {
  char raw[4];
  std::memcpy(raw, &value, 4);
  out.append(raw, 4);
}

void append_f32(std::string& out, float value) {
  char raw[4];
  std::memcpy(raw, &value, 4);
  out.append(raw, 4);
}

void append_entry(std::string& out, float score, std::string_view piece) {
  append_f32(out, score);
  append_i32(out, static_cast<std::int32_t>(piece.size()));
  out.append(piece);
}

/// A tokenizer file: controls `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `normal`.
std::string serialize_vocab(const std::vector<vocab_entry>& normal, std::int32_t max_len = 8) {
  std::string out;
  append_i32(out, max_len);
  for (const char* control : {"<unk>", "<s>", "</s>"}) append_entry(out, 0.0f, control);
  for (int byte = 0; byte < 256; ++byte) {
    char spelling[8];
    std::snprintf(spelling, sizeof(spelling), "<0x%02X>", byte);
    append_entry(out, 0.0f, spelling);
  }
  for (const vocab_entry& entry : normal) append_entry(out, entry.score, entry.piece);
  return out;
}

tokenizer synthetic(const std::vector<vocab_entry>& normal) {
  const auto size = static_cast<std::int32_t>(259 + normal.size());
  expected<tokenizer> tok = tokenizer::from_bytes(serialize_vocab(normal), size, "synthetic");
  if (!tok) ADD_FAILURE() << tok.error().message;
  TROUPE_ASSERT(tok.has_value());
  return std::move(*tok);
}

// ---- a naive model of llama2.c's encode(), written as literally as run.c -------------------

using lookup_fn = std::function<std::optional<std::int32_t>(const std::string&)>;

/// run.c's encode() body after validation: dummy prefix, codepoints, O(n^2) best-pair rescans.
ids_t naive_llama2c_encode(const tokenizer& tok, const std::string& text, const lookup_fn& lookup) {
  ids_t ids;
  if (!text.empty()) ids.push_back(lookup(" ").value_or(-1));
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8::sequence_length(static_cast<unsigned char>(text[i]));
    const std::string character = text.substr(i, n);
    if (const auto id = lookup(character)) {
      ids.push_back(*id);
    } else {
      for (const char byte : character) ids.push_back(static_cast<unsigned char>(byte) + 3);
    }
    i += n;
  }
  while (true) {
    float best_score = -1e10f;
    std::int32_t best_id = -1;
    std::int32_t best_idx = -1;
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      const std::string merged = std::string(tok.piece_text(ids[i])) +
                                 std::string(tok.piece_text(ids[i + 1]));
      const auto id = lookup(merged);
      if (id && tok.spm()->score(*id) > best_score) {
        best_score = tok.spm()->score(*id);
        best_id = *id;
        best_idx = static_cast<std::int32_t>(i);
      }
    }
    if (best_idx == -1) break;
    ids[best_idx] = best_id;
    ids.erase(ids.begin() + best_idx + 1);
  }
  return ids;
}

lookup_fn ordinary_lookup(const tokenizer& tok) {
  return [&tok](const std::string& text) { return tok.find_piece(text); };
}

/// llama2.c's str_lookup over every piece, control and byte tokens included.
lookup_fn llama2c_lookup(const tokenizer& tok) {
  return [&tok](const std::string& text) -> std::optional<std::int32_t> {
    for (std::int32_t id = 0; id < tok.vocab_size(); ++id) {
      if (tok.piece_text(id) == text) return id;
    }
    return std::nullopt;
  };
}

std::string random_text(std::mt19937& rng, const std::vector<std::string>& alphabet,
                        std::size_t max_chars) {
  std::uniform_int_distribution<std::size_t> length(0, max_chars);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::string text;
  for (std::size_t i = length(rng); i > 0; --i) text += alphabet[pick(rng)];
  return text;
}

// ---- loading and accessors -----------------------------------------------------------------

TEST(TokenizerLoad, Tok512Accessors) {
  const tokenizer tok = load_tok512();
  tok.check_invariants();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.max_token_length(), 7);
  EXPECT_EQ(tok.piece_text(0), "<unk>");
  EXPECT_EQ(tok.piece_text(1), "\n<s>\n");
  EXPECT_EQ(tok.piece_text(2), "\n</s>\n");
  EXPECT_EQ(tok.piece_text(3), "<0x00>");
  EXPECT_EQ(tok.piece_text(258), "<0xFF>");
  EXPECT_EQ(tok.piece_text(259), " t");
  EXPECT_EQ(tok.piece_text(485), "\xC3\xA9");  // é has a piece of its own
  EXPECT_EQ(tok.spm()->score(260), -1.0f);
  EXPECT_EQ(tok.spm()->score(274), -15.0f);
  EXPECT_EQ(tok.find_piece(" "), 410);
  EXPECT_EQ(tok.find_piece("he"), 260);
  EXPECT_EQ(tok.find_piece("<"), 504);
  EXPECT_EQ(tok.find_piece("<0x41>"), std::nullopt);  // byte tokens are not ordinary pieces
  EXPECT_EQ(tok.find_piece("\n<s>\n"), std::nullopt);
  EXPECT_EQ(tok.find_piece("<unk>"), std::nullopt);
  EXPECT_EQ(tok.find_piece("zzz"), std::nullopt);
  EXPECT_TRUE(tok.is_control(2));
  EXPECT_FALSE(tok.is_control(3));
  EXPECT_TRUE(spm_vocab::is_byte(3));
  EXPECT_FALSE(spm_vocab::is_byte(259));
}

TEST(TokenizerLoad, FromBytesMatchesLoad) {
  const tokenizer from_file = load_tok512();
  const expected<tokenizer> from_memory =
      tokenizer::from_bytes(read_bytes(tok512_path), 512, "memory");
  ASSERT_TRUE(from_memory) << from_memory.error().message;
  for (std::int32_t id = 0; id < 512; ++id) {
    ASSERT_EQ(from_memory->piece_text(id), from_file.piece_text(id)) << id;
    ASSERT_EQ(from_memory->spm()->score(id), from_file.spm()->score(id)) << id;
  }
}

TEST(TokenizerLoad, RepeatedPieceResolvesToLowestId) {
  const tokenizer tok = synthetic({{0.0f, " "}, {-1.0f, "ab"}, {-2.0f, "ab"}, {-3.0f, "a"}});
  tok.check_invariants();
  EXPECT_EQ(tok.find_piece("ab"), 260);
  EXPECT_EQ(tok.find_piece("a"), 262);
}

// ---- encoding ------------------------------------------------------------------------------

TEST(TokenizerEncode, PromptMatchesLlama2cPromptCase) {
  const tokenizer tok = load_tok512();
  const ids_t prompt = encode_ok(tok, "There was a big", /*add_bos=*/true);
  EXPECT_EQ(prompt, (ids_t{1, 291, 276, 286, 261, 370}));
  EXPECT_EQ(tok.decode(prompt), "There was a big");

  // llama2.c forced these ids before sampling, so they open the recorded sequence.
  bool found = false;
  for (const golden_case& c : load_golden_cases()) {
    if (c.name != "t1_p0.95_s42_n200_prompt") continue;
    found = true;
    ASSERT_GT(c.token_ids.size(), prompt.size());
    EXPECT_EQ(ids_t(c.token_ids.begin(), c.token_ids.begin() + 6), prompt);
    EXPECT_EQ(c.text.rfind("There was a big ", 0), 0u);
  }
  EXPECT_TRUE(found);
}

TEST(TokenizerEncode, BosEosAndEmptyText) {
  const tokenizer tok = load_tok512();
  EXPECT_EQ(encode_ok(tok, "", false), ids_t{});
  EXPECT_EQ(encode_ok(tok, "", true, true), (ids_t{1, 2}));  // no dummy prefix for ""
  EXPECT_EQ(encode_ok(tok, " ", false), (ids_t{410, 410}));  // dummy prefix + the space
  EXPECT_EQ(encode_ok(tok, "There", false, true), (ids_t{291, 276, 2}));  // " The" "re"
  EXPECT_EQ(encode_ok(tok, "There", true, true), (ids_t{1, 291, 276, 2}));
}

TEST(TokenizerEncode, ByteFallbackForCharactersWithoutPiece) {
  const tokenizer tok = load_tok512();
  // Ü = C3 9C and 😀 = F0 9F 98 80 have no piece: one byte token (byte + 3) per byte.
  // é = C3 A9 is piece 485.
  const ids_t ids = encode_ok(tok, "\xC3\x9C" "ber caf\xC3\xA9 \xF0\x9F\x98\x80", false);
  EXPECT_EQ(ids, (ids_t{410, 198, 159, 430, 285, 280, 412, 431, 485, 410, 243, 162, 155, 131}));
  EXPECT_EQ(tok.decode(ids), " \xC3\x9C" "ber caf\xC3\xA9 \xF0\x9F\x98\x80");
}

TEST(TokenizerEncode, NulIsAnOrdinaryCharacter) {
  const tokenizer tok = load_tok512();
  const std::string text("a\0b", 3);
  const ids_t ids = encode_ok(tok, text, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 3), 1);  // <0x00>
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(TokenizerEncode, TiesGoToTheLeftmostPair) {
  // ids: " " 259, a 260, b 261, ab 262, ba 263; "ab" and "ba" tie.
  const tokenizer tok =
      synthetic({{0.0f, " "}, {0.0f, "a"}, {0.0f, "b"}, {-1.0f, "ab"}, {-1.0f, "ba"}});
  EXPECT_EQ(encode_ok(tok, "aba", false), (ids_t{259, 262, 260}));
  EXPECT_EQ(encode_ok(tok, "bab", false), (ids_t{259, 263, 261}));
}

TEST(TokenizerEncode, ScoresAtOrBelowMinusOneE10NeverMerge) {
  const tokenizer at_limit = synthetic({{0.0f, " "}, {0.0f, "a"}, {0.0f, "b"}, {-1e10f, "ab"}});
  EXPECT_EQ(encode_ok(at_limit, "ab", false), (ids_t{259, 260, 261}));
  const tokenizer above = synthetic({{0.0f, " "}, {0.0f, "a"}, {0.0f, "b"}, {-9e9f, "ab"}});
  EXPECT_EQ(encode_ok(above, "ab", false), (ids_t{259, 262}));
}

TEST(TokenizerEncode, MatchesNaiveLlama2cModelOnTok512) {
  const tokenizer tok = load_tok512();
  const std::vector<std::string> alphabet = {
      "a", "e", "h", "t", "s", "n", "o", " ", " ", "T", "L", ".", ",", "'", "\"", "\n", "!",
      "<", ">", "/", "\xC3\xA9", "\xC3\xBC", "\xE2\x80\x9C", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
  for (std::uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const std::string text = random_text(rng, alphabet, 40);
    SCOPED_TRACE("seed " + std::to_string(seed) + " text '" + text + "'");
    ASSERT_EQ(encode_ok(tok, text, false), naive_llama2c_encode(tok, text, ordinary_lookup(tok)));
  }
}

TEST(TokenizerEncode, MatchesNaiveLlama2cModelWithManyTies) {
  // Every 2- and 3-letter string over {a, b, c} is a piece, with only three distinct scores.
  std::vector<vocab_entry> normal = {{0.0f, " "}, {0.0f, "a"}, {0.0f, "b"}, {0.0f, "c"}};
  const std::string letters = "abc";
  for (int i = 0; i < 9; ++i) {
    normal.push_back({-static_cast<float>(i % 3), {letters[i / 3], letters[i % 3]}});
  }
  for (int i = 0; i < 27; ++i) {
    normal.push_back({-static_cast<float>((i * 7) % 3),
                      {letters[i / 9], letters[(i / 3) % 3], letters[i % 3]}});
  }
  const tokenizer tok = synthetic(normal);
  for (std::uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const std::string text = random_text(rng, {"a", "b", "c", " "}, 30);
    SCOPED_TRACE("seed " + std::to_string(seed) + " text '" + text + "'");
    ASSERT_EQ(encode_ok(tok, text, false), naive_llama2c_encode(tok, text, ordinary_lookup(tok)));
  }
}

// ---- special tokens cannot be forged from text ---------------------------------------------

TEST(TokenizerSpecial, Tok512TextNeverYieldsControlTokens) {
  const tokenizer tok = load_tok512();
  EXPECT_EQ(encode_ok(tok, "<s>", true), (ids_t{1, 410, 504, 419, 505}));
  EXPECT_EQ(encode_ok(tok, "</s>", false), (ids_t{410, 504, 492, 419, 505}));
  EXPECT_EQ(encode_ok(tok, "<unk>", false), (ids_t{410, 504, 379, 433, 505}));
  for (const char* text : {"<s>", "</s>", "<unk>", "\n<s>\n", "\n</s>\n", "a<s>b</s>", "<0x41>"}) {
    const ids_t ids = encode_ok(tok, text, false);
    for (const std::int32_t id : ids) EXPECT_FALSE(tok.is_control(id)) << text;
    EXPECT_EQ(tok.decode(ids), std::string(" ") + text);
  }
}

TEST(TokenizerSpecial, MergesNeverSpellControlOrByteTokens) {
  // Here llama2.c itself would merge "<s" + ">" into BOS and "<0x41" + ">" into byte token 'A'.
  std::vector<vocab_entry> normal;
  for (const char* piece : {" ", "<", "s", ">", "/", "0", "x", "4", "1", "<s", "</", "</s",
                            "<0", "<0x", "<0x4", "<0x41"}) {
    normal.push_back({-static_cast<float>(normal.size()), piece});
  }
  const tokenizer tok = synthetic(normal);
  const auto id = [&tok](const char* piece) { return tok.find_piece(piece).value(); };

  EXPECT_EQ(naive_llama2c_encode(tok, "<s>", llama2c_lookup(tok)), (ids_t{id(" "), 1}));
  EXPECT_EQ(encode_ok(tok, "<s>", false), (ids_t{id(" "), id("<s"), id(">")}));
  EXPECT_EQ(encode_ok(tok, "</s>", false), (ids_t{id(" "), id("</s"), id(">")}));

  EXPECT_EQ(naive_llama2c_encode(tok, "<0x41>", llama2c_lookup(tok)), (ids_t{id(" "), 3 + 0x41}));
  const ids_t forged_byte = encode_ok(tok, "<0x41>", false);
  EXPECT_EQ(forged_byte, (ids_t{id(" "), id("<0x41"), id(">")}));
  EXPECT_EQ(tok.decode(forged_byte), " <0x41>");
}

// ---- decoding ------------------------------------------------------------------------------

TEST(TokenizerDecode, PieceFollowsLlama2cDecode) {
  const tokenizer tok = load_tok512();
  EXPECT_EQ(tok.piece_text(403), " Once");
  EXPECT_EQ(tok.piece(tokenizer::bos, 403), "Once");  // leading space stripped after BOS
  EXPECT_EQ(tok.piece(tokenizer::no_token, 403), " Once");
  EXPECT_EQ(tok.piece(291, 403), " Once");
  EXPECT_EQ(tok.piece(tokenizer::bos, 410), "");  // " " alone after BOS
  EXPECT_EQ(tok.piece(tokenizer::bos, 291), "The");
  EXPECT_EQ(tok.piece(5, 13), "\n");  // <0x0A>
  EXPECT_EQ(tok.piece(5, 3), std::string(1, '\0'));
  EXPECT_EQ(tok.piece(5, 258), "\xFF");
  for (std::int32_t control : {0, 1, 2}) EXPECT_EQ(tok.piece(403, control), "") << control;
}

TEST(TokenizerDecode, GoldenCasesMatchLlama2cStdout) {
  const tokenizer tok = load_tok512();
  const std::vector<golden_case> cases = load_golden_cases();
  ASSERT_EQ(cases.size(), golden_files.size());
  for (const auto& [file, case_name] : golden_files) {
    SCOPED_TRACE(file);
    const auto it = std::find_if(cases.begin(), cases.end(),
                                 [&](const golden_case& c) { return c.name == case_name; });
    ASSERT_NE(it, cases.end());
    ASSERT_EQ(it->token_ids.front(), 1);
    EXPECT_TRUE(tok.check_ids(it->token_ids));
    EXPECT_EQ(it->text, read_bytes(testing::test_data("stories260K/golden/" + file)));
    EXPECT_EQ(tok.decode(it->token_ids), it->text);
  }
}

TEST(TokenizerDecode, GoldenTextsRoundTrip) {
  const tokenizer tok = load_tok512();
  for (const auto& [file, case_name] : golden_files) {
    SCOPED_TRACE(file);
    const std::string text = read_bytes(testing::test_data("stories260K/golden/" + file));
    ASSERT_FALSE(text.empty());
    const ids_t ids = encode_ok(tok, text, true);
    EXPECT_EQ(ids.front(), 1);
    EXPECT_LT(ids.size(), text.size());  // merges happened
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(TokenizerDecode, InvalidBytesBecomeReplacementCharacters) {
  const tokenizer tok = load_tok512();
  const auto b = [](int byte) { return 3 + byte; };
  EXPECT_EQ(tok.decode({1, b(0xC3), b(0xBC)}), "\xC3\xBC");
  EXPECT_EQ(tok.decode({1, b(0x80), b(0x80)}), fffd + fffd);
  EXPECT_EQ(tok.decode({b(0xF0), b(0x9F), b(0x98), 403}), fffd + " Once");
  EXPECT_EQ(tok.decode({b(0xE0), b(0x80)}), fffd + fffd);                // overlong
  EXPECT_EQ(tok.decode({b(0xED), b(0xA0), b(0x80)}), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(tok.decode({b(0xF4), b(0x90), b(0x80), b(0x80)}), fffd + fffd + fffd + fffd);
  EXPECT_EQ(tok.decode({b(0xFF), b('a')}), fffd + "a");
  EXPECT_EQ(tok.decode({b(0xE2), b(0x82)}), fffd);  // incomplete at the end
}

TEST(TokenizerDecode, CheckIdsNamesTheBadPosition) {
  const tokenizer tok = load_tok512();
  EXPECT_TRUE(tok.check_ids({0, 1, 511}));
  const expected<void> bad = tok.check_ids({1, 403, 512});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_EQ(bad.error().message, "token id 512 at position 2 is outside [0, 512)");
  EXPECT_FALSE(tok.check_ids({-1}));
}

// ---- UTF-8 repair --------------------------------------------------------------------------

TEST(Utf8, SanitizeReplacesEachMaximalSubpart) {
  // Expected values are Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(utf8::sanitize("a\xC3\xBC" "b"), "a\xC3\xBC" "b");
  EXPECT_EQ(utf8::sanitize("\x80\x80"), fffd + fffd);
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98" "A"), fffd + "A");
  EXPECT_EQ(utf8::sanitize("\xE0\x80"), fffd + fffd);
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), fffd + fffd);
  EXPECT_EQ(utf8::sanitize("\xFF" "a"), fffd + "a");
  EXPECT_EQ(utf8::sanitize("\xE2\x82"), fffd);
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98\x80\xF0\x9F"), "\xF0\x9F\x98\x80" + fffd);
  EXPECT_EQ(utf8::sanitize(std::string("\0", 1)), std::string("\0", 1));
}

TEST(Utf8, SanitizeOutputIsValidAndChunkingInvariant) {
  for (std::uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0x70, 0xFF);  // mostly non-ASCII
    std::string bytes;
    for (int i = 0; i < 40; ++i) bytes += static_cast<char>(byte(rng));
    const std::string whole = utf8::sanitize(bytes);
    EXPECT_TRUE(utf8::validate(whole));
    utf8::sanitizer chunked;
    std::string out;
    for (char c : bytes) {
      chunked.push(std::string_view(&c, 1), out);
      chunked.check_invariants();
    }
    chunked.finish(out);
    EXPECT_EQ(out, whole);
  }
}

// ---- streaming detokenizer -----------------------------------------------------------------

/// Streams `ids` through a fresh detokenizer, checking invariants after every step.
std::string stream_all(const tokenizer& tok, const ids_t& ids) {
  stream_detokenizer stream(tok);
  std::string out;
  for (const std::int32_t id : ids) {
    out += stream.push(id);
    stream.check_invariants();
  }
  out += stream.finish();
  stream.check_invariants();
  EXPECT_EQ(stream.num_pending_bytes(), 0u);
  return out;
}

TEST(StreamDetokenizer, GoldenCasesEqualBatchDecode) {
  const tokenizer tok = load_tok512();
  for (const golden_case& c : load_golden_cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(stream_all(tok, c.token_ids), c.text);
    EXPECT_EQ(stream_all(tok, c.token_ids), tok.decode(c.token_ids));
  }
}

TEST(StreamDetokenizer, SplitCharacterIsNeverEmittedHalf) {
  const tokenizer tok = load_tok512();
  const ids_t smiley = encode_ok(tok, "\xF0\x9F\x98\x80", true);  // 😀 = F0 9F 98 80
  ASSERT_EQ(smiley, (ids_t{1, 410, 243, 162, 155, 131}));
  stream_detokenizer stream(tok);
  EXPECT_EQ(stream.push(1), "");
  EXPECT_EQ(stream.push(410), "");  // the dummy-prefix space, stripped after BOS
  EXPECT_EQ(stream.push(243), "");
  EXPECT_EQ(stream.num_pending_bytes(), 1u);
  EXPECT_EQ(stream.push(162), "");
  EXPECT_EQ(stream.push(155), "");
  EXPECT_EQ(stream.num_pending_bytes(), 3u);
  stream.check_invariants();
  EXPECT_EQ(stream.push(131), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.num_pending_bytes(), 0u);
  EXPECT_EQ(stream.push(198), "");  // ü = C3 BC
  EXPECT_EQ(stream.push(191), "\xC3\xBC");
  EXPECT_EQ(stream.push(403), " Once");
  EXPECT_EQ(stream.finish(), "");
  stream.check_invariants();
}

TEST(StreamDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  const tokenizer tok = load_tok512();
  const auto b = [](int byte) { return 3 + byte; };
  stream_detokenizer stream(tok);
  EXPECT_EQ(stream.push(b(0x80)), fffd);       // lone continuation byte
  EXPECT_EQ(stream.push(b(0xC3)), "");         // starts a 2-byte character...
  EXPECT_EQ(stream.push(403), fffd + " Once");  // ...that a piece breaks
  EXPECT_EQ(stream.push(b(0xE0)), "");
  EXPECT_EQ(stream.push(b(0x80)), fffd + fffd);  // overlong: E0 80 is two maximal subparts
  EXPECT_EQ(stream.push(b(0xED)), "");
  EXPECT_EQ(stream.push(b(0xA0)), fffd + fffd);  // surrogate
  EXPECT_EQ(stream.push(b(0xF4)), "");
  EXPECT_EQ(stream.push(b(0x90)), fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(stream.push(b(0xFF)), fffd);
  EXPECT_EQ(stream.push(b(0xF0)), "");
  EXPECT_EQ(stream.push(b(0x9F)), "");
  stream.check_invariants();
  EXPECT_EQ(stream.finish(), fffd);  // incomplete tail
  EXPECT_EQ(stream.finish(), "");
}

TEST(StreamDetokenizer, RandomSequencesEqualBatchDecode) {
  const tokenizer tok = load_tok512();
  for (std::uint32_t seed = 1; seed <= 500; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::size_t> length(0, 48);
    std::uniform_int_distribution<std::int32_t> any_id(0, 511);
    std::uniform_int_distribution<std::int32_t> high_byte_id(3 + 0x80, 258);
    std::bernoulli_distribution pick_byte(0.6);
    ids_t ids;
    for (std::size_t i = length(rng); i > 0; --i) {
      ids.push_back(pick_byte(rng) ? high_byte_id(rng) : any_id(rng));
    }
    const std::string streamed = stream_all(tok, ids);
    ASSERT_EQ(streamed, tok.decode(ids));
    ASSERT_TRUE(utf8::validate(streamed));
  }
}

// ---- bad files -----------------------------------------------------------------------------

void expect_error(const error& e, errc code, const std::vector<std::string>& fragments) {
  EXPECT_EQ(e.code, code) << to_string(e.code) << ": " << e.message;
  for (const std::string& fragment : fragments) {
    EXPECT_NE(e.message.find(fragment), std::string::npos)
        << "'" << fragment << "' not in: " << e.message;
  }
}

TEST(TokenizerLoadErrors, MissingFile) {
  const std::string path = testing::test_data("no_such_tokenizer.bin");
  const expected<tokenizer> tok = tokenizer::load(path, 512);
  ASSERT_FALSE(tok);
  expect_error(tok.error(), errc::io_error, {"cannot open tokenizer file '" + path + "'"});
}

TEST(TokenizerLoadErrors, TruncatedFile) {
  const std::string bytes = read_bytes(tok512_path);
  ASSERT_EQ(bytes.size(), 6227u);
  const std::string path = ::testing::TempDir() + "tok512_truncated.bin";
  const std::vector<std::pair<std::size_t, std::string>> cuts = {
      {2, "reading max_token_length"},
      {6, "reading the score of token 0"},
      {10, "reading the length of token 0"},
      {14, "the 5 bytes of token 0's piece"},
      {6226, "the 3 bytes of token 511's piece"},
  };
  for (const auto& [size, what] : cuts) {
    write_bytes(path, std::string_view(bytes).substr(0, size));
    const expected<tokenizer> tok = tokenizer::load(path, 512);
    ASSERT_FALSE(tok) << size;
    expect_error(tok.error(), errc::malformed_file,
                 {"tokenizer file '" + path + "'", "truncated",
                  "ends at byte " + std::to_string(size), what});
  }
  std::remove(path.c_str());
}

TEST(TokenizerLoadErrors, WrongVocabSize) {
  const expected<tokenizer> too_small = tokenizer::load(tok512_path, 511);
  ASSERT_FALSE(too_small);
  expect_error(too_small.error(), errc::malformed_file,
               {tok512_path, "bytes follow the last of 511 tokens"});
  const expected<tokenizer> too_large = tokenizer::load(tok512_path, 513);
  ASSERT_FALSE(too_large);
  expect_error(too_large.error(), errc::malformed_file,
               {tok512_path, "truncated", "score of token 512"});
  const expected<tokenizer> below_bytes = tokenizer::load(tok512_path, 100);
  ASSERT_FALSE(below_bytes);
  expect_error(below_bytes.error(), errc::invalid_argument,
               {tok512_path, "vocab_size must be at least 259, got 100"});
}

TEST(TokenizerLoadErrors, BadLengths) {
  std::string negative = serialize_vocab({});
  append_entry(negative, 0.0f, "");
  std::memcpy(&negative[negative.size() - 4], "\xFF\xFF\xFF\xFF", 4);  // length -1
  expect_error(tokenizer::from_bytes(negative, 260, "neg.bin").error(), errc::malformed_file,
               {"tokenizer file 'neg.bin'", "token 259 has length -1, outside [1, 8]"});

  std::string oversize = serialize_vocab({{0.0f, "123456789"}});
  expect_error(tokenizer::from_bytes(oversize, 260, "big.bin").error(), errc::malformed_file,
               {"token 259 has length 9, outside [1, 8]"});

  std::string empty = serialize_vocab({{0.0f, ""}});
  expect_error(tokenizer::from_bytes(empty, 260, "empty.bin").error(), errc::malformed_file,
               {"token 259 has length 0"});

  std::string zero_max = serialize_vocab({{0.0f, "a"}}, 0);
  expect_error(tokenizer::from_bytes(zero_max, 260, "zero.bin").error(), errc::malformed_file,
               {"'zero.bin': max_token_length must be positive, got 0"});
}

TEST(TokenizerLoadErrors, MisspelledByteToken) {
  std::string bytes = serialize_vocab({{0.0f, "a"}});
  const std::size_t at = bytes.find("<0x41>");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] = ']';
  expect_error(tokenizer::from_bytes(bytes, 260, "bytes.bin").error(), errc::malformed_file,
               {"'bytes.bin': token 68 must be the byte token <0x41>, found '<0x41]'"});
}

// ---- bad text ------------------------------------------------------------------------------

TEST(TokenizerEncodeErrors, InvalidUtf8NamesOffsetAndReason) {
  const tokenizer tok = load_tok512();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ab\x80", "byte offset 2: unexpected continuation byte 0x80"},
      {"a\xE2\x82", "byte offset 1: truncated sequence: lead byte 0xE2 needs 3 bytes, input "
                    "ends after 2"},
      {"\xE2\x82" "a", "byte offset 0: truncated sequence: byte 2 after lead byte 0xE2 is 0x61, "
                       "not a continuation byte"},
      {"x\xC0\xAF", "byte offset 1: overlong encoding (lead byte 0xC0)"},
      {"\xE0\x80\xAF", "byte offset 0: overlong encoding (0xE0 0x80)"},
      {"\xF0\x8F\xBF\xBF", "byte offset 0: overlong encoding (0xF0 0x8F)"},
      {"xy\xED\xA0\x80", "byte offset 2: encoded surrogate (U+D800..U+DFFF) (0xED 0xA0)"},
      {"\xF4\x90\x80\x80", "byte offset 0: code point above U+10FFFF (0xF4 0x90)"},
      {"\xF5\x80\x80\x80", "byte offset 0: code point above U+10FFFF (lead byte 0xF5)"},
      {"ok \xFF", "byte offset 3: byte 0xFF never appears in UTF-8"},
  };
  for (const auto& [text, message] : cases) {
    const expected<ids_t> ids = tok.encode(text, true, false);
    ASSERT_FALSE(ids) << message;
    EXPECT_EQ(ids.error().code, errc::invalid_utf8);
    EXPECT_EQ(ids.error().message, "invalid UTF-8 at " + message);
  }
  // The edges of the valid ranges are accepted.
  for (const char* text : {"\xC2\x80", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80",
                           "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF", "\xEF\xBF\xBF"}) {
    EXPECT_TRUE(tok.encode(text, false, false)) << text;
  }
}

}  // namespace
}  // namespace troupe
