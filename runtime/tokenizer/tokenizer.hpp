#pragma once

/// The BPE tokenizer of llama2.c's `tokenizer.bin` format (e.g. stories260K's `tok512.bin`).
///
/// Encoding and decoding reproduce karpathy/llama2.c `run.c` (commit 350e04fe) exactly for every
/// input that does not try to forge a special token, with these deliberate differences:
///
/// - User text never becomes a control token (`<unk>`, BOS, EOS) or a byte token (`<0xXX>`):
///   those ids are absent from the piece lookup, so text such as `<s>` or `<0x41>` encodes as
///   ordinary pieces even if a merge would spell the control piece (llama2.c would merge it).
///   BOS is also never a merge partner. With `tok512.bin` no real text is affected.
/// - Invalid UTF-8 text is rejected (llama2.c splits it arbitrarily); NUL bytes are ordinary
///   characters (llama2.c stops at the first NUL).
/// - When pieces repeat, the lowest id wins (llama2.c's bsearch picks an arbitrary one).
/// - `decode()` returns valid UTF-8: each maximal ill-formed subpart becomes U+FFFD (see
///   utf8.hpp). llama2.c's `safe_printf` instead drops single non-printable bytes and prints
///   other invalid bytes raw. Control tokens decode to "" (llama2.c prints their pieces).
///
/// File format (little-endian): int32 max_token_length, then per token: float32 score, int32
/// length, `length` bytes. Ids 0, 1, 2 are `<unk>`, BOS, EOS; ids 3..258 are the byte tokens
/// `<0x00>`..`<0xFF>`, the fallback for characters without a piece of their own.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe {

/// An immutable llama2.c BPE vocabulary with encode and decode.
class tokenizer {
 public:
  static constexpr std::int32_t unk_id = 0;
  static constexpr std::int32_t bos = 1;
  static constexpr std::int32_t eos = 2;
  static constexpr std::int32_t first_byte_id = 3;       ///< id of `<0x00>`
  static constexpr std::int32_t first_normal_id = 259;  ///< first id after the byte tokens
  static constexpr std::int32_t no_token = -1;           ///< "no previous token" for `piece()`
  /// How SentencePiece (and so a GGUF llama vocabulary) spells a space in pieces: U+2581 "▁";
  /// llama2.c's tokenizer files, and this class, spell it ' '.
  static constexpr std::string_view sentencepiece_space = "\xe2\x96\x81";

  /// Reads a tokenizer file holding exactly `vocab_size` tokens.
  ///
  /// Errors: `errc::io_error` if the file cannot be read; `errc::malformed_file` if it is
  /// truncated, holds more tokens than `vocab_size`, has a non-positive max_token_length, a
  /// length that is not in [1, max_token_length] or byte tokens not spelled `<0xXX>` in order;
  /// `errc::invalid_argument` if `vocab_size` < 259. Messages name the file.
  [[nodiscard]] static expected<tokenizer> load(const std::string& path,
                                                std::int32_t vocab_size);

  /// Parses tokenizer file contents already in memory; `source_name` names them in errors. A
  /// GGUF file (its "GGUF" magic) is read for its `tokenizer.ggml.*` metadata: a llama
  /// (SentencePiece-style) vocabulary of exactly `vocab_size` tokens with scores, control ids
  /// unk 0, bos 1, eos 2 and the 256 byte tokens at 3..258 (U+2581 in pieces reads as a space).
  [[nodiscard]] static expected<tokenizer> from_bytes(std::string_view bytes,
                                                      std::int32_t vocab_size,
                                                      std::string_view source_name);

  /// Encodes UTF-8 `text` the way llama2.c's `encode()` does, optionally adding BOS / EOS.
  ///
  /// Non-empty text gets the dummy-prefix piece " " first; each character maps to its piece or,
  /// failing that, to one byte token per byte; then the adjacent pair whose concatenation is the
  /// highest-scoring piece merges, leftmost on ties, until no pair merges. Fails with
  /// `errc::invalid_utf8` (message gives the byte offset) if `text` is not well-formed UTF-8.
  [[nodiscard]] expected<std::vector<std::int32_t>> encode(std::string_view text, bool add_bos,
                                                           bool add_eos) const;

  /// The raw bytes `token` prints as after `prev_token`, as llama2.c's `decode()`.
  ///
  /// After BOS a leading space is stripped; a byte token yields its one raw byte (possibly part
  /// of a UTF-8 character); control tokens yield "". The result may be invalid UTF-8 on its own.
  /// `token` must satisfy `is_valid_id`; `prev_token` may be `no_token`.
  [[nodiscard]] std::string_view piece(std::int32_t prev_token, std::int32_t token) const;

  /// Decodes a whole sequence (it may start with BOS) into valid UTF-8.
  ///
  /// Returns the concatenated `piece(previous id, id)` bytes (the first id has no previous
  /// token) with each maximal ill-formed UTF-8 subpart replaced by U+FFFD. All ids must satisfy
  /// `is_valid_id` (see `check_ids`).
  [[nodiscard]] std::string decode(const std::vector<std::int32_t>& ids) const;

  /// Fails with `errc::invalid_argument`, naming the first offending position, unless every id
  /// is in [0, vocab_size).
  [[nodiscard]] expected<void> check_ids(const std::vector<std::int32_t>& ids) const;

  /// The id of the ordinary piece spelled `text`; never a control or byte token.
  [[nodiscard]] std::optional<std::int32_t> find_piece(std::string_view text) const;

  /// The piece of `id` exactly as stored in the file (byte tokens read `<0xXX>`).
  [[nodiscard]] std::string_view piece_text(std::int32_t id) const;

  /// The merge score of `id`'s piece.
  [[nodiscard]] float score(std::int32_t id) const;

  [[nodiscard]] std::int32_t vocab_size() const {
    return static_cast<std::int32_t>(pieces_.size());
  }
  [[nodiscard]] std::int32_t bos_id() const { return bos; }
  [[nodiscard]] std::int32_t eos_id() const { return eos; }
  [[nodiscard]] std::int32_t max_token_length() const { return max_token_length_; }

  /// The most bytes of text that can encode into `num_tokens` tokens or fewer: every token
  /// spells at most max_token_length bytes. Longer text needs more tokens, so a caller can refuse
  /// it without encoding it (encoding costs memory in proportion to the text).
  [[nodiscard]] std::int64_t max_text_bytes(std::int32_t num_tokens) const {
    return static_cast<std::int64_t>(num_tokens) * max_token_length_;
  }

  [[nodiscard]] bool is_valid_id(std::int32_t id) const { return id >= 0 && id < vocab_size(); }
  [[nodiscard]] static bool is_control(std::int32_t id) { return id >= 0 && id < first_byte_id; }
  [[nodiscard]] static bool is_byte(std::int32_t id) {
    return id >= first_byte_id && id < first_normal_id;
  }

  /// Aborts unless the vocabulary and its sorted lookup agree.
  void check_invariants() const;

 private:
  tokenizer() = default;

  [[nodiscard]] expected<void> check_byte_tokens(std::string_view source_name) const;
  void build_lookup();
  [[nodiscard]] static expected<tokenizer> from_gguf(std::string_view bytes, std::int32_t vocab_size,
                                                     const std::string& name);

  std::vector<std::string> pieces_;            // (vocab_size) raw piece bytes
  std::vector<float> scores_;                  // (vocab_size)
  std::vector<std::int32_t> sorted_normal_ids_;  // ids >= 259 by (piece, id), one per piece
  std::int32_t max_token_length_ = 0;
};

}  // namespace troupe
