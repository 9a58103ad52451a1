#pragma once

/// UTF-8 validation (for text coming in) and repair (for bytes going out).
///
/// Well-formed means Unicode's Table 3-7: no overlong forms, no encoded surrogates
/// (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequences.
///
/// Repair follows Unicode's "substitution of maximal subparts" (the WHATWG Encoding Standard
/// decoder, and Python's `bytes.decode("utf-8", "replace")`): each maximal subpart of an
/// ill-formed subsequence becomes one U+FFFD. A maximal subpart is the longest prefix of a
/// would-be sequence that is still valid so far, or else a single byte. Examples:
/// `80 80` -> two U+FFFD; `F0 9F 98 41` -> U+FFFD `A`; `E0 80` -> two U+FFFD (0x80 cannot follow
/// 0xE0, so neither byte starts a valid prefix of the other); `ED A0 80` -> three U+FFFD.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/common/error.hpp"

namespace troupe::utf8 {

/// U+FFFD REPLACEMENT CHARACTER, encoded.
inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";

/// Checks that `text` is well-formed UTF-8.
///
/// On failure the error is `errc::invalid_utf8` and its message names the byte offset of the
/// first byte of the offending sequence and what is wrong with it (unexpected continuation byte,
/// truncated sequence, overlong encoding, encoded surrogate, code point above U+10FFFF).
[[nodiscard]] expected<void> validate(std::string_view text);

/// Appends code point `cp` (at most U+10FFFF, not a surrogate) to `out` as UTF-8.
void append(std::string& out, uint32_t cp);

/// The code points of well-formed UTF-8 `text` (check it with `validate` first; aborts on
/// ill-formed text).
[[nodiscard]] std::u32string decode(std::string_view text);

/// The byte length of code point `cp`'s encoding (1 to 4).
[[nodiscard]] std::size_t encoded_length(char32_t cp);

/// The byte length of the sequence starting with `lead` in well-formed text (1 to 4).
[[nodiscard]] std::size_t sequence_length(unsigned char lead);

/// Incrementally turns an arbitrary byte stream into valid UTF-8, never emitting a partial
/// character.
///
/// Output does not depend on how the input is chunked: for any split of a byte string into
/// pieces, concat(push(piece)...) + finish() == sanitize(whole string). Bytes of a sequence that
/// is still valid so far are held back (at most 3) until a later byte completes or breaks it.
class sanitizer {
 public:
  /// Feeds `bytes`; appends every character they complete (or U+FFFD they cause) to `out`.
  void push(std::string_view bytes, std::string& out);

  /// Ends the stream: an incomplete held sequence becomes one U+FFFD, appended to `out`.
  void finish(std::string& out);

  /// Bytes held back because they begin a character not yet complete.
  [[nodiscard]] std::size_t num_pending_bytes() const { return num_pending_; }

  /// Aborts if the held bytes are not a valid, incomplete prefix of a UTF-8 sequence.
  void check_invariants() const;

 private:
  void push_byte(unsigned char byte, std::string& out);
  void start_sequence(unsigned char lead, std::string& out);
  void reset();

  std::array<char, 4> pending_{};  // (num_pending_) bytes of the current incomplete sequence
  std::uint8_t num_pending_ = 0;
  std::uint8_t sequence_length_ = 0;  // length the lead byte announced; 0 between sequences
  std::uint8_t lower_ = 0x80;         // the next continuation byte must be in [lower_, upper_]
  std::uint8_t upper_ = 0xBF;
};

/// Returns `bytes` with each maximal ill-formed subpart replaced by U+FFFD.
[[nodiscard]] std::string sanitize(std::string_view bytes);

}  // namespace troupe::utf8
