#pragma once

// SIGINT/SIGTERM for long-running commands: taken on a thread of their own, so that start-up
// (which may wait on other nodes) sees a stop request at once, not only after it finished.

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
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
      int sig = 0;
      sigwait(&set_, &sig);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closing_) return;  // the destructor's wake-up call
        signal_ = sig;
        stopped_ = true;
        arrived_.notify_all();
      }
      sigwait(&set_, &sig);
      again_ = true;
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
  std::atomic<bool> stopped_{false};
  std::atomic<bool> again_{false};
  bool closing_ = false;  // under mutex_
  std::thread thread_;
};

}  // namespace troupe::cli
