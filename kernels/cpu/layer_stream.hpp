#pragma once

/// A thread of its own that runs a job layer by layer while other threads wait only for the
/// layers they need: a step's KV moves (tier promotions, imports, demotion read-outs) beside the
/// forward pass that reads and writes the same layers (runtime/engine/step_executor.cpp; the
/// seed's copy stream, issue 54 point 2). Layer l's work runs before layer l + 1's, and
/// `wait(l)` returns once it has, so a reader of layer l sees every byte it wrote.
///
/// A waiter watches an atomic first (a few thousand PAUSEs: a layer of a forward pass takes
/// tens of microseconds to milliseconds), then sleeps on a condition variable.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::kernels::cpu {

class layer_stream {
 public:
  layer_stream();
  /// Finishes the running job, then stops the thread.
  ~layer_stream();
  layer_stream(const layer_stream&) = delete;
  layer_stream& operator=(const layer_stream&) = delete;

  /// Runs fn(0), fn(1), ..., fn(num_layers - 1) in order on the stream's thread. The previous
  /// job must be finished (`finish`); `fn` must stay callable until this one is.
  void start(int32_t num_layers, std::function<void(int32_t)> fn);
  /// Returns once fn(layer) of the running job has returned (any thread; layer < num_layers).
  void wait(int32_t layer);
  /// Returns once the whole running job has (at once without one).
  void finish();

 private:
  void work();

  std::mutex mutex_;
  std::condition_variable posted_;  // a job or the stop, for the stream's thread
  std::condition_variable done_;    // a layer done, for waiters
  std::function<void(int32_t)> fn_;
  int32_t num_layers_ = 0;
  std::atomic<int32_t> layers_done_{0};
  bool running_ = false;  // a job posted and not finished
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::kernels::cpu
