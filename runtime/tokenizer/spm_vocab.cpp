#include "runtime/tokenizer/spm_vocab.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "runtime/common/byte_reader.hpp"
#include "runtime/tokenizer/pair_merge.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe {
namespace {

/// llama2.c starts its best-merge search at -1e10 with a strict `>`: a piece scored at or below
/// it never merges.
constexpr float no_merge_score = -1e10f;

constexpr std::array<char, 256> make_byte_chars() {
  std::array<char, 256> chars{};
  for (int byte = 0; byte < 256; ++byte) chars[byte] = static_cast<char>(byte);
  return chars;
}

/// The one-byte strings byte tokens decode to (llama2.c's `byte_pieces`).
constexpr std::array<char, 256> byte_chars = make_byte_chars();

struct token_entry {
  float score = 0.0f;
  std::string piece;
};

tl::unexpected<error> truncated(const std::string& name, const byte_reader& in,
                                const std::string& what) {
  return fail(errc::malformed_file,
              name + ": truncated: the file ends at byte " +
                  std::to_string(in.offset() + in.remaining()) + " while reading " + what +
                  " (is the file complete, and is vocab_size right?)");
}

expected<token_entry> read_token(byte_reader& in, std::int32_t id, std::int32_t max_token_length,
                                 const std::string& name) {
  const std::string which = "token " + std::to_string(id);
  token_entry entry;
  if (!in.read(entry.score)) return truncated(name, in, "the score of " + which);
  std::int32_t length = 0;
  if (!in.read(length)) return truncated(name, in, "the length of " + which);
  if (length < 1 || length > max_token_length) {
    return fail(errc::malformed_file, name + ": " + which + " has length " +
                                          std::to_string(length) + ", outside [1, " +
                                          std::to_string(max_token_length) +
                                          "] (max_token_length)");
  }
  if (!in.read_bytes(static_cast<std::size_t>(length), entry.piece)) {
    return truncated(name, in,
                     "the " + std::to_string(length) + " bytes of " + which + "'s piece");
  }
  return entry;
}

std::string byte_token_spelling(int byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "<0x%02X>", byte);
  return buffer;
}

/// `text` with non-printable bytes written as \xNN, for error messages.
std::string escaped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) {
      out += c;
    } else {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02X", static_cast<unsigned>(byte));
      out += buffer;
    }
  }
  return out;
}

// ---- encoding ------------------------------------------------------------------------------

/// One character's piece, or one byte token per byte when the character has no piece.
void append_character(const spm_vocab& tok, std::string_view character,
                      std::vector<std::int32_t>& ids) {
  if (const std::optional<std::int32_t> id = tok.find_piece(character)) {
    ids.push_back(*id);
    return;
  }
  for (const char byte : character) {
    ids.push_back(spm_vocab::first_byte_id + static_cast<unsigned char>(byte));
  }
}

/// The dummy prefix " " (only for non-empty text) and then one symbol per character.
std::vector<std::int32_t> split_characters(const spm_vocab& tok, std::string_view text) {
  std::vector<std::int32_t> ids;
  if (text.empty()) return ids;
  ids.reserve(text.size() + 1);
  append_character(tok, " ", ids);
  std::size_t offset = 0;
  while (offset < text.size()) {
    const std::size_t length = utf8::sequence_length(static_cast<unsigned char>(text[offset]));
    append_character(tok, text.substr(offset, length), ids);
    offset += length;
  }
  return ids;
}

/// Merges the adjacent pair whose concatenated stored pieces (a byte token contributes
/// "<0xXX>", as in llama2.c) form the highest-scoring piece, until none does.
void merge_by_score(const spm_vocab& tok, std::vector<std::int32_t>& ids) {
  std::string buffer;
  merge_best_pairs(ids, [&](std::int32_t left, std::int32_t right) -> std::optional<pair_merge> {
    buffer.assign(tok.piece_text(left));
    buffer.append(tok.piece_text(right));
    const std::optional<std::int32_t> merged = tok.find_piece(buffer);
    if (!merged) return std::nullopt;
    const float score = tok.score(*merged);
    if (!(score > no_merge_score)) return std::nullopt;  // also drops NaN, which never wins in llama2.c
    return pair_merge{score, *merged};
  });
}

expected<void> check_vocab_size(std::int32_t vocab_size, const std::string& name) {
  if (vocab_size >= spm_vocab::first_normal_id) return {};
  return fail(errc::invalid_argument, name + ": vocab_size must be at least 259, got " + std::to_string(vocab_size) +
                                          " (3 control + 256 byte tokens)");
}

}  // namespace

