#pragma once

/// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel random
/// numbers: as easy as 1, 2, 3" (SC'11), bit-compatible with Random123's `philox4x32_R(10, ...)`.
/// A counter-based generator is a keyed bijection: output = f(counter, key). There is no state to
/// advance, so any draw of any request can be recomputed from its coordinates alone, in any
/// order, on any device — which is what makes sampling independent of batch composition.

#include <array>
#include <cstdint>

namespace troupe::sampling {

namespace philox_detail {

inline constexpr uint32_t multiplier_0 = 0xD2511F53u;  ///< Random123 PHILOX_M4x32_0
inline constexpr uint32_t multiplier_1 = 0xCD9E8D57u;  ///< Random123 PHILOX_M4x32_1
inline constexpr uint32_t weyl_0 = 0x9E3779B9u;        ///< golden ratio, PHILOX_W32_0
inline constexpr uint32_t weyl_1 = 0xBB67AE85u;        ///< sqrt(3) - 1, PHILOX_W32_1

/// One Philox S-box round: two 32x32->64 multiplies, then a permuting xor with the round key.
[[nodiscard]] constexpr std::array<uint32_t, 4> round(std::array<uint32_t, 4> ctr,
                                                      std::array<uint32_t, 2> key) {
  const uint64_t product_0 = uint64_t{multiplier_0} * ctr[0];
  const uint64_t product_1 = uint64_t{multiplier_1} * ctr[2];
  const auto hi_0 = static_cast<uint32_t>(product_0 >> 32);
  const auto lo_0 = static_cast<uint32_t>(product_0);
  const auto hi_1 = static_cast<uint32_t>(product_1 >> 32);
  const auto lo_1 = static_cast<uint32_t>(product_1);
  return {hi_1 ^ ctr[1] ^ key[0], lo_1, hi_0 ^ ctr[3] ^ key[1], lo_0};
}

}  // namespace philox_detail

/// Philox4x32 with 10 rounds: maps (counter, key) to four uniformly distributed 32-bit words.
/// Matches Random123's known-answer vectors (tests/sampling_test.cpp, `Philox.*`).
[[nodiscard]] constexpr std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                                              std::array<uint32_t, 2> key) {
  counter = philox_detail::round(counter, key);
  for (int r = 1; r < 10; ++r) {
    key[0] += philox_detail::weyl_0;  // the key schedule is a Weyl sequence, bumped between rounds
    key[1] += philox_detail::weyl_1;
    counter = philox_detail::round(counter, key);
  }
  return counter;
}

}  // namespace troupe::sampling
