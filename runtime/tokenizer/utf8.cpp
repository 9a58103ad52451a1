#include "runtime/tokenizer/utf8.hpp"

#include <cstdio>

namespace troupe::utf8 {
namespace {

/// What a lead byte announces: the sequence length (0: not a lead byte) and the range allowed
/// for the second byte, narrowed to exclude overlongs, surrogates and values above U+10FFFF.
struct lead_info {
  std::uint8_t length = 0;
  std::uint8_t lower = 0x80;
  std::uint8_t upper = 0xBF;
};

lead_info classify_lead(unsigned char lead) {
  if (lead < 0x80) return {1, 0x80, 0xBF};
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};  // below 0xA0 would be overlong
  if (lead == 0xED) return {3, 0x80, 0x9F};  // above 0x9F would be a surrogate
  if (lead >= 0xE1 && lead <= 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};  // below 0x90 would be overlong
  if (lead == 0xF4) return {4, 0x80, 0x8F};  // above 0x8F would exceed U+10FFFF
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  return {};
}

bool is_continuation(unsigned char byte) { return byte >= 0x80 && byte <= 0xBF; }

std::string hex(unsigned char byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "0x%02X", static_cast<unsigned>(byte));
  return buffer;
}

tl::unexpected<error> invalid_at(std::size_t offset, const std::string& what) {
  return fail(errc::invalid_utf8,
              "invalid UTF-8 at byte offset " + std::to_string(offset) + ": " + what);
}

std::string describe_bad_lead(unsigned char lead) {
  if (is_continuation(lead)) return "unexpected continuation byte " + hex(lead);
  if (lead == 0xC0 || lead == 0xC1) return "overlong encoding (lead byte " + hex(lead) + ")";
  if (lead >= 0xF5 && lead <= 0xF7) {
    return "code point above U+10FFFF (lead byte " + hex(lead) + ")";
  }
  return "byte " + hex(lead) + " never appears in UTF-8";
}

/// Why `byte`, the `index`-th byte (from 1) of the sequence led by `lead`, is rejected.
std::string describe_bad_continuation(unsigned char lead, std::size_t index, unsigned char byte) {
  const std::string pair = " (" + hex(lead) + " " + hex(byte) + ")";
  if (index == 1 && is_continuation(byte)) {
    if (lead == 0xE0 || lead == 0xF0) return "overlong encoding" + pair;
    if (lead == 0xED) return "encoded surrogate (U+D800..U+DFFF)" + pair;
    if (lead == 0xF4) return "code point above U+10FFFF" + pair;
  }
  return "truncated sequence: byte " + std::to_string(index) + " after lead byte " + hex(lead) +
         " is " + hex(byte) + ", not a continuation byte";
}

}  // namespace

expected<void> validate(std::string_view text) {
  std::size_t offset = 0;
  while (offset < text.size()) {
    const auto lead = static_cast<unsigned char>(text[offset]);
    const lead_info info = classify_lead(lead);
    if (info.length == 0) return invalid_at(offset, describe_bad_lead(lead));
    for (std::size_t index = 1; index < info.length; ++index) {
      if (offset + index >= text.size()) {
        return invalid_at(offset, "truncated sequence: lead byte " + hex(lead) + " needs " +
                                      std::to_string(info.length) + " bytes, input ends after " +
                                      std::to_string(index));
      }
      const auto byte = static_cast<unsigned char>(text[offset + index]);
      const unsigned char lower = index == 1 ? info.lower : 0x80;
      const unsigned char upper = index == 1 ? info.upper : 0xBF;
      if (byte < lower || byte > upper) {
        return invalid_at(offset, describe_bad_continuation(lead, index, byte));
      }
    }
    offset += info.length;
  }
  return {};
}

std::u32string decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (std::size_t offset = 0; offset < text.size();) {
    const auto lead = static_cast<unsigned char>(text[offset]);
    const std::size_t length = sequence_length(lead);
    TROUPE_ASSERT_MSG(offset + length <= text.size(), "decode() needs well-formed UTF-8");
    // The lead byte keeps 7, 5, 4 or 3 payload bits; each continuation byte 6.
    char32_t cp = length == 1 ? lead : lead & (0x7F >> length);
    for (std::size_t i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[offset + i]) & 0x3F);
    out.push_back(cp);
    offset += length;
  }
  return out;
}

std::size_t encoded_length(char32_t cp) {
  if (cp < 0x80) return 1;
  if (cp < 0x800) return 2;
  if (cp < 0x10000) return 3;
  return 4;
}

std::size_t sequence_length(unsigned char lead) {
  const lead_info info = classify_lead(lead);
  TROUPE_ASSERT_MSG(info.length != 0, "sequence_length() needs the lead byte of valid UTF-8");
  return info.length;
}

void sanitizer::push(std::string_view bytes, std::string& out) {
  for (const char byte : bytes) push_byte(static_cast<unsigned char>(byte), out);
}

void sanitizer::finish(std::string& out) {
  if (sequence_length_ != 0) out += replacement_character;
  reset();
}

void sanitizer::push_byte(unsigned char byte, std::string& out) {
  if (sequence_length_ == 0) {
    start_sequence(byte, out);
    return;
  }
  if (byte < lower_ || byte > upper_) {
    // The held bytes are a maximal subpart: replace them, then `byte` starts afresh.
    out += replacement_character;
    reset();
    start_sequence(byte, out);
    return;
  }
  pending_[num_pending_++] = static_cast<char>(byte);
  lower_ = 0x80;
  upper_ = 0xBF;
  if (num_pending_ == sequence_length_) {
    out.append(pending_.data(), num_pending_);
    reset();
  }
}

void sanitizer::start_sequence(unsigned char lead, std::string& out) {
  TROUPE_ASSERT(sequence_length_ == 0);
  TROUPE_ASSERT(num_pending_ == 0);
  const lead_info info = classify_lead(lead);
  if (info.length == 0) {
    out += replacement_character;
  } else if (info.length == 1) {
    out += static_cast<char>(lead);
  } else {
    pending_[0] = static_cast<char>(lead);
    num_pending_ = 1;
    sequence_length_ = info.length;
    lower_ = info.lower;
    upper_ = info.upper;
  }
}

void sanitizer::reset() {
  num_pending_ = 0;
  sequence_length_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
}

void sanitizer::check_invariants() const {
  if (sequence_length_ == 0) {
    TROUPE_ASSERT(num_pending_ == 0);
    TROUPE_ASSERT(lower_ == 0x80 && upper_ == 0xBF);
    return;
  }
  TROUPE_ASSERT(num_pending_ >= 1);
  TROUPE_ASSERT(num_pending_ < sequence_length_);
  const lead_info info = classify_lead(static_cast<unsigned char>(pending_[0]));
  TROUPE_ASSERT(info.length == sequence_length_);
  TROUPE_ASSERT(num_pending_ > 1 || (lower_ == info.lower && upper_ == info.upper));
  TROUPE_ASSERT(num_pending_ == 1 || (lower_ == 0x80 && upper_ == 0xBF));
  const std::string_view held(pending_.data(), num_pending_);
  const expected<void> held_valid = validate(held);
  TROUPE_ASSERT(!held_valid);  // held bytes never form a complete character
  TROUPE_ASSERT(held_valid.error().message.find("input ends") != std::string::npos);
}

std::string sanitize(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  sanitizer repair;
  repair.push(bytes, out);
  repair.finish(out);
  return out;
}

void append(std::string& out, uint32_t cp) {
  TROUPE_ASSERT(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF));
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace troupe::utf8