expected<spm_vocab> spm_vocab::from_bytes(std::string_view bytes, std::int32_t vocab_size,
                                          const std::string& name) {
  if (auto ok = check_vocab_size(vocab_size, name); !ok) return tl::make_unexpected(ok.error());
  byte_reader in(bytes);
  spm_vocab tok;
  if (!in.read(tok.max_token_length_)) return truncated(name, in, "max_token_length");
  if (tok.max_token_length_ <= 0) {
    return fail(errc::malformed_file, name + ": max_token_length must be positive, got " +
                                          std::to_string(tok.max_token_length_));
  }
  tok.pieces_.reserve(static_cast<std::size_t>(vocab_size));
  tok.scores_.reserve(static_cast<std::size_t>(vocab_size));
  for (std::int32_t id = 0; id < vocab_size; ++id) {
    expected<token_entry> entry = read_token(in, id, tok.max_token_length_, name);
    if (!entry) return tl::make_unexpected(entry.error());
    tok.scores_.push_back(entry->score);
    tok.pieces_.push_back(std::move(entry->piece));
  }
  if (in.remaining() != 0) {
    return fail(errc::malformed_file,
                name + ": " + std::to_string(in.remaining()) + " bytes follow the last of " +
                    std::to_string(vocab_size) +
                    " tokens; the file holds more tokens than vocab_size");
  }
  if (expected<void> ok = tok.check_byte_tokens(name); !ok) return tl::make_unexpected(ok.error());
  tok.build_lookup();
  tok.check_invariants();
  return tok;
}

expected<spm_vocab> spm_vocab::from_gguf(const model::gguf_file& f, std::int32_t vocab_size,
                                         const std::string& name) {
  if (auto ok = check_vocab_size(vocab_size, name); !ok) return tl::make_unexpected(ok.error());
  for (const auto& [key, id] : {std::pair<const char*, std::int32_t>{"tokenizer.ggml.unknown_token_id", unk_id},
                                {"tokenizer.ggml.bos_token_id", bos}}) {
    if (!f.metadata.count(key)) continue;
    auto v = f.get_int(key, name);
    if (!v) return tl::make_unexpected(v.error());
    if (*v != id)
      return fail(errc::malformed_file, name + ": " + key + " = " + std::to_string(*v) + "; troupe's llama vocabulary "
                                            "needs " + std::to_string(id));
  }
  auto tokens = f.get_array("tokenizer.ggml.tokens", model::gguf_type::string, name);
  if (!tokens) return tl::make_unexpected(tokens.error());
  auto scores = f.get_array("tokenizer.ggml.scores", model::gguf_type::f32, name);
  if (!scores) return tl::make_unexpected(scores.error());
  if (static_cast<std::int64_t>((*tokens)->size()) != vocab_size || (*scores)->size() != (*tokens)->size())
    return fail(errc::malformed_file, name + ": " + std::to_string((*tokens)->size()) + " tokens and " +
                                          std::to_string((*scores)->size()) + " scores for a vocabulary of " +
                                          std::to_string(vocab_size));
  spm_vocab tok;
  for (std::size_t id = 0; id < (*tokens)->size(); ++id) {
    std::string piece((*tokens)->string(id));
    if (piece.empty()) return fail(errc::malformed_file, name + ": token " + std::to_string(id) + " is empty");
    for (std::size_t at; (at = piece.find(sentencepiece_space)) != std::string::npos;)
      piece.replace(at, sentencepiece_space.size(), " ");
    tok.max_token_length_ = std::max(tok.max_token_length_, static_cast<std::int32_t>(piece.size()));
    tok.pieces_.push_back(std::move(piece));
    tok.scores_.push_back(static_cast<float>((*scores)->number(id)));
  }
  if (expected<void> ok = tok.check_byte_tokens(name); !ok) return tl::make_unexpected(ok.error());
  if (expected<void> ok = tok.read_control_and_eos(f, name); !ok) return tl::make_unexpected(ok.error());
  tok.build_lookup();
  tok.check_invariants();
  return tok;
}

expected<void> spm_vocab::read_control_and_eos(const model::gguf_file& f, const std::string& name) {
  control_.assign(pieces_.size(), false);
  if (f.metadata.count("tokenizer.ggml.token_type")) {
    auto types = f.get_array("tokenizer.ggml.token_type", model::gguf_type::i32, name);
    if (!types) return tl::make_unexpected(types.error());
    if ((*types)->size() != pieces_.size())
      return fail(errc::malformed_file, name + ": " + std::to_string((*types)->size()) + " token types for " +
                                            std::to_string(pieces_.size()) + " tokens");
    for (std::int32_t id = first_normal_id; id < vocab_size(); ++id)
      control_[static_cast<std::size_t>(id)] = (*types)->integer(static_cast<std::size_t>(id)) == 3;  // control
  }
  if (!f.metadata.count("tokenizer.ggml.eos_token_id")) return {};
  auto v = f.get_int("tokenizer.ggml.eos_token_id", name);
  if (!v) return tl::make_unexpected(v.error());
  if (*v != eos && !(*v >= first_normal_id && *v < vocab_size() && control_[static_cast<std::size_t>(*v)]))
    return fail(errc::malformed_file, name + ": tokenizer.ggml.eos_token_id = " + std::to_string(*v) +
                                          "; troupe's llama vocabulary needs 2 or a control token (type 3) after the "
                                          "byte tokens");
  eos_id_ = static_cast<std::int32_t>(*v);
  return {};
}

