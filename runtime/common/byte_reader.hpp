#pragma once

/// Bounds-checked little-endian reads from bytes in memory (file formats: llama2.c tokenizers,
/// GGUF). Every read says whether the bytes were there; nothing reads past the end.

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace troupe {

class byte_reader {
 public:
  explicit byte_reader(std::string_view bytes) : bytes_(bytes) {}

  template <class T>
  [[nodiscard]] bool read(T& value) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }

  /// The next `count` bytes, as a view into the bytes read.
  [[nodiscard]] bool read_view(std::size_t count, std::string_view& out) {
    if (remaining() < count) return false;
    out = bytes_.substr(offset_, count);
    offset_ += count;
    return true;
  }

  [[nodiscard]] bool read_bytes(std::size_t count, std::string& out) {
    std::string_view view;
    if (!read_view(count, view)) return false;
    out.assign(view);
    return true;
  }

  [[nodiscard]] std::size_t offset() const { return offset_; }
  [[nodiscard]] std::size_t remaining() const { return bytes_.size() - offset_; }

 private:
  std::string_view bytes_;
  std::size_t offset_ = 0;
};

}  // namespace troupe
