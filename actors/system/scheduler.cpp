#include "actors/system/scheduler.hpp"

#ifdef __linux__
#include <sched.h>
#endif

#include <algorithm>
#include <climits>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduler/coordinator.hpp>

#include "kernels/cpu/cpu_relax.hpp"

namespace troupe::actors {
namespace {

/// CAF's work sharing (one central queue under a mutex) with two changes.
///
/// A worker that finds the queue empty may watch it for `spin` before it sleeps on the condition
/// variable, as long as fewer than `max_watching` others watch already. A message that arrives
/// meanwhile (an executor's result, a step after the last) is taken at once, without the futex
/// wake and the inter-processor interrupt a sleeping worker costs its sender (~10 us in this
/// project's 2-vCPU VMs, a sixth of a one-row step of the bundled model), and no sleeper is
/// woken for a job that a watcher will take. The watch uses PAUSE, which leaves the other cores'
/// speed alone, and yields the core every few microseconds in case the OS put an executor on it
/// too (pinned to one core, one client went from 0.43x to 0.77x the reference with the yield).
///
/// A sleeper is woken only while fewer than `max_awake` workers are awake (one per core the
/// executors leave), so actor work does not take cores from a step; beyond that, only when the
/// job at the head of the queue has waited `patience`: the awake workers are held up (a long
/// handler), and a spare worker keeps the process's other actors going.
class watching_sharing : public caf::policy::unprofiled {
public:
  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {}
    struct queued {
      caf::resumable* job;
      std::chrono::steady_clock::time_point since;
    };
    std::deque<queued> queue;
    std::mutex lock;
    std::condition_variable cv;
    std::atomic<size_t> size{0};  // the queue's length, readable without the lock
    int32_t num_sleeping = 0;     // under `lock`
    int32_t num_watching = 0;     // under `lock`: workers that will look at the queue again
    int32_t max_watching = 0;
    int32_t num_workers = 0;
    int32_t max_awake = 0;
    std::chrono::nanoseconds spin{0};
    std::chrono::nanoseconds patience{0};
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator*) {}
  };

  /// `always_wake`: wake a sleeper whatever the limits (the shutdown's jobs, one per worker).
  template <class Coordinator>
  void enqueue(Coordinator* self, caf::resumable* job, bool always_wake = false) {
    coordinator_data& data = d(self);
    bool wake = false;
    {
      const auto now = std::chrono::steady_clock::now();
      std::lock_guard<std::mutex> guard(data.lock);
      data.queue.push_back({job, now});
      data.size.fetch_add(1, std::memory_order_release);
      // Each watcher takes a job once it stops watching; a sleeper is needed for the rest, if
      // fewer than max_awake workers are awake or the awake ones are held up.
      const bool uncovered = data.queue.size() > static_cast<size_t>(data.num_watching);
      const bool room = data.num_workers - data.num_sleeping < data.max_awake;
      const bool held_up = now - data.queue.front().since >= data.patience;
      wake = data.num_sleeping > 0 && (always_wake || (uncovered && (room || held_up)));
    }
    if (wake) data.cv.notify_one();
  }

  template <class Coordinator>
  void central_enqueue(Coordinator* self, caf::resumable* job) {
    enqueue(self, job);
  }

  /// CAF calls this only from coordinator::stop(), with a job that ends the worker taking it: a
  /// worker that has ended still counts as awake, so the limits would keep the rest asleep.
  template <class Worker>
  void external_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job, true);
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
    std::unique_lock<std::mutex> guard(data.lock);
    if (data.queue.empty() && data.num_watching < data.max_watching && data.spin.count() > 0) {
      data.num_watching++;
      guard.unlock();
      watch(data);
      guard.lock();
      data.num_watching--;
    }
    if (data.queue.empty()) {
      data.num_sleeping++;
      data.cv.wait(guard, [&] { return !data.queue.empty(); });
      data.num_sleeping--;
    }
    caf::resumable* job = data.queue.front().job;
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
      caf::resumable* job = data.queue.front().job;
      data.queue.pop_front();
      data.size.fetch_sub(1, std::memory_order_relaxed);
      f(job);
    }
  }

