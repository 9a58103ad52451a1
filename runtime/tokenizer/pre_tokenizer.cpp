#include "runtime/tokenizer/pre_tokenizer.hpp"

#include <array>
#include <utility>

#include "runtime/tokenizer/unicode_class.hpp"

namespace troupe {
namespace {

/// llama.cpp's `tokenizer.ggml.pre` names, grouped by the rules they share (llama-vocab.cpp).
/// The first name of each kind is its canonical one (pre_tokenizer_name).
constexpr std::array<std::pair<std::string_view, pre_tokenizer>, 60> names = {{
    {"gpt-2", pre_tokenizer::gpt2},
    {"phi-2", pre_tokenizer::gpt2},
    {"mpt", pre_tokenizer::gpt2},
    {"olmo", pre_tokenizer::gpt2},
    {"jais", pre_tokenizer::gpt2},
    {"roberta-bpe", pre_tokenizer::gpt2},
    {"gigachat", pre_tokenizer::gpt2},
    {"jina-es", pre_tokenizer::gpt2},
    {"jina-de", pre_tokenizer::gpt2},
    {"jina-v1-en", pre_tokenizer::gpt2},
    {"jina-v2-es", pre_tokenizer::gpt2},
    {"jina-v2-de", pre_tokenizer::gpt2},
    {"jina-v2-code", pre_tokenizer::gpt2},
    {"a.x-4.0", pre_tokenizer::gpt2},
    {"mellum", pre_tokenizer::gpt2},
    {"exaone4", pre_tokenizer::gpt2},
    {"trillion", pre_tokenizer::gpt2},
    {"granite-docling", pre_tokenizer::gpt2},
    {"default", pre_tokenizer::default_bpe},
    {"falcon", pre_tokenizer::falcon},
    {"starcoder", pre_tokenizer::starcoder},
    {"refact", pre_tokenizer::starcoder},
    {"command-r", pre_tokenizer::starcoder},
    {"smollm", pre_tokenizer::starcoder},
    {"codeshell", pre_tokenizer::starcoder},
    {"exaone", pre_tokenizer::starcoder},
    {"minerva-7b", pre_tokenizer::starcoder},
    {"deepseek-coder", pre_tokenizer::deepseek_coder},
    {"llama3", pre_tokenizer::llama3},
    {"llama-v3", pre_tokenizer::llama3},
    {"llama-bpe", pre_tokenizer::llama3},
    {"falcon3", pre_tokenizer::llama3},
    {"falcon-h1", pre_tokenizer::llama3},
    {"pixtral", pre_tokenizer::llama3},
    {"midm-2.0", pre_tokenizer::llama3},
    {"lfm2", pre_tokenizer::llama3},
    {"dbrx", pre_tokenizer::llama3},
    {"smaug-bpe", pre_tokenizer::llama3},
    {"chatglm-bpe", pre_tokenizer::llama3},
    {"glm4", pre_tokenizer::llama3},
    {"qwen2", pre_tokenizer::qwen2},
    {"deepseek-r1-qwen", pre_tokenizer::qwen2},
    {"kormo", pre_tokenizer::qwen2},
    {"stablelm2", pre_tokenizer::qwen2},
    {"megrez", pre_tokenizer::qwen2},
    {"hunyuan", pre_tokenizer::qwen2},
    {"grok-2", pre_tokenizer::qwen2},
    {"bailingmoe", pre_tokenizer::qwen2},
    {"bailingmoe2", pre_tokenizer::qwen2},
    {"llada-moe", pre_tokenizer::qwen2},
    {"seed-coder", pre_tokenizer::seed_coder},
    {"bloom", pre_tokenizer::bloom},
    {"poro-chat", pre_tokenizer::bloom},
    {"gpt3-finnish", pre_tokenizer::bloom},
    {"viking", pre_tokenizer::viking},
    {"tekken", pre_tokenizer::tekken},
    {"gpt-4o", pre_tokenizer::gpt4o},
    {"llama4", pre_tokenizer::gpt4o},
    {"minimax-m2", pre_tokenizer::gpt4o},
    {"deepseek-llm", pre_tokenizer::deepseek_llm},
}};

/// One piece of text being split: code points [begin, end) of the whole text.
struct piece_view {
  std::u32string_view text;
  std::size_t begin = 0;
  std::size_t end = 0;

