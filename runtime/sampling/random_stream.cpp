#include "runtime/sampling/random_stream.hpp"

#include <limits>

#include "runtime/common/error.hpp"
#include "runtime/sampling/philox.hpp"

namespace troupe::sampling {

std::array<uint32_t, 2> stream_key(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}

std::array<uint32_t, 4> stream_counter(int64_t position, int k, uint32_t draw_index) {
  TROUPE_ASSERT(position >= 0);
  TROUPE_ASSERT(position <= stream_position_max);
  TROUPE_ASSERT(k >= 0 && k < num_stream_kinds);
  const auto word = static_cast<uint64_t>(position * num_stream_kinds + k);
  return {static_cast<uint32_t>(word), static_cast<uint32_t>(word >> 32), draw_index, 0};
}

random_stream::random_stream(uint64_t seed, int64_t position, int k)
    : key_(stream_key(seed)), position_(position), k_(k) {
  TROUPE_ASSERT(position >= 0);
  TROUPE_ASSERT_MSG(position <= stream_position_max, "position * 3 + k would overflow");
  TROUPE_ASSERT_MSG(k >= 0 && k < num_stream_kinds, "k must be 0, 1 or 2");
}

std::array<uint32_t, 4> random_stream::next_block() {
  TROUPE_ASSERT_MSG(draw_index_ < std::numeric_limits<uint32_t>::max(),
                    "random stream exhausted (2^32 - 1 draws)");
  const auto counter = stream_counter(position_, k_, draw_index_);
  ++draw_index_;
  return philox4x32_10(counter, key_);
}

uint32_t random_stream::next_u32() { return next_block()[0]; }

uint64_t random_stream::next_u64() {
  const auto block = next_block();
  return (uint64_t{block[1]} << 32) | block[0];
}

float random_stream::next_float() {
  constexpr float two_pow_minus_24 = 1.0f / 16777216.0f;
  return static_cast<float>(next_u32() >> 8) * two_pow_minus_24;
}

uint64_t random_stream::uniform_below(uint64_t bound) {
  TROUPE_ASSERT_MSG(bound > 0, "uniform_below needs a positive bound");
  // 2^64 mod bound, computed in 64 bits as (2^64 - bound) mod bound.
  const uint64_t threshold = (~bound + 1) % bound;
  for (;;) {
    const uint64_t x = next_u64();
    if (x >= threshold) return x % bound;
  }
}

}  // namespace troupe::sampling
