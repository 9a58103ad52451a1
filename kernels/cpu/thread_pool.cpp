#include "kernels/cpu/thread_pool.hpp"

#include <algorithm>

#include "kernels/cpu/cpu_relax.hpp"

namespace troupe::kernels::cpu {

thread_pool::thread_pool(int32_t num_threads, int32_t spin_checks) : spin_checks_(spin_checks) {
  for (int32_t w = 1; w < num_threads; w++) workers_.emplace_back([this, w] { work(w); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true, std::memory_order_release);
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

template <class Done>
bool thread_pool::watch(const Done& done) const {
  for (int32_t i = 0; i < spin_checks_; i++) {
    if (done()) return true;
    if (i % 1024 == 1023)
      std::this_thread::yield();
    else
      cpu_relax();
  }
  return done();
}

namespace {

// claim_: the call's number (bits 32-63), its number of chunks (16-31), the next chunk (0-15).
uint32_t call_of(uint64_t claim) { return static_cast<uint32_t>(claim >> 32); }
int64_t chunks_of(uint64_t claim) { return static_cast<int64_t>((claim >> 16) & 0xffffu); }
int64_t chunk_of(uint64_t claim) { return static_cast<int64_t>(claim & 0xffffu); }

}  // namespace

void thread_pool::parallel_for(int64_t n, const std::function<void(int32_t, int64_t, int64_t)>& fn) {
  if (workers_.empty() || n <= 1) {
    fn(0, 0, n);
    return;
  }
  // A few chunks per thread: enough to even out a late or interrupted thread, few enough that
  // claiming them costs nothing next to a chunk.
  const int64_t chunks = std::min<int64_t>({n, 4 * static_cast<int64_t>(num_threads()), 0xffff});
  job_ = &fn;
  n_ = n;
  remaining_.store(chunks, std::memory_order_relaxed);
  const uint32_t call = call_of(claim_.load(std::memory_order_relaxed)) + 1;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    claim_.store(static_cast<uint64_t>(call) << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
    wake = num_sleeping_ > 0;
  }
  if (wake) start_.notify_all();
  run_chunks(0, call);
  auto all_done = [this] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (!watch(all_done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    caller_sleeping_ = true;
    done_.wait(lock, all_done);
    caller_sleeping_ = false;
  }
  job_ = nullptr;
}

void thread_pool::run_chunks(int32_t worker, uint32_t call) {
  for (;;) {
    uint64_t claim = claim_.load(std::memory_order_acquire);
    do {
      if (call_of(claim) != call || chunk_of(claim) >= chunks_of(claim)) return;  // over, or all claimed
    } while (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel, std::memory_order_acquire));
    const int64_t c = chunk_of(claim), chunks = chunks_of(claim);
    (*job_)(worker, n_ * c / chunks, n_ * (c + 1) / chunks);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1 && worker != 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (caller_sleeping_) done_.notify_one();
    }
  }
}

void thread_pool::work(int32_t worker) {
  uint32_t seen = 0;
  auto started = [&] {
    return stopping_.load(std::memory_order_acquire) || call_of(claim_.load(std::memory_order_acquire)) != seen;
  };
  for (;;) {
    if (!watch(started)) {
      std::unique_lock<std::mutex> lock(mutex_);
      num_sleeping_++;
      start_.wait(lock, started);
      num_sleeping_--;
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    seen = call_of(claim_.load(std::memory_order_acquire));
    run_chunks(worker, seen);
  }
}

}  // namespace troupe::kernels::cpu
