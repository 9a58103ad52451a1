#include "runtime/tokenizer/bpe_vocab.hpp"

#include <algorithm>
#include <cstdio>

#include "runtime/tokenizer/pair_merge.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe {
namespace {

/// GPT-2's byte-to-unicode mapping: the code point that stands for each byte.
constexpr std::array<char32_t, 256> make_byte_chars() {
  std::array<char32_t, 256> chars{};
  char32_t next_unprintable = 0x100;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    chars[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return chars;
}
constexpr std::array<char32_t, 256> byte_chars = make_byte_chars();
constexpr char32_t max_byte_char = 0x100 + 68 - 1;  // the 68 unprintable bytes follow U+00FF

/// The inverse mapping: the byte each code point up to max_byte_char stands for, -1 for none.
constexpr std::array<std::int16_t, max_byte_char + 1> make_char_bytes() {
  std::array<std::int16_t, max_byte_char + 1> bytes{};
  for (auto& b : bytes) b = -1;
  for (int byte = 0; byte < 256; ++byte) bytes[byte_chars[byte]] = static_cast<std::int16_t>(byte);
  return bytes;
}
constexpr std::array<std::int16_t, max_byte_char + 1> char_bytes = make_char_bytes();

std::string byte_char_text(unsigned char byte) {
  std::string out;
  utf8::append(out, byte_chars[byte]);
  return out;
}

/// The bytes a normal token's text spells, or nullopt if a character is not a byte character.
std::optional<std::string> decode_byte_chars(std::string_view text) {
  if (!utf8::validate(text)) return std::nullopt;
  std::string out;
  for (const char32_t cp : utf8::decode(text)) {
    if (cp > max_byte_char || char_bytes[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(char_bytes[cp]));
  }
  return out;
}

tl::unexpected<error> bad(const std::string& source, const std::string& what) {
  return fail(errc::malformed_file, source + ": " + what);
}

/// A token's text in an error: control bytes escaped, at most echo_bytes_max bytes of it.
std::string quoted(std::string_view text) {
  std::string out = "'";
  for (const char c : echo(text)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\x%02X", static_cast<unsigned>(byte));
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

expected<bpe_vocab> bpe_vocab::from_gguf(const model::gguf_file& f, std::int32_t vocab_size,
                                         const std::string& source) {
  bpe_vocab v;
  auto pre = f.get_string("tokenizer.ggml.pre", source);
  if (!pre) return tl::make_unexpected(pre.error());
  auto kind = parse_pre_tokenizer(*pre, source);
  if (!kind) return tl::make_unexpected(kind.error());
  v.pre_ = *kind;
  v.ignore_merges_ = ignores_merges(*pre);
  if (auto ok = v.read_tokens(f, vocab_size, source); !ok) return tl::make_unexpected(ok.error());
  if (auto ok = v.read_merges(f, source); !ok) return tl::make_unexpected(ok.error());
  if (auto ok = v.read_special_ids(f, source); !ok) return tl::make_unexpected(ok.error());
  v.check_invariants();
  return v;
}

expected<void> bpe_vocab::read_tokens(const model::gguf_file& f, std::int32_t vocab_size, const std::string& source) {
  auto tokens = f.get_array("tokenizer.ggml.tokens", model::gguf_type::string, source);
  if (!tokens) return tl::make_unexpected(tokens.error());
  if (static_cast<std::int64_t>((*tokens)->size()) != vocab_size)
    return bad(source, std::to_string((*tokens)->size()) + " tokens for a vocabulary of " + std::to_string(vocab_size));
  const model::gguf_array* types = nullptr;
  if (f.metadata.count("tokenizer.ggml.token_type")) {
    auto t = f.get_array("tokenizer.ggml.token_type", model::gguf_type::i32, source);
    if (!t) return tl::make_unexpected(t.error());
    if ((*t)->size() != (*tokens)->size())
      return bad(source, std::to_string((*t)->size()) + " token types for " + std::to_string((*tokens)->size()) + " tokens");
    types = *t;
  }
  texts_.reserve(static_cast<std::size_t>(vocab_size));
  pieces_.reserve(static_cast<std::size_t>(vocab_size));
  for (std::int32_t id = 0; id < vocab_size; ++id) {
    const std::string_view text = (*tokens)->string(static_cast<std::size_t>(id));
    const std::int64_t type = types ? types->integer(static_cast<std::size_t>(id)) : 1;
    const std::string which = "token " + std::to_string(id) + " " + quoted(text);
    if (text.empty()) return bad(source, "token " + std::to_string(id) + " is empty");
    if (type < 0 || type > 6) return bad(source, which + " has token type " + std::to_string(type) + " (0 to 6 exist)");
    types_.push_back(static_cast<token_type>(type));
    std::string piece;
    if (types_.back() == token_type::normal) {
      std::optional<std::string> bytes = decode_byte_chars(text);
      if (!bytes) return bad(source, which + " is a normal token but not spelled in byte characters");
      piece = std::move(*bytes);
    } else if (types_.back() == token_type::user_defined) {
      piece = std::string(text);
      if (!is_tag_text(text)) user_defined_ids_.push_back(id);
    }
    max_piece_bytes_ = std::max(max_piece_bytes_, static_cast<std::int32_t>(piece.size()));
    texts_.push_back(text);
    pieces_.push_back(piece);
  }
  texts_.build_index();
  for (std::int32_t id = 0; id < vocab_size; ++id)
    if (texts_.find(texts_[static_cast<std::size_t>(id)]) != id)
      return bad(source, "token " + std::to_string(id) + " " + quoted(texts_[static_cast<std::size_t>(id)]) +
                             " repeats an earlier token");
  for (int byte = 0; byte < 256; ++byte)
    byte_ids_[byte] = static_cast<std::int32_t>(texts_.find(byte_char_text(static_cast<unsigned char>(byte))));
  std::sort(user_defined_ids_.begin(), user_defined_ids_.end(), [this](std::int32_t a, std::int32_t b) {
    return texts_[a].size() != texts_[b].size() ? texts_[a].size() > texts_[b].size() : a < b;
  });
  return {};
}

expected<void> bpe_vocab::read_merges(const model::gguf_file& f, const std::string& source) {
  auto merges = f.get_array("tokenizer.ggml.merges", model::gguf_type::string, source);
  if (!merges) return tl::make_unexpected(merges.error());
  const auto id_of = [this](const std::string& text) { return static_cast<std::int32_t>(texts_.find(text)); };
  struct rule {
    std::int32_t left, right, rank, merged_id;
  };
  std::vector<rule> rules;
  rules.reserve((*merges)->size());
  for (std::size_t rank = 0; rank < (*merges)->size(); ++rank) {
    const std::string_view rule = (*merges)->string(rank);
    const std::string which = "merge " + std::to_string(rank) + " " + quoted(rule);
    // As llama.cpp: the first space after the first byte separates the two sides.
    const std::size_t space = rule.find(' ', 1);
    if (space == std::string::npos) return bad(source, which + " is not two tokens separated by a space");
    const std::string left(rule.substr(0, space));
    const std::string right(rule.substr(space + 1));
    const std::int32_t left_id = id_of(left), right_id = id_of(right), merged_id = id_of(left + right);
    if (left_id < 0) return bad(source, which + " names " + quoted(left) + ", which is not a token");
    if (right_id < 0) return bad(source, which + " names " + quoted(right) + ", which is not a token");
    if (merged_id < 0) return bad(source, which + " makes " + quoted(left + right) + ", which is not a token");
    rules.push_back({left_id, right_id, static_cast<std::int32_t>(rank), merged_id});
  }
  // By left token, then right; a repeated rule keeps its first (best) rank, as llama.cpp's map
  // insertion does.
  std::stable_sort(rules.begin(), rules.end(),
                   [](const rule& a, const rule& b) { return a.left != b.left ? a.left < b.left : a.right < b.right; });
  merge_starts_.assign(static_cast<std::size_t>(vocab_size()) + 1, 0);
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const rule& r = rules[i];
    if (i > 0 && rules[i - 1].left == r.left && rules[i - 1].right == r.right) continue;
    merge_rules_.push_back({r.right, r.rank, r.merged_id});
    merge_starts_[static_cast<std::size_t>(r.left) + 1] = static_cast<std::int32_t>(merge_rules_.size());
  }
  for (std::size_t t = 1; t < merge_starts_.size(); ++t) merge_starts_[t] = std::max(merge_starts_[t], merge_starts_[t - 1]);
  return {};
}

expected<void> bpe_vocab::read_special_ids(const model::gguf_file& f, const std::string& source) {
  for (const auto& [key, target] : {std::pair<const char*, std::int32_t*>{"tokenizer.ggml.bos_token_id", &bos_id_},
                                    {"tokenizer.ggml.eos_token_id", &eos_id_}}) {
    auto v = f.get_int(key, source);
    if (!v) return tl::make_unexpected(v.error());
    if (*v < 0 || *v >= vocab_size())
      return bad(source, std::string(key) + " = " + std::to_string(*v) + ", outside the vocabulary of " +
                             std::to_string(vocab_size()));
    *target = static_cast<std::int32_t>(*v);
  }
  if (f.metadata.count("tokenizer.ggml.add_bos_token")) {
    const model::gguf_value& add = f.metadata.at("tokenizer.ggml.add_bos_token");
    if (add.type != model::gguf_type::boolean) return bad(source, "tokenizer.ggml.add_bos_token is not a boolean");
    adds_bos_ = add.boolean;
  }
  return {};
}

bool bpe_vocab::is_tag_text(std::string_view text) {
  if (text.find_first_not_of(" \t\n\r") == std::string_view::npos) return false;  // whitespace
  return !utf8::validate(text) || utf8::decode(text).size() > 1;                    // not one character
}

bool bpe_vocab::is_tag(std::int32_t id) const {
  return type(id) == token_type::user_defined && is_tag_text(text(id));
}

expected<std::vector<std::int32_t>> bpe_vocab::encode(std::string_view text) const {
  // Cut out the user-defined tokens that are text (not tags): a row of text spans and token ids,
  // refined token by token.
  struct fragment {
    std::size_t begin = 0, length = 0;
    std::int32_t id = -1;  // -1: text still to encode
  };
  std::vector<fragment> fragments{{0, text.size(), -1}};
  for (const std::int32_t id : user_defined_ids_) {
    const std::string_view needle = texts_[static_cast<std::size_t>(id)];
    std::vector<fragment> next;
    for (const fragment& frag : fragments) {
      if (frag.id >= 0) {
        next.push_back(frag);
        continue;
      }
      const std::string_view span = text.substr(frag.begin, frag.length);
      std::size_t from = 0;
      for (std::size_t at; (at = span.find(needle, from)) != std::string_view::npos; from = at + needle.size()) {
        if (at > from) next.push_back({frag.begin + from, at - from, -1});
        next.push_back({frag.begin + at, needle.size(), id});
      }
      if (from < span.size()) next.push_back({frag.begin + from, span.size() - from, -1});
    }
    fragments = std::move(next);
  }
  std::vector<std::int32_t> ids;
  for (const fragment& frag : fragments) {
    if (frag.id >= 0) {
      ids.push_back(frag.id);
      continue;
    }
    const std::string_view span = text.substr(frag.begin, frag.length);
    const std::u32string cps = utf8::decode(span);
    std::size_t cp_at = 0, byte_at = frag.begin;
    for (const std::size_t num_cps : split_words(pre_, cps)) {
      std::size_t num_bytes = 0;
      for (std::size_t i = 0; i < num_cps; ++i) num_bytes += utf8::encoded_length(cps[cp_at + i]);
      if (auto ok = encode_word(text.substr(byte_at, num_bytes), byte_at, ids); !ok) return tl::make_unexpected(ok.error());
      cp_at += num_cps;
      byte_at += num_bytes;
    }
  }
  return ids;
}

expected<void> bpe_vocab::encode_word(std::string_view word, std::size_t offset, std::vector<std::int32_t>& out) const {
  // llama.cpp's ignore_merges (ignores_merges): a word that is a token is that token, whatever
  // the merges would make of it.
  if (ignore_merges_)
    if (const std::optional<std::int32_t> whole = find_piece(word)) {
      out.push_back(*whole);
      return {};
    }
  std::vector<std::int32_t> symbols;
  symbols.reserve(word.size());
  for (std::size_t i = 0; i < word.size(); ++i) {
    const auto byte = static_cast<unsigned char>(word[i]);
    if (byte_ids_[byte] < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(byte));
      return fail(errc::invalid_argument, "the vocabulary has no token for byte " + std::string(hex) +
                                              " (at byte offset " + std::to_string(offset + i) + " of the text)");
    }
    symbols.push_back(byte_ids_[byte]);
  }
  merge_best_pairs(symbols, [this](std::int32_t left, std::int32_t right) -> std::optional<pair_merge> {
    const merge_rule* rule = find_merge(left, right);
    if (rule == nullptr) return std::nullopt;
    return pair_merge{-static_cast<double>(rule->rank), rule->merged_id};  // rank 0 is best
  });
  out.insert(out.end(), symbols.begin(), symbols.end());
  return {};
}

std::optional<std::int32_t> bpe_vocab::find_piece(std::string_view bytes) const {
  std::string text;
  for (const char c : bytes) utf8::append(text, byte_chars[static_cast<unsigned char>(c)]);
  const auto id = static_cast<std::int32_t>(texts_.find(text));
  if (id < 0 || type(id) != token_type::normal) return std::nullopt;
  return id;
}

const bpe_vocab::merge_rule* bpe_vocab::find_merge(std::int32_t left, std::int32_t right) const {
  const auto first = merge_rules_.begin() + merge_starts_[static_cast<std::size_t>(left)];
  const auto last = merge_rules_.begin() + merge_starts_[static_cast<std::size_t>(left) + 1];
  const auto it = std::lower_bound(first, last, right, [](const merge_rule& r, std::int32_t x) { return r.right < x; });
  return it != last && it->right == right ? &*it : nullptr;
}

void bpe_vocab::check_invariants() const {
  TROUPE_ASSERT(texts_.size() == pieces_.size());
  TROUPE_ASSERT(texts_.size() == types_.size());
  texts_.check_invariants();
  pieces_.check_invariants();
  TROUPE_ASSERT(merge_starts_.size() == texts_.size() + 1 && merge_starts_.front() == 0 &&
                merge_starts_.back() == static_cast<std::int32_t>(merge_rules_.size()));
  for (std::size_t t = 0; t + 1 < merge_starts_.size(); ++t)
    for (std::int32_t i = merge_starts_[t]; i < merge_starts_[t + 1]; ++i) {
      const merge_rule& r = merge_rules_[static_cast<std::size_t>(i)];
      TROUPE_ASSERT(i == merge_starts_[t] || merge_rules_[static_cast<std::size_t>(i) - 1].right < r.right);
      TROUPE_ASSERT(r.right >= 0 && r.right < vocab_size() && r.merged_id >= 0 && r.merged_id < vocab_size());
    }
  TROUPE_ASSERT(bos_id_ >= 0 && bos_id_ < vocab_size());
  TROUPE_ASSERT(eos_id_ >= 0 && eos_id_ < vocab_size());
  for (std::int32_t id = 0; id < vocab_size(); ++id) {
    TROUPE_ASSERT(texts_.find(texts_[static_cast<std::size_t>(id)]) == id);
    TROUPE_ASSERT(pieces_[static_cast<std::size_t>(id)].size() <= static_cast<std::size_t>(max_piece_bytes_));
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (byte_ids_[byte] >= 0) TROUPE_ASSERT(texts_[static_cast<std::size_t>(byte_ids_[byte])] == byte_char_text(static_cast<unsigned char>(byte)));
  }
  for (std::size_t i = 1; i < user_defined_ids_.size(); ++i)
    TROUPE_ASSERT(texts_[user_defined_ids_[i - 1]].size() >= texts_[user_defined_ids_[i]].size());
  for (const std::int32_t id : user_defined_ids_) TROUPE_ASSERT(!is_tag(id));
}

}  // namespace troupe
