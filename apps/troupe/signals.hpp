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
/// the first one on its own thread: `stopped()` turns true then, and `wait()` returns it.
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
      std::lock_guard<std::mutex> lock(mutex_);
      signal_ = sig;
      stopped_ = true;
      arrived_.notify_all();
    });
  }

  ~signal_waiter() {
    // No signal came: wake the thread with one aimed at it alone (it stays blocked elsewhere).
    if (!stopped_) pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

  signal_waiter(const signal_waiter&) = delete;
  signal_waiter& operator=(const signal_waiter&) = delete;

  /// True once a signal arrived.
  [[nodiscard]] const std::atomic<bool>& stopped() const { return stopped_; }

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
  std::thread thread_;
};

}  // namespace troupe::cli
