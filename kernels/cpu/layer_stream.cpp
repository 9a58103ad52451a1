#include "kernels/cpu/layer_stream.hpp"

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/cpu_relax.hpp"

namespace troupe::kernels::cpu {

layer_stream::layer_stream() : thread_([this] { work(); }) {}

layer_stream::~layer_stream() {
  finish();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  posted_.notify_one();
  thread_.join();
}

void layer_stream::start(int32_t num_layers, std::function<void(int32_t)> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TROUPE_KERNEL_ASSERT(!running_ && num_layers >= 0);
    fn_ = std::move(fn);
    num_layers_ = num_layers;
    layers_done_.store(0, std::memory_order_relaxed);
    running_ = true;
  }
  posted_.notify_one();
}

void layer_stream::wait(int32_t layer) {
  auto done = [&] { return layers_done_.load(std::memory_order_acquire) > layer; };
  constexpr int32_t spin_checks = 4096;  // ~100 us (kernels/cpu/thread_pool.hpp)
  for (int32_t i = 0; i < spin_checks; i++) {
    if (done()) return;
    cpu_relax();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, done);
}

void layer_stream::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return !running_; });
}

void layer_stream::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    posted_.wait(lock, [&] { return running_ || stopping_; });
    if (!running_) return;  // stopping, nothing posted
    const int32_t n = num_layers_;
    lock.unlock();
    for (int32_t l = 0; l < n; l++) {
      fn_(l);
      {
        std::lock_guard<std::mutex> done_lock(mutex_);
        layers_done_.store(l + 1, std::memory_order_release);
      }
      done_.notify_all();
    }
    lock.lock();
    running_ = false;
    fn_ = nullptr;
    done_.notify_all();
  }
}

}  // namespace troupe::kernels::cpu
