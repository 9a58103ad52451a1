#pragma once

/// The tokenizer interface the engine, the serving path and the CLI take: one class over the
/// vocabularies troupe reads, each an implementation of its own:
///
/// - `spm_vocab` (spm_vocab.hpp): llama2.c's `tokenizer.bin` files and GGUF "llama"
///   (SentencePiece-style) vocabularies;
/// - `bpe_vocab` (bpe_vocab.hpp): GGUF "gpt2" byte-level BPE vocabularies with the
///   pre-tokenizers of pre_tokenizer.hpp.
///
/// Common to both: invalid UTF-8 text is refused; text never becomes a special token (BOS,
/// EOS, `<unk>`, a BPE vocabulary's control tokens and tags such as `<think>`: only a chat
/// template's own text names them, segments.hpp); `decode()` returns valid UTF-8 (each maximal
/// ill-formed subpart becomes U+FFFD, see utf8.hpp), and `piece()` gives the raw bytes of one
/// token for streaming (stream_detokenizer.hpp holds a character split across tokens).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/tokenizer/bpe_vocab.hpp"
#include "runtime/tokenizer/spm_vocab.hpp"

namespace troupe {

/// An immutable vocabulary with encode and decode.
class tokenizer {
 public:
  /// The ids of llama2.c's layout (spm_vocab): the bundled tokenizer's and every
  /// SentencePiece-style vocabulary's. A BPE vocabulary has its own: use bos_id() / eos_id().
  static constexpr std::int32_t unk_id = spm_vocab::unk_id;
  static constexpr std::int32_t bos = spm_vocab::bos;
  static constexpr std::int32_t eos = spm_vocab::eos;
  static constexpr std::int32_t first_byte_id = spm_vocab::first_byte_id;
  static constexpr std::int32_t first_normal_id = spm_vocab::first_normal_id;
  static constexpr std::string_view sentencepiece_space = spm_vocab::sentencepiece_space;
  static constexpr std::int32_t no_token = -1;  ///< "no previous token" for `piece()`

  /// Reads a tokenizer file holding exactly `vocab_size` tokens: a GGUF file (read for its
  /// `tokenizer.ggml.*` metadata only) or a llama2.c tokenizer file.
  ///
  /// Errors: `errc::io_error` if the file cannot be read; otherwise as `from_bytes`.
  [[nodiscard]] static expected<tokenizer> load(const std::string& path, std::int32_t vocab_size);

  /// Parses tokenizer file contents already in memory; `source_name` names them in errors. A
  /// GGUF file (its "GGUF" magic) is read by `tokenizer.ggml.model`: "llama" as spm_vocab,
  /// "gpt2" as bpe_vocab, anything else is `errc::malformed_file` naming it; other bytes are a
  /// llama2.c tokenizer file (spm_vocab::from_bytes). Messages start with
  /// "tokenizer file '<source_name>'".
  [[nodiscard]] static expected<tokenizer> from_bytes(std::string_view bytes, std::int32_t vocab_size,
                                                      std::string_view source_name);

  /// Encodes UTF-8 `text`, optionally adding BOS / EOS (see the implementations for the rules).
  /// Fails with `errc::invalid_utf8` (message gives the byte offset) if `text` is not well-formed
  /// UTF-8; a BPE vocabulary also fails with `errc::invalid_argument` on a byte it has no token
  /// for.
  [[nodiscard]] expected<std::vector<std::int32_t>> encode(std::string_view text, bool add_bos, bool add_eos) const;

  /// The raw bytes `token` prints as after `prev_token` (`no_token` for none); may be invalid
  /// UTF-8 on its own. `token` must satisfy `is_valid_id`.
  [[nodiscard]] std::string_view piece(std::int32_t prev_token, std::int32_t token) const;

  /// The concatenated `piece(previous id, id)` bytes (the first id has no previous token) with
  /// each maximal ill-formed UTF-8 subpart replaced by U+FFFD. All ids must satisfy `is_valid_id`.
  [[nodiscard]] std::string decode(const std::vector<std::int32_t>& ids) const;

  /// Fails with `errc::invalid_argument`, naming the first offending position, unless every id
  /// is in [0, vocab_size).
  [[nodiscard]] expected<void> check_ids(const std::vector<std::int32_t>& ids) const;

