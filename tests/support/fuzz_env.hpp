#pragma once

// The fuzz tests' knobs from the environment: TROUPE_FUZZ_SEED and TROUPE_FUZZ_ROUNDS replay a
// run exactly (scripts/fuzz.sh sets them for long runs).

#include <cstdint>
#include <cstdlib>

namespace troupe::testing {

/// The unsigned integer in environment variable `name`, or `fallback` when it is unset or empty.
inline uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace troupe::testing
