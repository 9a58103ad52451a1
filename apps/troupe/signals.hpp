#pragma once

// SIGINT/SIGTERM for long-running commands: taken on a thread of their own, so that start-up
// (which may wait on other nodes) sees a stop request at once, not only after it finished.

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

namespace troupe::cli {

/// Blocks SIGINT and SIGTERM in every thread (construct it before CAF starts any) and waits for
/// them on its own thread: `stopped()` turns true at the first, and `wait()` returns it;
/// `again()` turns true at the second (a drain in progress then stops at once).
class signal_waiter {
 public:
  signal_waiter() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] {
      for (;;) {
        int sig = 0;
        sigwait(&set_, &sig);
        std::lock_guard<std::mutex> lock(mutex_);
        if (closing_) return;  // the destructor's wake-up call
        if (signal_ != 0) {    // the second (a drain request may have been the first)
          again_ = true;
          return;
        }
        signal_ = sig;
        stopped_ = true;
        arrived_.notify_all();
      }
    });
  }

  ~signal_waiter() {
    // Wake the thread, waiting for its first or its second signal, with one aimed at it alone
    // (signals stay blocked elsewhere).
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    if (!again_) pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

  signal_waiter(const signal_waiter&) = delete;
  signal_waiter& operator=(const signal_waiter&) = delete;

  /// True once a signal arrived.
  [[nodiscard]] const std::atomic<bool>& stopped() const { return stopped_; }
  /// True once a second signal arrived.
  [[nodiscard]] bool again() const { return again_; }

  /// A drain request (`troupe drain`) stops the wait as SIGTERM would, with `grace_ms` (-1: the
  /// topology's); false if a signal or request came first.
  bool request_drain(int32_t grace_ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (signal_ != 0) return false;
    signal_ = SIGTERM;
    requested_grace_ms_ = grace_ms;
    stopped_ = true;
    arrived_.notify_all();
    return true;
  }
  /// The grace period of the drain request that stopped the wait (none: a signal did).
  [[nodiscard]] std::optional<int32_t> requested_grace_ms() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requested_grace_ms_;
  }

  /// Blocks until a signal arrives (or returns the one that already did).
  int wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    arrived_.wait(lock, [this] { return signal_ != 0; });
    return signal_;
  }

 private:
  sigset_t set_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int signal_ = 0;
  std::optional<int32_t> requested_grace_ms_;  // under mutex_
  std::atomic<bool> stopped_{false};
  std::atomic<bool> again_{false};
  bool closing_ = false;  // under mutex_
  std::thread thread_;
};

}  // namespace troupe::cli
