#pragma once

/// The simulator's event log: one line per event (virtual time first), hashed as written, kept
/// in memory only on request. Same seed + config + trace => same log => same SHA-256.

#include <cstdio>
#include <string>

#include "sim/sha256.hpp"

namespace troupe::sim {

class event_log {
 public:
  /// `file` (may be null) also receives every line.
  explicit event_log(std::FILE* file = nullptr) : file_(file) {}

  void write(const std::string& line) {
    hash_.update(line);
    hash_.update("\n");
    num_lines_++;
    if (file_) std::fprintf(file_, "%s\n", line.c_str());
  }

  [[nodiscard]] int64_t num_lines() const { return num_lines_; }
  /// The SHA-256 of everything written; call once, at the end.
  [[nodiscard]] std::string digest() { return hash_.hex_digest(); }

 private:
  std::FILE* file_;
  sha256 hash_;
  int64_t num_lines_ = 0;
};

}  // namespace troupe::sim