expected<void> spm_vocab::check_byte_tokens(std::string_view source_name) const {
  for (int byte = 0; byte < 256; ++byte) {
    const std::int32_t id = first_byte_id + byte;
    const std::string expected_piece = byte_token_spelling(byte);
    if (pieces_[id] != expected_piece) {
      return fail(errc::malformed_file, std::string(source_name) + ": token " +
                                            std::to_string(id) + " must be the byte token " +
                                            expected_piece + ", found '" +
                                            escaped(pieces_[id]) + "'");
    }
  }
  return {};
}

void spm_vocab::build_lookup() {
  sorted_normal_ids_.clear();
  control_.resize(pieces_.size(), false);  // llama2.c files: none after the byte tokens
  for (std::int32_t id = first_normal_id; id < vocab_size(); ++id) {
    if (!is_control(id)) sorted_normal_ids_.push_back(id);
  }
  // Stable by id, so among repeated pieces the lowest id comes first and survives `unique`.
  std::stable_sort(sorted_normal_ids_.begin(), sorted_normal_ids_.end(),
                   [this](std::int32_t a, std::int32_t b) { return pieces_[a] < pieces_[b]; });
  const auto last = std::unique(
      sorted_normal_ids_.begin(), sorted_normal_ids_.end(),
      [this](std::int32_t a, std::int32_t b) { return pieces_[a] == pieces_[b]; });
  sorted_normal_ids_.erase(last, sorted_normal_ids_.end());
}

std::optional<std::int32_t> spm_vocab::find_piece(std::string_view text) const {
  const auto it = std::lower_bound(
      sorted_normal_ids_.begin(), sorted_normal_ids_.end(), text,
      [this](std::int32_t id, std::string_view key) { return pieces_[id] < key; });
  if (it == sorted_normal_ids_.end() || pieces_[*it] != text) return std::nullopt;
  return *it;
}

std::vector<std::int32_t> spm_vocab::encode(std::string_view text) const {
  std::vector<std::int32_t> ids = split_characters(*this, text);
  merge_by_score(*this, ids);
  return ids;
}

std::string_view spm_vocab::piece(std::int32_t prev_token, std::int32_t token) const {
  TROUPE_ASSERT_MSG(is_valid_id(token), "piece(): token id outside [0, vocab_size)");
  if (is_control(token)) return {};
  if (is_byte(token)) return {&byte_chars[static_cast<std::size_t>(token - first_byte_id)], 1};
  std::string_view text = pieces_[token];
  // SentencePiece's decoder drops the dummy-prefix space after BOS (llama2.c PR #89).
  if (prev_token == bos && text.front() == ' ') text.remove_prefix(1);
  return text;
}

std::string_view spm_vocab::piece_text(std::int32_t id) const {
  TROUPE_ASSERT_MSG(is_valid_id(id), "piece_text(): token id outside [0, vocab_size)");
  return pieces_[id];
}

float spm_vocab::score(std::int32_t id) const {
  TROUPE_ASSERT_MSG(is_valid_id(id), "score(): token id outside [0, vocab_size)");
  return scores_[id];
}

void spm_vocab::check_invariants() const {
  TROUPE_ASSERT(pieces_.size() == scores_.size());
  TROUPE_ASSERT(vocab_size() >= first_normal_id);
  TROUPE_ASSERT(max_token_length_ > 0);
  for (const std::string& text : pieces_) {
    TROUPE_ASSERT(!text.empty());
    TROUPE_ASSERT(text.size() <= static_cast<std::size_t>(max_token_length_));
  }
  TROUPE_ASSERT(check_byte_tokens("check_invariants").has_value());
  for (std::size_t i = 0; i < sorted_normal_ids_.size(); ++i) {
    TROUPE_ASSERT(sorted_normal_ids_[i] >= first_normal_id);
    TROUPE_ASSERT(i == 0 || pieces_[sorted_normal_ids_[i - 1]] < pieces_[sorted_normal_ids_[i]]);
  }
  TROUPE_ASSERT(control_.size() == pieces_.size());
  TROUPE_ASSERT(eos_id_ == eos || is_control(eos_id_));
  for (std::int32_t id = first_normal_id; id < vocab_size(); ++id) {
    if (is_control(id)) continue;
    const std::optional<std::int32_t> found = find_piece(pieces_[id]);
    TROUPE_ASSERT(found.has_value());
    TROUPE_ASSERT(*found <= id);
    TROUPE_ASSERT(pieces_[*found] == pieces_[id]);
  }
}

}  // namespace troupe
