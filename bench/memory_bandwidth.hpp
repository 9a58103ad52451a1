#pragma once

// Memory read bandwidth the way a decode step needs it: summing arrays much larger than the
// caches, split among threads. Shared by bench_roofline and bench_decode_bandwidth.

#include <cstdint>
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

/// Seconds to read every element of `arrays` once on `threads` threads (each sums its share of
/// each array into 8 independent sums, so the loads and not the adds' latency set the pace).
/// The sum goes to `checksum`, so the reads cannot be optimized away.
inline double timed_read(const std::vector<const std::vector<double>*>& arrays, int32_t threads, double& checksum) {
  std::vector<double> sums(static_cast<size_t>(threads));
  const double seconds = timed_on_threads(threads, [&](int32_t t) {
    double s[8] = {};
    for (const std::vector<double>* v : arrays) {
      const size_t n = v->size(), begin = n * static_cast<size_t>(t) / threads;
      const size_t end = n * static_cast<size_t>(t + 1) / threads;
      const double* p = v->data();
      for (size_t i = begin; i + 8 <= end; i += 8)
        for (size_t k = 0; k < 8; k++) s[k] += p[i + k];
    }
    sums[static_cast<size_t>(t)] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
  });
  checksum = 0;
  for (double s : sums) checksum += s;
  return seconds;
}

}  // namespace troupe::bench
