#pragma once

// Memory read bandwidth the way a decode step needs it: summing arrays much larger than the
// caches, split among threads. Shared by bench_roofline and bench_decode_bandwidth.

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/figures.hpp"

namespace troupe::bench {

/// Runs `body(thread index)` on `threads` threads at once and returns the wall time in seconds.
template <class Body>
double timed_on_threads(int32_t threads, const Body& body) {
  std::vector<std::thread> pool;
  const double start = now_seconds();
  for (int32_t t = 0; t < threads; t++) pool.emplace_back([&body, t] { body(t); });
  for (std::thread& t : pool) t.join();
  return now_seconds() - start;
}

/// Seconds to read every element of `arrays` once on `threads` threads: each sums its share of
/// each array in 512-bit vector loads into 4 independent vector sums (so the loads, not the
/// adds' latency, set the pace; the matmul's tiles are read the same way). The sum goes to
/// `checksum`, so the reads cannot be optimized away.
inline double timed_read(const std::vector<const std::vector<double>*>& arrays, int32_t threads, double& checksum) {
  using v8d = double __attribute__((vector_size(64)));
  std::vector<double> sums(static_cast<size_t>(threads));
  const double seconds = timed_on_threads(threads, [&](int32_t t) {
    v8d s[4] = {};
    for (const std::vector<double>* v : arrays) {
      const size_t n = v->size(), begin = n * static_cast<size_t>(t) / threads / 32 * 32;
      const size_t end = n * static_cast<size_t>(t + 1) / threads / 32 * 32;
      const double* p = v->data();
      for (size_t i = begin; i < end; i += 32)
        for (size_t k = 0; k < 4; k++) {
          v8d x;
          std::memcpy(&x, p + i + 8 * k, sizeof(x));
          s[k] += x;
        }
    }
    double total = 0;
    for (const v8d& x : s)
      for (int k = 0; k < 8; k++) total += x[k];
    sums[static_cast<size_t>(t)] = total;
  });
  checksum = 0;
  for (double s : sums) checksum += s;
  return seconds;
}

}  // namespace troupe::bench
