#include "runtime/engine/request.hpp"

namespace troupe::engine {

const char* to_string(finish_reason reason) {
  switch (reason) {
    case finish_reason::none: return "none";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::aborted: return "aborted";
    case finish_reason::cancelled: return "cancelled";
  }
  return "unknown";
}

uint64_t child_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  // splitmix64 of (seed + index * golden ratio): distinct, well-mixed seeds per sample.
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace troupe::engine