private:
  /// Returns when the queue has a job or `spin` has passed.
  static void watch(const coordinator_data& data) {
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
  const int32_t free_cores = std::max(0, num_cores - std::max(0, compute_threads));
  scheduler_plan p;
  p.num_workers = std::max(min_workers, free_cores);
  p.max_awake = std::max(1, free_cores);
  p.max_watching = free_cores;
  return p;
}

void use_scheduler(caf::actor_system_config& cfg, const scheduler_plan& plan) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(plan.num_workers));
  cfg.set("scheduler.max-throughput", plan.max_throughput);
  cfg.module_factories.push_back([plan](caf::actor_system& sys) -> caf::actor_system::module* {
    auto* c = new coordinator(sys);
    c->data().num_workers = plan.num_workers;
    c->data().max_awake = plan.max_awake;
    c->data().max_watching = plan.max_watching;
    c->data().spin = std::chrono::nanoseconds{plan.spin_ns};
    c->data().patience = std::chrono::nanoseconds{plan.patience_ns};
    return c;
  });
}

int32_t quota_cores(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  int64_t period = 0;
  if (!(in >> quota >> period) || period <= 0 || quota == "max") return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<int32_t>(std::min<int64_t>((q + period - 1) / period, INT32_MAX));
}

namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  std::getline(f, text);
  return text;
}

/// Calls f(dir) for the cgroup path `dir` and every path above it, up to "" (the root).
template <class F>
void for_each_ancestor(std::string dir, const F& f) {
  for (;;) {
    if (dir == "/") dir.clear();
    f(dir);
    if (dir.empty()) return;
    dir = dir.substr(0, dir.rfind('/'));
  }
}

}  // namespace

int32_t cgroup_quota_cores(const std::string& root, const std::string& self_cgroup) {
  int32_t cores = 0;
  const auto take = [&](int32_t c) {
    if (c > 0) cores = cores == 0 ? c : std::min(cores, c);
  };
  std::istringstream self(self_cgroup);
  for (std::string line; std::getline(self, line);) {
    // "hierarchy:controllers:path"; v2's is "0::path".
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (controllers.empty()) {
      for_each_ancestor(path, [&](const std::string& dir) {
        take(quota_cores(read_small_file(root + dir + "/cpu.max")));
      });
      continue;
    }
    if (("," + controllers + ",").find(",cpu,") == std::string::npos) continue;
    // v1 mounts the controller at cpu/, or under its joint name (cpu,cpuacct/), or both.
    std::vector<std::string> mounts{root + "/cpu"};
    if (controllers != "cpu") mounts.push_back(root + "/" + controllers);
    for (const std::string& mount : mounts)
      for_each_ancestor(path, [&](const std::string& dir) {
        const std::string quota = read_small_file(mount + dir + "/cpu.cfs_quota_us");
        if (!quota.empty()) take(quota_cores(quota + " " + read_small_file(mount + dir + "/cpu.cfs_period_us")));
      });
  }
  return cores;
}

int32_t hardware_cores() {
  int32_t cores = 0;
#ifdef __linux__
  // The cores this process may run on (taskset, a cgroup's cpuset), not all the machine's.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) cores = CPU_COUNT(&allowed);
#endif
  if (cores <= 0) cores = static_cast<int32_t>(std::thread::hardware_concurrency());
  // A container's CPU quota (docker --cpus, a CI runner's) leaves fewer cores' worth of time than
  // it shows: workers watching on cores the quota does not pay for would throttle the executors.
  std::ifstream self("/proc/self/cgroup");
  const std::string self_cgroup{std::istreambuf_iterator<char>(self), std::istreambuf_iterator<char>()};
  const int32_t quota = cgroup_quota_cores("/sys/fs/cgroup", self_cgroup);
  if (quota > 0) cores = cores > 0 ? std::min(cores, quota) : quota;
  return std::max(1, cores);
}

}  // namespace troupe::actors
