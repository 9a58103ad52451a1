#pragma once

/// A fixed set of worker threads for splitting one kernel call's independent outputs (matmul
/// output tiles, attention rows). Splitting never changes a result's bits: every output element
/// is computed whole by one thread, in the same order as on one thread.
///
/// A step calls parallel_for a few times per layer, microseconds apart, so waiting is done in
/// two stages: first watching an atomic with PAUSE (`spin_checks` checks, ~100 us), then
/// sleeping on a condition variable. Every 1024th check yields the core, in case the OS put
/// another of the step's threads on it (pinned to one core, 8 clients on 2 executor threads went
/// from 0.60-0.76x to 1.01-1.04x the reference with it; a yield every 64 checks made the
/// unpinned case 25% slower, one every 1024 changed nothing measurable). A call
/// that finds its workers watching starts them without a futex wake or an inter-processor
/// interrupt (~10 us each on this project's VMs, as long as a small product). The range is cut
/// into a few chunks per thread that the threads claim one at a time, the caller too: a worker
/// that another thread kept off its core only delays the chunk it holds, and one that wakes late
/// finds nothing left.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels::cpu {

class thread_pool {
 public:
  /// `num_threads` >= 1 workers in total; the calling thread is one of them. `spin_checks`: how
  /// many times a waiting thread looks before it sleeps (0: it sleeps at once).
  explicit thread_pool(int32_t num_threads, int32_t spin_checks = default_spin_checks);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// About 100 us of watching (a PAUSE is 40-140 cycles, depending on the CPU).
  static constexpr int32_t default_spin_checks = 4096;

  [[nodiscard]] int32_t num_threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  /// Calls fn(worker, begin, end) on contiguous chunks that cover [0, n) once, worker being the
  /// calling thread's index (0: the caller), and returns when all are done. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int32_t, int64_t, int64_t)>& fn);

 private:
  void work(int32_t worker);
  /// Claims and runs chunks of call `call` until none is left (or that call is over).
  void run_chunks(int32_t worker, uint32_t call);
  /// Watches `done()` for up to spin_checks_ looks; whether it turned true.
  template <class Done>
  bool watch(const Done& done) const;

  const int32_t spin_checks_;
  std::vector<std::thread> workers_;
  // The call: written by the caller before it publishes the call's number in claim_ (release),
  // read by a thread after it claimed one of its chunks (acquire), unchanged until every chunk
  // is done, which cannot happen while a claimed chunk runs.
  const std::function<void(int32_t, int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  std::atomic<uint64_t> claim_{0};  // the call's number, its number of chunks, the next chunk
  std::atomic<int64_t> remaining_{0};  // chunks not yet done
  std::atomic<bool> stopping_{false};
  // Sleeping: who sleeps is known under mutex_, so a wake is sent only to a sleeper.
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  int32_t num_sleeping_ = 0;
  bool caller_sleeping_ = false;
};

}  // namespace troupe::kernels::cpu
