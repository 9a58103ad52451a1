#include "runtime/common/error.hpp"

namespace troupe {

const char* to_string(errc code) {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::malformed_file: return "malformed_file";
    case errc::io_error: return "io_error";
    case errc::invalid_utf8: return "invalid_utf8";
    case errc::too_long: return "too_long";
    case errc::not_found: return "not_found";
    case errc::overloaded: return "overloaded";
    case errc::unavailable: return "unavailable";
    case errc::cancelled: return "cancelled";
    case errc::internal: return "internal";
  }
  return "unknown";
}

std::string echo(std::string_view text, size_t bytes_max) {
  if (text.size() <= bytes_max) return std::string(text);
  size_t end = bytes_max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) end--;  // a continuation byte
  return std::string(text.substr(0, end)) + "...";
}

void assertion_failed(const char* expr, const char* file, int line, const char* message) {
  std::fprintf(stderr, "troupe: assertion failed: %s at %s:%d %s\n", expr, file, line, message);
  std::abort();
}

}  // namespace troupe
