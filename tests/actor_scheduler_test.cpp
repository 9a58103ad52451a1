// The wall-clock actor scheduler (actors/system/scheduler.hpp): how it is sized around the step
// executors, and that it runs actors to the end with and without the idle workers' watch. Run it
// under ThreadSanitizer too: the watch reads the queue's length without the queue's lock.
#include <gtest/gtest.h>

#include <unistd.h>

#ifdef __linux__
#include <sched.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <functional>
#include <memory>
#include <thread>

#include <caf/all.hpp>

#include "actors/system/scheduler.hpp"

namespace troupe::actors {
namespace {

TEST(ActorScheduler, WorkersGetTheCoresTheExecutorsLeaveAndAsManyWatch) {
  const scheduler_plan one_executor = plan_scheduler(2, 1);
  EXPECT_EQ(one_executor.num_workers, 2);
  EXPECT_EQ(one_executor.max_awake, 1);
  EXPECT_EQ(one_executor.max_watching, 1);
  EXPECT_EQ(one_executor.patience_ns, default_patience_ns);
  EXPECT_EQ(one_executor.spin_ns, default_spin_ns);
  EXPECT_EQ(one_executor.max_throughput, default_max_throughput);
  const scheduler_plan no_executor = plan_scheduler(2, 0);  // a client, a shard host
  EXPECT_EQ(no_executor.num_workers, 2);
  EXPECT_EQ(no_executor.max_awake, 2);
  EXPECT_EQ(no_executor.max_watching, 2);
  const scheduler_plan all_cores = plan_scheduler(2, 2);  // the workers share the cores: no watch
  EXPECT_EQ(all_cores.num_workers, 2);
  EXPECT_EQ(all_cores.max_awake, 1);
  EXPECT_EQ(all_cores.max_watching, 0);
  const scheduler_plan oversubscribed = plan_scheduler(4, 9);
  EXPECT_EQ(oversubscribed.num_workers, 2);
  EXPECT_EQ(oversubscribed.max_watching, 0);
  const scheduler_plan one_core = plan_scheduler(1, 0);
  EXPECT_EQ(one_core.num_workers, 2);
  EXPECT_EQ(one_core.max_watching, 1);
  const scheduler_plan big = plan_scheduler(64, 16);
  EXPECT_EQ(big.num_workers, 48);
  EXPECT_EQ(big.max_awake, 48);
  EXPECT_EQ(big.max_watching, 48);
  EXPECT_EQ(plan_scheduler(8, -3).num_workers, 8);  // a negative count is none
  EXPECT_GE(hardware_cores(), 1);
}

TEST(ActorScheduler, ACgroupQuotaIsCountedInWholeCoresRoundedUp) {
  EXPECT_EQ(quota_cores("200000 100000"), 2);
  EXPECT_EQ(quota_cores("150000 100000"), 2);
  EXPECT_EQ(quota_cores("50000 100000"), 1);
  EXPECT_EQ(quota_cores("max 100000"), 0);
  EXPECT_EQ(quota_cores(""), 0);
  EXPECT_EQ(quota_cores("-1 100000"), 0);  // cgroup v1's "no quota"
  EXPECT_EQ(quota_cores("abc 100000"), 0);
  EXPECT_EQ(quota_cores("12x 100000"), 0);
  EXPECT_EQ(quota_cores("100000 0"), 0);
  EXPECT_EQ(quota_cores("100000"), 0);
}

/// Writes `text` to `path`, making its folders.
void write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

TEST(ActorScheduler, TheTightestCgroupQuotaOnTheWayToTheRootCounts) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("troupe_cgroup_test_" + std::to_string(::getpid()));
  // cgroup v2: the process's group sets none, its parent 3 cores' worth, the root none.
  write_file(root / "cpu.max", "max 100000");
  write_file(root / "a" / "cpu.max", "300000 100000");
  write_file(root / "a" / "b" / "cpu.max", "max 100000");
  EXPECT_EQ(cgroup_quota_cores(root.string(), "0::/a/b\n"), 3);
  EXPECT_EQ(cgroup_quota_cores(root.string(), "0::/\n"), 0);
  EXPECT_EQ(cgroup_quota_cores(root.string(), "0::/missing/group\n"), 0);
  // cgroup v1, the cpu controller mounted with cpuacct: 1.5 cores' worth, rounded up.
  write_file(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1");
  write_file(root / "cpu,cpuacct" / "x" / "cpu.cfs_quota_us", "150000");
  write_file(root / "cpu,cpuacct" / "x" / "cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroup_quota_cores(root.string(), "4:memory:/m\n3:cpu,cpuacct:/x\n"), 2);
  // Both, and lines that are not cgroups: the tightest.
  EXPECT_EQ(cgroup_quota_cores(root.string(), "garbage\n3:cpu,cpuacct:/x\n0::/a/b\n"), 2);
  EXPECT_EQ(cgroup_quota_cores(root.string(), "3:cpuacct:/x\n"), 0);  // not the cpu controller
  std::filesystem::remove_all(root);
}

#ifdef __linux__
TEST(ActorScheduler, CountsTheCoresTheProcessMayRunOn) {
  // Pinned to one core (as by taskset or a cpuset), the plan gives one worker that never watches.
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  int first = 0;
  while (!CPU_ISSET(first, &before)) first++;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int32_t pinned = hardware_cores();
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(pinned, 1);
  // Unpinned: the affinity's cores, fewer under a container's CPU quota.
  std::ifstream self("/proc/self/cgroup");
  const std::string self_cgroup{std::istreambuf_iterator<char>(self), std::istreambuf_iterator<char>()};
  const int32_t quota = cgroup_quota_cores("/sys/fs/cgroup", self_cgroup);
  EXPECT_EQ(hardware_cores(), quota > 0 ? std::min(quota, CPU_COUNT(&before)) : CPU_COUNT(&before));
  const scheduler_plan p = plan_scheduler(pinned, 1);
  EXPECT_EQ(p.num_workers, 2);
  EXPECT_EQ(p.max_watching, 0);
}
#endif

/// A plan with `workers` workers, `awake` of them woken at once, `watching` of them watching.
scheduler_plan plan(int32_t workers, int32_t awake, int32_t watching, int64_t spin_ns = default_spin_ns) {
  scheduler_plan p;
  p.num_workers = workers;
  p.max_awake = awake;
  p.max_watching = watching;
  p.spin_ns = spin_ns;
  return p;
}

/// Counts `rounds` round trips between two actors, answered to a scoped actor (a thread outside
/// the scheduler) after each hundred: jobs enqueued by workers and from outside.
int64_t ping_pong(const scheduler_plan& plan, int32_t rounds) {
  caf::actor_system_config cfg;
  use_scheduler(cfg, plan);
  caf::actor_system sys{cfg};
  EXPECT_EQ(sys.scheduler().num_workers(), static_cast<size_t>(plan.num_workers));
  auto pong = sys.spawn([]() -> caf::behavior { return {[](int32_t x) { return x + 1; }}; });
  caf::scoped_actor self{sys};
  auto ping = sys.spawn([pong](caf::event_based_actor* me) -> caf::behavior {
    return {[me, pong](int32_t left) -> caf::result<int64_t> {
      auto done = me->make_response_promise<int64_t>();
      auto count = std::make_shared<int64_t>(0);
      auto loop = std::make_shared<std::function<void(int32_t)>>();
      *loop = [me, pong, done, count, loop](int32_t n) mutable {
        if (n == 0) {
          done.deliver(*count);
          *loop = nullptr;  // breaks the cycle
          return;
        }
        me->request(pong, caf::infinite, n).then([count, loop, n](int32_t) {
          ++*count;
          (*loop)(n - 1);
        });
      };
      (*loop)(left);
      return done;
    }};
  });
  int64_t total = 0;
  for (int32_t batch = 0; batch < rounds / 100; batch++)
    self->request(ping, caf::infinite, int32_t{100}).receive([&](int64_t n) { total += n; }, [](caf::error&) {});
  self->send_exit(ping, caf::exit_reason::user_shutdown);
  self->send_exit(pong, caf::exit_reason::user_shutdown);
  return total;
}

TEST(ActorScheduler, RunsEveryMessageWithTheWatch) { EXPECT_EQ(ping_pong(plan_scheduler(2, 1), 2000), 2000); }

TEST(ActorScheduler, RunsEveryMessageWithoutTheWatch) {
  EXPECT_EQ(ping_pong(plan(2, 2, 0), 2000), 2000);
  EXPECT_EQ(ping_pong(plan(2, 1, 0), 2000), 2000);
  EXPECT_EQ(ping_pong(plan(1, 1, 0), 2000), 2000);
}

TEST(ActorScheduler, SeveralWorkersWatchingTheSameQueue) {
  EXPECT_EQ(ping_pong(plan(3, 3, 3, 50'000), 2000), 2000);
  EXPECT_EQ(ping_pong(plan(4, 4, 1, 50'000), 2000), 2000);  // one watches, three sleep
}

TEST(ActorScheduler, AnActorWhoseMailboxNeverEmptiesLetsTheOthersOnItsWorkerRun) {
  // One worker; a hog that sends itself a message for each it handles, until told to stop. With
  // CAF's unbounded throughput it would keep the worker, and the echo would never answer.
  caf::actor_system_config cfg;
  use_scheduler(cfg, plan(1, 1, 1));
  caf::actor_system sys{cfg};
  EXPECT_EQ(sys.scheduler().max_throughput(), default_max_throughput);
  auto stopped = std::make_shared<std::atomic<bool>>(false);
  auto hog = sys.spawn([stopped](caf::event_based_actor* me) -> caf::behavior {
    return {[me, stopped](int64_t n) {
      if (!stopped->load()) me->send(me, n + 1);
    }};
  });
  auto echo = sys.spawn([]() -> caf::behavior { return {[](int32_t x) { return x; }}; });
  caf::scoped_actor self{sys};
  self->send(hog, int64_t{0});
  bool answered = false;
  self->request(echo, std::chrono::seconds(60), int32_t{7})
      .receive([&](int32_t x) { answered = x == 7; }, [](caf::error&) {});
  stopped->store(true);
  EXPECT_TRUE(answered) << "the hog kept the only worker";
  self->send_exit(hog, caf::exit_reason::user_shutdown);
  self->send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST(ActorScheduler, AHeldUpWorkerIsHelpedByASpareOneOnceAJobHasWaited) {
  // Two workers, one awake at a time: a handler that blocks until another actor has run holds
  // the awake one, and the other actor waits in the queue until the spare worker is woken for it
  // (by the next actor queued after it has waited `patience`).
  caf::actor_system_config cfg;
  use_scheduler(cfg, plan(2, 1, 0));
  caf::actor_system sys{cfg};
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto blocker = sys.spawn([released]() -> caf::behavior {
    return {[released](int32_t) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!released->load() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    }};
  });
  auto releaser = sys.spawn([released]() -> caf::behavior { return {[released](int32_t) { released->store(true); }}; });
  caf::anon_send(blocker, int32_t{0});
  caf::anon_send(releaser, int32_t{0});
  // Actors keep getting work, as in a serving node: a new one every millisecond for up to 60 s.
  for (int32_t i = 0; i < 60'000 && !released->load(); i++) {
    sys.spawn([]() -> caf::behavior { return {[](int32_t) {}}; });
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(released->load()) << "the releaser never ran beside the held-up worker";
  caf::anon_send_exit(blocker, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(releaser, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::actors
