#pragma once

/// Appending little-endian values to a byte string (the files troupe writes: GGUF), the
/// counterpart of byte_reader.hpp.

#include <cstddef>
#include <string>

namespace troupe {

inline void put_bytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }

/// Appends `v`'s bytes as they lie in memory (little-endian on every platform troupe builds for).
template <class T>
void put(std::string& out, T v) {
  put_bytes(out, &v, sizeof v);
}

}  // namespace troupe
