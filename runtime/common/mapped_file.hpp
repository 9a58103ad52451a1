#pragma once

/// A file mapped read-only into memory (model checkpoints, tokenizers, GGUF files): what is read
/// is paged in, what is not costs nothing — a tokenizer taken from a multi-gigabyte GGUF model
/// touches its metadata only. A model's weights are mapped with `prefault`: read into memory
/// at open (MAP_POPULATE), so the first request does not page-fault them in one by one.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "runtime/common/error.hpp"

namespace troupe {

class mapped_file {
 public:
  /// Maps `path`. Errors (io_error) carry only the reason — the system's ("No such file or
  /// directory"), "not a regular file", or "mmap: <reason>" — for the caller to name the file.
  /// With `prefault`, the whole file is read into memory (and mapped) before open returns, in
  /// chunks of `prefault_chunk` bytes after each of which `progress(bytes read, file size)` is
  /// called (when given).
  [[nodiscard]] static expected<mapped_file> open(const std::string& path, bool prefault = false,
                                                  const std::function<void(int64_t, int64_t)>& progress = {});

  /// How much of a file prefaulting reads between two progress calls.
  static constexpr int64_t prefault_chunk = int64_t{64} << 20;

  mapped_file(mapped_file&& other) noexcept;
  mapped_file& operator=(mapped_file&& other) noexcept;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();

  [[nodiscard]] std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  /// Unmaps now (bytes() is empty afterwards).
  void reset();
  /// Gives the whole pages within [p, p + n) (inside bytes()) back to the system: what a copy
  /// elsewhere replaced. They stay mapped: read again, they are paged in again.
  void release(const void* p, int64_t n) const;
  /// Reads bytes [offset, offset + n) of the file into memory (as open's `prefault` does for
  /// all of it), calling `progress(bytes read, n)` after each prefault_chunk.
  void prefault(int64_t offset, int64_t n, const std::function<void(int64_t, int64_t)>& progress = {}) const;

 private:
  mapped_file() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace troupe
