#include "actors/scheduler.hpp"

#ifdef __linux__
#include <sched.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <caf/actor_system_config.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduler/coordinator.hpp>

#include "kernels/cpu/cpu_relax.hpp"

namespace troupe::actors {
namespace {

/// CAF's work sharing (one central queue under a mutex) with one change: a worker that finds
/// the queue empty watches it for `spin` before it sleeps on the condition variable. A message
/// that arrives meanwhile (an executor's result, a step after the last) is taken at once,
/// without the futex wake and the inter-processor interrupt a sleeping worker costs its sender
/// (~10 us in this project's 2-vCPU VMs, a sixth of a one-row step of the bundled model). The
/// watch uses PAUSE, which leaves the other cores' speed alone, and yields the core every few
/// microseconds in case the OS put an executor on it too (pinned to one core, one client went
/// from 0.43x to 0.77x the reference with the yield); it is off (zero) wherever the workers
/// would share cores with the executors.
class watching_sharing : public caf::policy::unprofiled {
public:
  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {}
    std::deque<caf::resumable*> queue;
    std::mutex lock;
    std::condition_variable cv;
    std::atomic<size_t> size{0};  // the queue's length, readable without the lock
    int32_t num_sleeping = 0;     // under `lock`
    std::chrono::nanoseconds spin{0};
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator*) {}
  };

  template <class Coordinator>
  void enqueue(Coordinator* self, caf::resumable* job) {
    coordinator_data& data = d(self);
    bool wake = false;
    {
      std::lock_guard<std::mutex> guard(data.lock);
      data.queue.push_back(job);
      data.size.fetch_add(1, std::memory_order_release);
      wake = data.num_sleeping > 0;
    }
    if (wake) data.cv.notify_one();
  }

  template <class Coordinator>
  void central_enqueue(Coordinator* self, caf::resumable* job) {
    enqueue(self, job);
  }

  template <class Worker>
  void external_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  void internal_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  void resume_job_later(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  caf::resumable* dequeue(Worker* self) {
    coordinator_data& data = d(self->parent());
    watch(data);
    std::unique_lock<std::mutex> guard(data.lock);
    if (data.queue.empty()) {
      data.num_sleeping++;
      data.cv.wait(guard, [&] { return !data.queue.empty(); });
      data.num_sleeping--;
    }
    caf::resumable* job = data.queue.front();
    data.queue.pop_front();
    data.size.fetch_sub(1, std::memory_order_relaxed);
    return job;
  }

  template <class Worker, class UnaryFunction>
  void foreach_resumable(Worker*, UnaryFunction) {}

  template <class Coordinator, class UnaryFunction>
  void foreach_central_resumable(Coordinator* self, UnaryFunction f) {
    coordinator_data& data = d(self);
    std::lock_guard<std::mutex> guard(data.lock);
    while (!data.queue.empty()) {
      caf::resumable* job = data.queue.front();
      data.queue.pop_front();
      data.size.fetch_sub(1, std::memory_order_relaxed);
      f(job);
    }
  }

private:
  /// Returns when the queue has a job or `spin` has passed (at once when it is zero).
  static void watch(const coordinator_data& data) {
    if (data.spin.count() == 0 || data.size.load(std::memory_order_acquire) > 0) return;
    const auto until = std::chrono::steady_clock::now() + data.spin;
    for (;;) {
      for (int i = 0; i < 64; i++) {
        if (data.size.load(std::memory_order_acquire) > 0) return;
        kernels::cpu::cpu_relax();
      }
      if (std::chrono::steady_clock::now() >= until) return;
      // Gives the core to a thread the OS placed on it with this one (an executor, when the
      // system has put both on one core): with none waiting it returns at once.
      std::this_thread::yield();
    }
  }
};

using coordinator = caf::scheduler::coordinator<watching_sharing>;

}  // namespace

scheduler_plan plan_scheduler(int32_t num_cores, int32_t compute_threads) {
  scheduler_plan p;
  p.num_workers = std::max(1, num_cores - std::max(0, compute_threads));
  p.spin_ns = p.num_workers + compute_threads <= num_cores ? default_spin_ns : 0;
  return p;
}

void use_scheduler(caf::actor_system_config& cfg, const scheduler_plan& plan) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(plan.num_workers));
  const std::chrono::nanoseconds spin{plan.spin_ns};
  cfg.module_factories.push_back([spin](caf::actor_system& sys) -> caf::actor_system::module* {
    auto* c = new coordinator(sys);
    c->data().spin = spin;
    return c;
  });
}

int32_t hardware_cores() {
#ifdef __linux__
  // The cores this process may run on (taskset, a cgroup's cpuset), not all the machine's.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0) return CPU_COUNT(&allowed);
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int32_t>(n);
}

}  // namespace troupe::actors
