#pragma once

/// The SentencePiece-style vocabulary of llama2.c's `tokenizer.bin` format (e.g. stories260K's
/// `tok512.bin`) and of a GGUF with `tokenizer.ggml.model` = "llama": one of tokenizer.hpp's
/// implementations.
///
/// Encoding and decoding reproduce karpathy/llama2.c `run.c` (commit 350e04fe) exactly for every
/// input that does not try to forge a special token, with these deliberate differences:
///
/// - User text never becomes a control token (`<unk>`, BOS, EOS) or a byte token (`<0xXX>`):
///   those ids are absent from the piece lookup, so text such as `<s>` or `<0x41>` encodes as
///   ordinary pieces even if a merge would spell the control piece (llama2.c would merge it).
///   BOS is also never a merge partner. With `tok512.bin` no real text is affected.
/// - NUL bytes are ordinary characters (llama2.c stops at the first NUL).
/// - When pieces repeat, the lowest id wins (llama2.c's bsearch picks an arbitrary one).
/// - Control tokens decode to "" (llama2.c prints their pieces).
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
#include "runtime/common/gguf.hpp"

namespace troupe {

/// An immutable llama2.c / llama SentencePiece-style vocabulary with encode and decode.
class spm_vocab {
 public:
  static constexpr std::int32_t unk_id = 0;
  static constexpr std::int32_t bos = 1;
  static constexpr std::int32_t eos = 2;
  static constexpr std::int32_t first_byte_id = 3;       ///< id of `<0x00>`
  static constexpr std::int32_t first_normal_id = 259;  ///< first id after the byte tokens
  /// How SentencePiece (and so a GGUF llama vocabulary) spells a space in pieces: U+2581 "▁";
  /// llama2.c's tokenizer files, and this class, spell it ' '.
  static constexpr std::string_view sentencepiece_space = "\xe2\x96\x81";

  /// Parses llama2.c tokenizer file contents holding exactly `vocab_size` tokens; `name` names
  /// them in errors.
  ///
  /// Errors: `errc::malformed_file` if it is truncated, holds more tokens than `vocab_size`, has
  /// a non-positive max_token_length, a length that is not in [1, max_token_length] or byte
  /// tokens not spelled `<0xXX>` in order. Messages start with `name`.
  [[nodiscard]] static expected<spm_vocab> from_bytes(std::string_view bytes, std::int32_t vocab_size,
                                                      const std::string& name);

  /// Reads a GGUF's `tokenizer.ggml.*` metadata: a llama (SentencePiece-style) vocabulary of
  /// exactly `vocab_size` tokens with scores, control ids unk 0, bos 1, eos 2 and the 256 byte
  /// tokens at 3..258 (U+2581 in pieces reads as a space). `tokenizer.ggml.token_type`, when
  /// present, marks control tokens (type 3) among the later ids too (Phi-3's `<|endoftext|>`,
  /// `<|end|>`): like ids 0..2 they decode to "" and never come from text. The EOS id may then be
  /// such a control token instead of 2 (Phi-3's is 32000).
  [[nodiscard]] static expected<spm_vocab> from_gguf(const model::gguf_file& f, std::int32_t vocab_size,
                                                     const std::string& name);

  /// Encodes well-formed UTF-8 `text` (the caller validates it) the way llama2.c's `encode()`
  /// does, without BOS / EOS.
  ///
  /// Non-empty text gets the dummy-prefix piece " " first; each character maps to its piece or,
  /// failing that, to one byte token per byte; then the adjacent pair whose concatenation is the
  /// highest-scoring piece merges, leftmost on ties, until no pair merges.
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const;

  /// The raw bytes `token` prints as after `prev_token` (-1 for none), as llama2.c's `decode()`.
  ///
  /// After BOS a leading space is stripped; a byte token yields its one raw byte (possibly part
  /// of a UTF-8 character); control tokens yield "". `token` must be in the vocabulary.
  [[nodiscard]] std::string_view piece(std::int32_t prev_token, std::int32_t token) const;

  /// The id of the ordinary piece spelled `text`; never a control or byte token.
  [[nodiscard]] std::optional<std::int32_t> find_piece(std::string_view text) const;

  /// The piece of `id` exactly as stored in the file (byte tokens read `<0xXX>`).
  [[nodiscard]] std::string_view piece_text(std::int32_t id) const;

  /// The merge score of `id`'s piece.
  [[nodiscard]] float score(std::int32_t id) const;

  [[nodiscard]] std::int32_t vocab_size() const { return static_cast<std::int32_t>(pieces_.size()); }
  [[nodiscard]] std::int32_t max_token_length() const { return max_token_length_; }

  [[nodiscard]] bool is_valid_id(std::int32_t id) const { return id >= 0 && id < vocab_size(); }
  /// Whether `id` is a control token: unk, BOS, EOS or one the GGUF file's token types mark.
  [[nodiscard]] bool is_control(std::int32_t id) const {
    return (id >= 0 && id < first_byte_id) || (id >= first_normal_id && id < vocab_size() && control_[id]);
  }
  /// The end-of-sequence id: 2, or a GGUF file's control token (from_gguf).
  [[nodiscard]] std::int32_t eos_id() const { return eos_id_; }
  [[nodiscard]] static bool is_byte(std::int32_t id) { return id >= first_byte_id && id < first_normal_id; }

  /// Aborts unless the vocabulary and its sorted lookup agree.
  void check_invariants() const;

 private:
  spm_vocab() = default;

  [[nodiscard]] expected<void> check_byte_tokens(std::string_view source_name) const;
  /// Sets control_ from `tokenizer.ggml.token_type` and eos_id_ from `tokenizer.ggml.eos_token_id`.
  [[nodiscard]] expected<void> read_control_and_eos(const model::gguf_file& f, const std::string& name);
  void build_lookup();

  std::vector<std::string> pieces_;              // (vocab_size) raw piece bytes
  std::vector<float> scores_;                    // (vocab_size)
  std::vector<std::int32_t> sorted_normal_ids_;  // ids >= 259 by (piece, id), one per piece, no control
  std::vector<bool> control_;                    // (vocab_size) control tokens at ids >= 259
  std::int32_t eos_id_ = eos;
  std::int32_t max_token_length_ = 0;
};

}  // namespace troupe
