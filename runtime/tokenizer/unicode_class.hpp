#pragma once

/// The Unicode properties byte-level BPE pre-tokenizers split on, from ICU (libicu, Unicode 15
/// in Debian 12): ICU is the system's maintained copy of the Unicode Character Database, so the
/// tables follow Debian's updates instead of a snapshot committed here.
///
/// `\s` in the pre-tokenizer rules is the White_Space property (U+0009..U+000D, U+0020, U+0085,
/// U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), as in llama.cpp's
/// tables; `\p{L}`, `\p{N}`, `\p{P}` are the general categories L*, N*, P*.

#include <cstdint>

namespace troupe::unicode {

struct char_class {
  bool is_whitespace = false;
  bool is_letter = false;
  bool is_number = false;
  bool is_punctuation = false;
};

/// The properties of code point `cp` (any value; above U+10FFFF has none).
[[nodiscard]] char_class classify(char32_t cp);

}  // namespace troupe::unicode
