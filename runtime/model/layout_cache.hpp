#pragma once
/// The layout cache: the copy `checkpoint::load` makes of a GGUF file's Q8_0 and Q4_0 matrices
/// in the kernels' layout (kernels::cpu::matrix_layout::rows16), kept in a file so that a later
/// start maps it (page-cache pages: nothing to lay out, no fresh pages to zero) instead of
/// making it again, and reads none of the file's pages it replaces.
///
/// An entry is `DIR/<key>.rows16`: a 4096-byte header (magic, key, data size, checksum), then
/// the laid-out bytes. The key (XXH3-64, 16 hex digits) is of the source file's identity
/// (device, inode, size, modification time in ns) and of the layout plan (each laid-out
/// matrix's place and shape, the layout's version): a file rewritten or replaced gets another
/// key. It is not a hash of the file's contents, which would read every page the cache is there
/// to spare. An entry is used only when its size, header and checksum (XXH3-64 over 4 MiB
/// slices, on every core) hold; otherwise the layout is made again and the entry rewritten.
/// Entries are written to a temporary file renamed into place: a reader never sees half of one.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "kernels/cpu/thread_pool.hpp"
#include "runtime/common/error.hpp"
#include "runtime/common/mapped_file.hpp"

namespace troupe::model {

/// Bytes before an entry's data.
inline constexpr int64_t layout_cache_header_bytes = 4096;

struct layout_cache_entry {
  std::string path;  ///< DIR/<key>.rows16
  uint64_t key = 0;
  int64_t data_bytes = 0;
};

/// The entry for laying out `source` by `plan` (bytes that describe the layout: hashed into the
/// key) into `data_bytes`, in directory `dir`. Errors: io_error when `source` cannot be stat'ed.
[[nodiscard]] expected<layout_cache_entry> layout_cache_entry_for(const std::string& dir, const std::string& source,
                                                                  std::string_view plan, int64_t data_bytes);

/// The entry's file, mapped and read into memory (`progress(bytes, total)` as it is read), when
/// it holds exactly the entry; else an error: not_found when there is none, malformed_file
/// saying what does not hold.
[[nodiscard]] expected<mapped_file> open_layout_cache(const layout_cache_entry& e, kernels::cpu::thread_pool& pool,
                                                      const std::function<void(int64_t, int64_t)>& progress);

/// Writes `data` (e.data_bytes) as the entry's file, creating its directory. Errors: io_error
/// naming what failed (nothing is left behind).
[[nodiscard]] expected<void> write_layout_cache(const layout_cache_entry& e, const uint8_t* data,
                                                kernels::cpu::thread_pool& pool);

/// The directory a user's layout cache lives in: $XDG_CACHE_HOME/troupe, else
/// $HOME/.cache/troupe, else "" (none).
[[nodiscard]] std::string default_layout_cache_dir();

}  // namespace troupe::model
