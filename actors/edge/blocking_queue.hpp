#pragma once

/// A queue of tasks for the HTTP server's worker threads: the loop pushes (never waits), a
/// worker pops (waiting). Unbounded, and bounded by what pushes: one task per request read, and
/// a connection has one request answered at a time (the connections are capped: edge_limits).
/// The msgpack gateway's output queue counts its bytes instead (msgpack_gateway.cpp).

#include <condition_variable>
#include <deque>
#include <mutex>

namespace troupe::gateway {

template <class T>
class blocking_queue {
 public:
  void push(T item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(std::move(item));
    }
    ready_.notify_one();
  }
  /// The oldest item, waiting until there is one.
  T pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return !items_.empty(); });
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
};

}  // namespace troupe::gateway
