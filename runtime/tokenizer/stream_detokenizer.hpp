#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/tokenizer/tokenizer.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe {

/// Turns a stream of token ids into text, one token at a time, without ever emitting part of a
/// UTF-8 character.
///
/// Invariant: for any token sequence `ids`, concat(push(id)...) + finish() ==
/// `tokenizer::decode(ids)`, byte for byte. Bytes that begin a character not yet complete (a
/// character split across byte tokens) are held until a later token completes it; ill-formed
/// bytes become U+FFFD exactly as in `decode`. Unlike llama2.c's `safe_printf`, which silently
/// drops single non-printable bytes, every byte is kept (control characters included) or
/// replaced by U+FFFD, so the output is always valid UTF-8.
///
/// Holds a pointer to the tokenizer, which must outlive it.
class stream_detokenizer {
 public:
  explicit stream_detokenizer(const tokenizer& tok);

  /// Appends `token` (in [0, vocab_size)) and returns the text it completes, possibly "".
  [[nodiscard]] std::string push(std::int32_t token);

  /// Ends the stream and returns the held bytes' text: an incomplete tail becomes U+FFFD.
  ///
  /// The detokenizer may be reused afterwards; it still remembers the last token (for the
  /// leading-space rule after BOS).
  [[nodiscard]] std::string finish();

  /// Bytes of an incomplete character held back by `push`.
  [[nodiscard]] std::size_t num_pending_bytes() const { return sanitizer_.num_pending_bytes(); }

  /// The last token pushed, or `tokenizer::no_token`.
  [[nodiscard]] std::int32_t prev_token() const { return prev_token_; }

  /// Aborts unless the held bytes are a valid incomplete character and the last token is valid.
  void check_invariants() const;

 private:
  const tokenizer* tokenizer_;
  std::int32_t prev_token_ = tokenizer::no_token;
  utf8::sanitizer sanitizer_;
};

}  // namespace troupe