  [[nodiscard]] bool holds(std::size_t pos) const { return pos >= begin && pos < end; }
  /// The class of the code point at `pos`; outside the piece, none (all false).
  [[nodiscard]] unicode::char_class at(std::size_t pos) const {
    return holds(pos) ? unicode::classify(text[pos]) : unicode::char_class{};
  }
};

bool is_other(const unicode::char_class& c) { return !c.is_whitespace && !c.is_letter && !c.is_number; }

/// The length of the gpt-2 rule's match at `pos` (always >= 1: a code point no alternative
/// takes is a word of its own).
std::size_t gpt2_match(const piece_view& p, std::size_t pos) {
  const char32_t c = p.text[pos];
  if (c == U'\'' && p.holds(pos + 1)) {
    const char32_t n = p.text[pos + 1];
    if (n == U's' || n == U't' || n == U'm' || n == U'd') return 2;
    if (p.holds(pos + 2)) {
      const char32_t nn = p.text[pos + 2];
      if ((n == U'r' && nn == U'e') || (n == U'v' && nn == U'e') || (n == U'l' && nn == U'l')) return 3;
    }
  }
  // ` ?X+`: an optional space, then a run of one class, decided by the code point after it.
  const std::size_t first = c == U' ' ? pos + 1 : pos;
  const unicode::char_class head = p.at(first);
  const auto run = [&](auto same) {
    std::size_t end = first;
    while (p.holds(end) && same(p.at(end))) ++end;
    return end - pos;
  };
  if (head.is_letter) return run([](const unicode::char_class& k) { return k.is_letter; });
  if (head.is_number) return run([](const unicode::char_class& k) { return k.is_number; });
  if (p.holds(first) && is_other(head)) return run(is_other);
  std::size_t num_spaces = 0;
  while (p.at(pos + num_spaces).is_whitespace) ++num_spaces;
  if (num_spaces > 1 && p.holds(pos + num_spaces)) return num_spaces - 1;  // \s+(?!\S)
  return num_spaces > 0 ? num_spaces : 1;
}

bool is_line_break(char32_t c) { return c == U'\r' || c == U'\n'; }

/// The whitespace alternatives the llama3 rule shares: `\s*[\r\n]+|\s+(?!\S)|\s+`, and a
/// code point no alternative takes as a word of its own.
std::size_t llama3_spaces(const piece_view& p, std::size_t pos) {
  std::size_t num_spaces = 0;
  std::size_t after_line_break = 0;  // the end of the run's last \r or \n
  while (p.at(pos + num_spaces).is_whitespace) {
    if (is_line_break(p.text[pos + num_spaces])) after_line_break = num_spaces + 1;
    ++num_spaces;
  }
  if (after_line_break > 0) return after_line_break;
  if (num_spaces > 1 && p.holds(pos + num_spaces)) return num_spaces - 1;
  return num_spaces > 0 ? num_spaces : 1;
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `pos`: its length, 0 for none.
std::size_t contraction(const piece_view& p, std::size_t pos) {
  if (!p.holds(pos + 1) || p.text[pos] != U'\'') return 0;
  const char32_t n = p.text[pos + 1] | 0x20;
  if (n == U's' || n == U't' || n == U'm' || n == U'd') return 2;
  if (p.holds(pos + 2)) {
    const char32_t nn = p.text[pos + 2] | 0x20;
    if ((n == U'r' && nn == U'e') || (n == U'v' && nn == U'e') || (n == U'l' && nn == U'l')) return 3;
  }
  return 0;
}

/// The llama3 rule, with `\p{N}{1,max_digits}` (llama3: 3; qwen2: 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+`, as llama.cpp's unicode_regex_split_custom_llama3 runs it; without
/// `line_breaks_after_other` the other-run takes no `[\r\n]*` (seed-coder's).
template <std::size_t max_digits, bool line_breaks_after_other = true>
std::size_t llama3_match(const piece_view& p, std::size_t pos) {
  const char32_t c = p.text[pos];
  if (const std::size_t n = contraction(p, pos)) return n;
  const unicode::char_class here = p.at(pos);
  if (!is_line_break(c) && !here.is_number && (here.is_letter || p.at(pos + 1).is_letter)) {
    std::size_t end = pos + 1;
    while (p.at(end).is_letter) ++end;
    return end - pos;
  }
  if (here.is_number) {
    std::size_t end = pos;
    while (end - pos < max_digits && p.at(end).is_number) ++end;
    return end - pos;
  }
  const std::size_t first = c == U' ' ? pos + 1 : pos;
  if (p.holds(first) && is_other(p.at(first))) {
    std::size_t end = first;
    while (p.holds(end) && is_other(p.at(end))) ++end;
    while (line_breaks_after_other && p.holds(end) && is_line_break(p.text[end])) ++end;
    return end - pos;
  }
  return llama3_spaces(p, pos);
}

bool is_ascii_lower(char32_t c) { return c >= U'a' && c <= U'z'; }
bool is_ascii_upper(char32_t c) { return c >= U'A' && c <= U'Z'; }

/// Tekken's letter alternatives after an optional `[^\r\n\p{L}\p{N}]` at `q`: `X*Y+ | X+Y*` with
/// X a letter not in a-z and Y a letter not in A-Z (regex backtracking spelt out: the longest
/// X run that still leaves a Y); the end, or `q` for no match.
std::size_t tekken_letters(const piece_view& p, std::size_t q) {
  const auto is_x = [&](std::size_t i) { return p.at(i).is_letter && !is_ascii_lower(p.text[i]); };
  const auto is_y = [&](std::size_t i) { return p.at(i).is_letter && !is_ascii_upper(p.text[i]); };
  std::size_t x_end = q;
  while (is_x(x_end)) ++x_end;
  for (std::size_t y = x_end + 1; y-- > q;) {  // X*Y+: the longest X* whose next code point is a Y
    if (!is_y(y)) continue;
    std::size_t end = y;
    while (is_y(end)) ++end;
    return end;
  }
  if (x_end == q) return q;
  std::size_t end = x_end;  // X+Y*
  while (is_y(end)) ++end;
  return end;
}

/// Tekken's rule (Mistral's, as llama.cpp writes it): `[^\r\n\p{L}\p{N}]?X*Y+ |
/// [^\r\n\p{L}\p{N}]?X+Y* | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n/]* | \s*[\r\n]+ | \s+(?!\S) | \s+`;
/// gpt-4o's (`gpt4o`) lets each letter alternative end with a contraction
/// (`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?`) and takes `\p{N}{1,3}`.
template <bool gpt4o>
std::size_t tekken_match(const piece_view& p, std::size_t pos) {
  const char32_t c = p.text[pos];
  const unicode::char_class here = p.at(pos);
  const std::size_t q = here.is_letter || is_line_break(c) || here.is_number ? pos : pos + 1;
  if (q == pos || p.holds(q)) {
    const std::size_t end = tekken_letters(p, q);
    if (end > q) return end - pos + (gpt4o ? contraction(p, end) : 0);
  }
  if (here.is_number) {
    std::size_t end = pos + 1;
    while (gpt4o && end - pos < 3 && p.at(end).is_number) ++end;
    return end - pos;
  }
  const std::size_t first = c == U' ' ? pos + 1 : pos;
  if (p.holds(first) && is_other(p.at(first))) {
    std::size_t end = first;
    while (p.holds(end) && is_other(p.at(end))) ++end;
    while (p.holds(end) && (is_line_break(p.text[end]) || p.text[end] == U'/')) ++end;
    return end - pos;
  }
  return llama3_spaces(p, pos);
}

/// deepseek-llm's cased letters (llama.cpp's class, as code point ranges).
constexpr std::pair<char32_t, char32_t> deepseek_letters[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
    {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F},
    {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

/// deepseek-llm's punctuation: ASCII's and its full-width forms, quotation marks, CJK's.
constexpr std::pair<char32_t, char32_t> deepseek_punctuation[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

template <std::size_t N>
bool in_ranges(const std::pair<char32_t, char32_t> (&ranges)[N], char32_t c) {
  for (const auto& [lo, hi] : ranges)
    if (c >= lo && c <= hi) return true;
  return false;
}

/// `\s?[class]+`, the class a set of ranges.
template <const auto& ranges>
std::size_t optional_space_then_class(const piece_view& p, std::size_t pos) {
  const auto inside = [&](std::size_t i) { return p.holds(i) && in_ranges(ranges, p.text[i]); };
  const std::size_t first = p.at(pos).is_whitespace && inside(pos + 1) ? pos + 1 : pos;
  std::size_t end = first;
  while (inside(end)) ++end;
  return end - pos;  // 0 when the run is empty: then first == pos
}

/// `\s+$`: whitespace that runs to the end of the piece.
std::size_t trailing_spaces(const piece_view& p, std::size_t pos) {
  std::size_t end = pos;
  while (p.at(end).is_whitespace) ++end;
  return end > pos && end == p.end ? end - pos : 0;
}

std::size_t digit_run(const piece_view& p, std::size_t pos) {
  std::size_t end = pos;
  while (p.at(end).is_number) ++end;
  return end - pos;
}

/// BLOOM's ` ?[^(\s|.,!?…。，、।۔،)]+`: an optional space, then a run outside that class.
std::size_t bloom_match(const piece_view& p, std::size_t pos) {
  static constexpr std::u32string_view stops = U"(|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)";
  const auto inside = [&](std::size_t i) {
    return p.holds(i) && !p.at(i).is_whitespace && stops.find(p.text[i]) == std::u32string_view::npos;
  };
  const std::size_t first = p.text[pos] == U' ' ? pos + 1 : pos;
  if (!inside(first)) return 0;
  std::size_t end = first;
  while (inside(end)) ++end;
  return end - pos;
}

/// `[\p{P}\$\+<=>\^~\|]+` (llama.cpp's default rule) and, with `with_backtick`, falcon's
/// `[\p{P}\$\+<=>\^~\|`]+`.
template <bool with_backtick>
std::size_t punctuation_run(const piece_view& p, std::size_t pos) {
  static constexpr std::u32string_view symbols = U"$+<=>^~|";
  const auto inside = [&](std::size_t i) {
    if (!p.holds(i)) return false;
    const char32_t c = p.text[i];
    return p.at(i).is_punctuation || symbols.find(c) != std::u32string_view::npos || (with_backtick && c == U'`');
  };
  std::size_t end = pos;
  while (inside(end)) ++end;
  return end - pos;
}

/// `[0-9][0-9][0-9]`.
std::size_t three_ascii_digits(const piece_view& p, std::size_t pos) {
  for (std::size_t i = pos; i < pos + 3; i++)
    if (!p.holds(i) || p.text[i] < U'0' || p.text[i] > U'9') return 0;
  return 3;
}

/// A rule matching at one position: the length of its match there, 0 for none.
using match_fn = std::size_t (*)(const piece_view&, std::size_t);

std::size_t one_digit(const piece_view& p, std::size_t pos) { return p.at(pos).is_number ? 1 : 0; }

std::size_t one_line_break(const piece_view& p, std::size_t pos) {
  return p.text[pos] == U'\r' || p.text[pos] == U'\n' ? 1 : 0;
}

/// `\s?X+` where `is_x` picks X's class.
template <bool unicode::char_class::*is_x>
std::size_t optional_space_then_run(const piece_view& p, std::size_t pos) {
  std::size_t first = pos;
  if (p.at(pos).is_whitespace && p.at(pos + 1).*is_x) first = pos + 1;
  std::size_t end = first;
  while (p.at(end).*is_x) ++end;
  return end - pos;  // 0 when the run is empty: then first == pos
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) || (c >= 0xAC00 && c <= 0xD7FF);
}

std::size_t cjk_run(const piece_view& p, std::size_t pos) {
  std::size_t end = pos;
  while (p.holds(end) && is_cjk(p.text[end])) ++end;
  return end - pos;
}

/// Splits every piece into the leftmost non-overlapping matches of `match` and the text
/// between them (a regex iterator over the piece).
std::vector<std::size_t> split_by_matches(std::u32string_view text, const std::vector<std::size_t>& pieces,
                                          match_fn match) {
  std::vector<std::size_t> out;
  std::size_t begin = 0;
  for (const std::size_t length : pieces) {
    const piece_view p{text, begin, begin + length};
    std::size_t gap_begin = begin;
    for (std::size_t pos = begin; pos < p.end;) {
      const std::size_t n = match(p, pos);
      if (n == 0) {
        ++pos;
        continue;
      }
      if (pos > gap_begin) out.push_back(pos - gap_begin);
      out.push_back(n);
      pos += n;
      gap_begin = pos;
    }
    if (p.end > gap_begin) out.push_back(p.end - gap_begin);
    begin = p.end;
  }
  return out;
}

}  // namespace

expected<pre_tokenizer> parse_pre_tokenizer(std::string_view name, const std::string& source) {
  std::string supported;
  for (const auto& [known, kind] : names) {
    if (known == name) return kind;
    supported += (supported.empty() ? "" : ", ") + std::string(known);
  }
  // Not yet: chameleon, deepseek-v3, superbpe, kimi-k2, afmoe and the newer ones.
  return fail(errc::malformed_file, source + ": tokenizer.ggml.pre '" + echo(name) +
                                        "' is not a supported pre-tokenizer (supported: " + supported + ")");
}

bool ignores_merges(std::string_view name) {
  for (const std::string_view n :
       {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken"})
    if (n == name) return true;
  return false;
}

std::string_view pre_tokenizer_name(pre_tokenizer kind) {
  for (const auto& [name, known] : names)
    if (known == kind) return name;
  TROUPE_ASSERT_MSG(false, "pre_tokenizer_name(): unknown kind");
  return {};
}

std::vector<std::size_t> split_words(pre_tokenizer kind, std::u32string_view text) {
  std::vector<std::size_t> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text.size());
  std::vector<match_fn> rules;
  switch (kind) {
    case pre_tokenizer::gpt2: rules = {gpt2_match}; break;
    case pre_tokenizer::default_bpe: rules = {punctuation_run<false>, gpt2_match, digit_run, three_ascii_digits}; break;
    case pre_tokenizer::falcon: rules = {punctuation_run<true>, gpt2_match, three_ascii_digits}; break;
    case pre_tokenizer::starcoder: rules = {one_digit, gpt2_match}; break;
    case pre_tokenizer::deepseek_coder:
      rules = {one_line_break, optional_space_then_run<&unicode::char_class::is_letter>,
               optional_space_then_run<&unicode::char_class::is_punctuation>, cjk_run, one_digit};
      break;
    case pre_tokenizer::llama3: rules = {llama3_match<3>}; break;
    case pre_tokenizer::qwen2: rules = {llama3_match<1>}; break;
    case pre_tokenizer::seed_coder: rules = {llama3_match<1, false>}; break;
    case pre_tokenizer::bloom: rules = {bloom_match}; break;
    case pre_tokenizer::viking: rules = {bloom_match, one_digit}; break;
    case pre_tokenizer::tekken: rules = {tekken_match<false>}; break;
    case pre_tokenizer::gpt4o: rules = {tekken_match<true>}; break;
    case pre_tokenizer::deepseek_llm:
      rules = {one_line_break, optional_space_then_class<deepseek_letters>,
               optional_space_then_class<deepseek_punctuation>, trailing_spaces, cjk_run, digit_run};
      break;
  }
  for (const match_fn rule : rules) pieces = split_by_matches(text, pieces, rule);
  return pieces;
}

}  // namespace troupe
