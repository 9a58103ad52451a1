#include "kernels/cpu/thread_pool.hpp"


namespace troupe::kernels::cpu {

thread_pool::thread_pool(int32_t num_threads) {
  for (int32_t w = 1; w < num_threads; w++) workers_.emplace_back([this, w] { work(w); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::pair<int64_t, int64_t> thread_pool::part(int32_t worker) const {
  const int64_t parts = num_threads();
  return {n_ * worker / parts, n_ * (worker + 1) / parts};
}

void thread_pool::parallel_for(int64_t n, const std::function<void(int32_t, int64_t, int64_t)>& fn) {
  if (workers_.empty() || n <= 1) {
    fn(0, 0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    n_ = n;
    num_running_ = static_cast<int32_t>(workers_.size());
    generation_++;
  }
  start_.notify_all();
  const auto [begin, end] = part(0);
  fn(0, begin, end);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return num_running_ == 0; });
  job_ = nullptr;
}

void thread_pool::work(int32_t worker) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int32_t, int64_t, int64_t)>* job = nullptr;
    std::pair<int64_t, int64_t> range;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      range = part(worker);
    }
    (*job)(worker, range.first, range.second);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--num_running_ == 0) done_.notify_one();
  }
}

}  // namespace troupe::kernels::cpu
