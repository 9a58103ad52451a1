#pragma once

/// A fixed set of worker threads for splitting one kernel call's independent outputs (matmul
/// output tiles, attention rows). Splitting never changes a result's bits: every output element
/// is computed whole by one thread, in the same order as on one thread.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels::cpu {

class thread_pool {
 public:
  /// `num_threads` >= 1 workers in total; the calling thread is one of them.
  explicit thread_pool(int32_t num_threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  [[nodiscard]] int32_t num_threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  /// Calls fn(worker, begin, end) on contiguous parts of [0, n), one per worker (the caller
  /// runs part 0), and returns when all are done. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int32_t, int64_t, int64_t)>& fn);

 private:
  void work(int32_t worker);
  [[nodiscard]] std::pair<int64_t, int64_t> part(int32_t worker) const;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int32_t, int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;
  int32_t num_running_ = 0;
  bool stopping_ = false;
};

}  // namespace troupe::kernels::cpu