  /// The id of the ordinary (not control, byte or user-defined) token whose text is `text`.
  [[nodiscard]] std::optional<std::int32_t> find_piece(std::string_view text) const;

  /// The token's text as stored in the file (SentencePiece spaces read ' ').
  [[nodiscard]] std::string_view piece_text(std::int32_t id) const;

  /// Whether `id` is a control (or unknown) token: it decodes to "" and never comes from text.
  [[nodiscard]] bool is_control(std::int32_t id) const;
  /// Whether `id` is a special token: a control token, or a BPE vocabulary's tag (a user-defined
  /// token such as `<think>` or `<tool_call>`, bpe_vocab::is_tag). Neither comes from `encode`;
  /// a template's text names them.
  [[nodiscard]] bool is_special(std::int32_t id) const;

  [[nodiscard]] std::int32_t vocab_size() const;
  [[nodiscard]] std::int32_t bos_id() const;
  [[nodiscard]] std::int32_t eos_id() const;
  /// The ids that end generation, ascending: for llama2.c's tokenizer.bin BOS and EOS (run.c
  /// stops at both); for a GGUF vocabulary EOS (not BOS, as in llama.cpp),
  /// `tokenizer.ggml.eot_token_id` and `eom_token_id` and every token whose text
  /// is one of the end-of-generation names llama.cpp recognises (end_of_generation_names()).
  [[nodiscard]] const std::vector<std::int32_t>& end_ids() const { return end_ids_; }
  /// The token texts llama.cpp treats as end of generation whatever the metadata says
  /// (`<|eot_id|>`, `<|im_end|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`, `<|eom_id|>`, ...).
  [[nodiscard]] static const std::vector<std::string_view>& end_of_generation_names();
  /// Whether the vocabulary asks for BOS before a prompt (llama2.c: yes; a GGUF vocabulary:
  /// `tokenizer.ggml.add_bos_token`, when absent true for SentencePiece-style, false for BPE).
  [[nodiscard]] bool adds_bos() const;
  /// The most bytes one token's text spells.
  [[nodiscard]] std::int32_t max_token_length() const;

  /// The most bytes of text that can encode into `num_tokens` tokens or fewer: every token
  /// spells at most max_token_length bytes. Longer text needs more tokens, so a caller can refuse
  /// it without encoding it (encoding costs memory in proportion to the text).
  [[nodiscard]] std::int64_t max_text_bytes(std::int32_t num_tokens) const {
    return static_cast<std::int64_t>(num_tokens) * max_token_length();
  }

  [[nodiscard]] bool is_valid_id(std::int32_t id) const { return id >= 0 && id < vocab_size(); }

  /// A GGUF file's `tokenizer.chat_template` (Jinja) text; empty when there is none.
  [[nodiscard]] const std::string& chat_template_text() const { return chat_template_text_; }

  /// The SentencePiece-style implementation, or nullptr for a BPE vocabulary.
  [[nodiscard]] const spm_vocab* spm() const { return std::get_if<spm_vocab>(&vocab_); }
  /// The byte-level BPE implementation, or nullptr.
  [[nodiscard]] const bpe_vocab* bpe() const { return std::get_if<bpe_vocab>(&vocab_); }

  /// Aborts unless the implementation's invariants hold.
  void check_invariants() const;

 private:
  explicit tokenizer(std::variant<spm_vocab, bpe_vocab> vocab) : vocab_(std::move(vocab)) {}
  [[nodiscard]] static expected<tokenizer> from_gguf(std::string_view bytes, std::int32_t vocab_size,
                                                     const std::string& name);
  /// Sets end_ids_ (and a SentencePiece-style vocabulary's add_bos_token) from GGUF metadata;
  /// eot, eom and padding ids must lie in the vocabulary.
  [[nodiscard]] expected<void> read_end_ids(const model::gguf_file& f, const std::string& name);

  std::variant<spm_vocab, bpe_vocab> vocab_;
  std::vector<std::int32_t> end_ids_;
  bool spm_adds_bos_ = true;
  std::string chat_template_text_;
};

}  // namespace troupe
