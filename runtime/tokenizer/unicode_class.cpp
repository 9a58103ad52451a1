#include "runtime/tokenizer/unicode_class.hpp"

#include <unicode/uchar.h>

namespace troupe::unicode {

char_class classify(char32_t cp) {
  if (cp > 0x10FFFF) return {};
  const auto c = static_cast<UChar32>(cp);
  const std::uint32_t mask = U_MASK(u_charType(c));
  char_class out;
  out.is_whitespace = u_isUWhiteSpace(c) != 0;
  out.is_letter = (mask & U_GC_L_MASK) != 0;
  out.is_number = (mask & U_GC_N_MASK) != 0;
  out.is_punctuation = (mask & U_GC_P_MASK) != 0;
  return out;
}

}  // namespace troupe::unicode
