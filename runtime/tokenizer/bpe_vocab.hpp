#pragma once

/// A byte-level BPE vocabulary (GPT-2's scheme; a GGUF with `tokenizer.ggml.model` = "gpt2"),
/// encoding as llama.cpp's BPE tokenizer does with add_special = false, parse_special = false.
///
/// Token texts spell bytes through GPT-2's byte-to-unicode mapping: the printable bytes
/// `!`..`~`, `¡`..`¬`, `®`..`ÿ` stand for themselves, the other 68 bytes for U+0100.. in byte
/// order (so a space is `Ġ`, U+0120). `tokenizer.ggml.merges` lists merge rules "A B", best
/// first; the index is the rank.
///
/// Encoding: (1) user-defined tokens (`token_type` 4) that are text — one character, or only
/// whitespace (deepseek-coder's `ü`, a run of spaces) — are cut out of the text first, longest
/// first (equal lengths: lowest id first), at every leftmost occurrence, and become their ids;
/// (2) the pre-tokenizer named by `tokenizer.ggml.pre` splits the rest into words
/// (pre_tokenizer.hpp); (3) each word starts as one symbol per byte and the adjacent pair with
/// the best-ranked rule merges, leftmost on ties, until none does. Control and unknown tokens
/// never come from text, nor do the other user-defined tokens, *tags* (`<think>`,
/// `<tool_call>`, `[TOOL_CALLS]`): only a chat template's own text names them (segments.hpp).
/// llama.cpp cuts tags out of any text; troupe does not, so a request cannot forge them
/// (contract 4; a tag typed by a user is encoded as its characters). Unlike llama.cpp, a byte whose character is not in the vocabulary (in
/// starcoder's: 0xC0, 0xC1, 0xF1, 0xF5..0xFF) is an error rather than silently dropped.
///
/// Decoding: a normal token yields its bytes (the inverse mapping), a user-defined one its text
/// as stored, control, unknown and unused tokens nothing.
///
/// Loading checks what encoding relies on: every merge "A B" names two tokens and A+B is a
/// token; every normal token's text is made of byte characters; token ids named in metadata lie
/// in the vocabulary.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/common/gguf.hpp"
#include "runtime/common/string_table.hpp"
#include "runtime/tokenizer/pre_tokenizer.hpp"

namespace troupe {

class bpe_vocab {
 public:
  /// GGUF token types (the numbers are llama.cpp's).
  enum class token_type : std::int32_t { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4,
                                         unused = 5, byte = 6 };

  /// Reads the `tokenizer.ggml.*` metadata of `f` (`tokenizer.ggml.model` must be "gpt2"),
  /// holding exactly `vocab_size` tokens. Errors: `errc::malformed_file` naming `source` and
  /// the key, token or merge at fault.
  [[nodiscard]] static expected<bpe_vocab> from_gguf(const model::gguf_file& f, std::int32_t vocab_size,
                                                     const std::string& source);

  /// Encodes well-formed UTF-8 `text` (the caller validates it). Errors: `errc::invalid_argument`
  /// when a byte has no token (see above), naming its offset.
  [[nodiscard]] expected<std::vector<std::int32_t>> encode(std::string_view text) const;

  /// The bytes `id` decodes to (see above).
  [[nodiscard]] std::string_view piece(std::int32_t id) const { return pieces_[static_cast<std::size_t>(id)]; }
  /// The token's text as stored in the file.
  [[nodiscard]] std::string_view text(std::int32_t id) const { return texts_[static_cast<std::size_t>(id)]; }
  [[nodiscard]] token_type type(std::int32_t id) const { return types_[static_cast<std::size_t>(id)]; }
  /// Whether `id` is a tag: a user-defined token whose text is more than one character and not
  /// only whitespace. Tags never come from `encode`.
  [[nodiscard]] bool is_tag(std::int32_t id) const;
  /// The normal token that decodes to `bytes`.
  [[nodiscard]] std::optional<std::int32_t> find_piece(std::string_view bytes) const;

  [[nodiscard]] std::int32_t vocab_size() const { return static_cast<std::int32_t>(texts_.size()); }
  [[nodiscard]] std::int32_t bos_id() const { return bos_id_; }
  [[nodiscard]] std::int32_t eos_id() const { return eos_id_; }
  /// `tokenizer.ggml.add_bos_token` (false when absent, as llama.cpp for these vocabularies).
  [[nodiscard]] bool adds_bos() const { return adds_bos_; }
  [[nodiscard]] pre_tokenizer pre() const { return pre_; }
  [[nodiscard]] std::int32_t num_merges() const { return static_cast<std::int32_t>(merge_rules_.size()); }
  /// The most bytes one token decodes to.
  [[nodiscard]] std::int32_t max_piece_bytes() const { return max_piece_bytes_; }

  /// Aborts unless pieces, lookups and merges agree.
  void check_invariants() const;

 private:
  struct merge_rule {  // of a left token (merge_starts_)
    std::int32_t right = 0;
    std::int32_t rank = 0;
    std::int32_t merged_id = 0;
  };
  /// The rule merging `left` with `right`, or nullptr.
  [[nodiscard]] const merge_rule* find_merge(std::int32_t left, std::int32_t right) const;

  /// Whether a user-defined token spelled `text` is a tag (see is_tag).
  [[nodiscard]] static bool is_tag_text(std::string_view text);
  [[nodiscard]] expected<void> read_tokens(const model::gguf_file& f, std::int32_t vocab_size, const std::string& source);
  [[nodiscard]] expected<void> read_merges(const model::gguf_file& f, const std::string& source);
  [[nodiscard]] expected<void> read_special_ids(const model::gguf_file& f, const std::string& source);
  [[nodiscard]] expected<void> encode_word(std::string_view word, std::size_t offset, std::vector<std::int32_t>& out) const;

  string_table texts_;             // (vocab_size) as in the file, indexed by content
  string_table pieces_;            // (vocab_size) decoded bytes
  std::vector<token_type> types_;  // (vocab_size)
  std::vector<std::int32_t> merge_starts_;  // (vocab_size + 1): left token t's rules are
  std::vector<merge_rule> merge_rules_;     // [merge_starts_[t], merge_starts_[t + 1]), by right token
  std::array<std::int32_t, 256> byte_ids_{};                   // the token of each byte's character, or -1
  std::vector<std::int32_t> user_defined_ids_;                 // the non-tags: longest text first, then lowest id
  std::int32_t bos_id_ = -1;
  std::int32_t eos_id_ = -1;
  bool adds_bos_ = false;
  pre_tokenizer pre_ = pre_tokenizer::gpt2;
  bool ignore_merges_ = false;  // ignores_merges(tokenizer.ggml.pre)
  std::int32_t max_piece_bytes_ = 0;
};

}  // namespace troupe
