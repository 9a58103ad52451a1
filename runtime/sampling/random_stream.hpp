#pragma once

/// One reproducible random stream per (request seed, position, use). The stream's n-th draw is
/// philox4x32_10(counter, key) with
///   key     = {lo32(seed), hi32(seed)}
///   counter = {lo32(position * 3 + k), hi32(position * 3 + k), n, 0}
/// so a draw depends only on its own coordinates: never on batch order, batch-mates, thread count
/// or device. Every draw (u32, u64, float, or one attempt of `uniform_below`) uses a fresh Philox
/// block; the unused words are discarded so that "the n-th draw" means the same thing for every
/// kind of draw, and a GPU kernel can reproduce any draw with one Philox call.

#include <array>
#include <cstdint>

namespace troupe::sampling {

/// The use `k` of randomness at one position (docs/DESIGN.md, `sampling/`).
inline constexpr int stream_sample = 0;       ///< an ordinary sample
// k = 1 and 2 are reserved for speculative decoding (planned, issue 17): nothing draws them yet.
inline constexpr int stream_resample = 1;     ///< resample after a rejected speculative draft
inline constexpr int stream_accept_coin = 2;  ///< accept/reject coin of a speculative draft
inline constexpr int num_stream_kinds = 3;

/// Largest position whose counter word position * 3 + k does not overflow int64.
inline constexpr int64_t stream_position_max = (INT64_MAX - (num_stream_kinds - 1)) / 3;

/// The Philox key of a request: the two 32-bit halves of its seed, low half first.
[[nodiscard]] std::array<uint32_t, 2> stream_key(uint64_t seed);

/// The Philox counter of draw `draw_index` of stream (position, k); see the file comment.
[[nodiscard]] std::array<uint32_t, 4> stream_counter(int64_t position, int k,
                                                     uint32_t draw_index);

/// A sequence of uniform draws keyed by (seed, position, k); cheap to construct, no allocation.
class random_stream {
 public:
  /// Opens stream `k` (0..2, see `stream_*`) of request `seed` at sequence `position` (>= 0).
  random_stream(uint64_t seed, int64_t position, int k);

  /// The next raw Philox block (four uniform 32-bit words); every other draw is built on it.
  [[nodiscard]] std::array<uint32_t, 4> next_block();

  /// A uniform 32-bit word: word 0 of the next block.
  [[nodiscard]] uint32_t next_u32();

  /// A uniform 64-bit word: words 0 (low) and 1 (high) of the next block.
  [[nodiscard]] uint64_t next_u64();

  /// A uniform float in [0, 1) on the 2^-24 grid: the top 24 bits of `next_u32()` times 2^-24.
  [[nodiscard]] float next_float();

  /// A uniform integer in [0, bound), bound > 0, without modulo bias.
  /// Threshold rejection: a 64-bit draw below 2^64 mod bound falls in the incomplete last copy
  /// of [0, bound) and is redrawn from the next block (the counter's third word + 1); the kept
  /// draws cover whole copies, so `x % bound` is exactly uniform. At most half of all draws are
  /// rejected for any bound, so the expected number of blocks is below 2.
  [[nodiscard]] uint64_t uniform_below(uint64_t bound);

  /// How many blocks this stream has used; also the third counter word of the next draw.
  [[nodiscard]] uint32_t num_draws() const { return draw_index_; }

 private:
  std::array<uint32_t, 2> key_;
  int64_t position_;
  int k_;
  uint32_t draw_index_ = 0;
};

}  // namespace troupe::sampling
