#pragma once

/// SHA-256 (FIPS 180-4), incremental: the simulator hashes its event log as it is written, so a
/// whole run is identified by one line however long the log.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::sim {

class sha256 {
 public:
  sha256();
  void update(std::string_view bytes);
  /// The digest as 64 lowercase hex characters; the object is spent afterwards.
  [[nodiscard]] std::string hex_digest();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace troupe::sim
