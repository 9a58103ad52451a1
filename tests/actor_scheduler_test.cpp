// The wall-clock actor scheduler (actors/scheduler.hpp): how it is sized around the step
// executors, and that it runs actors to the end with and without the idle workers' watch. Run it
// under ThreadSanitizer too: the watch reads the queue's length without the queue's lock.
#include <gtest/gtest.h>

#ifdef __linux__
#include <sched.h>
#endif

#include <cstdint>
#include <functional>
#include <memory>

#include <caf/all.hpp>

#include "actors/scheduler.hpp"

namespace troupe::actors {
namespace {

TEST(ActorScheduler, WorkersGetTheCoresTheExecutorsLeaveAndWatchOnlyWithACoreEach) {
  const scheduler_plan one_executor = plan_scheduler(2, 1);
  EXPECT_EQ(one_executor.num_workers, 1);
  EXPECT_EQ(one_executor.spin_ns, default_spin_ns);
  const scheduler_plan no_executor = plan_scheduler(2, 0);  // a client, a shard host
  EXPECT_EQ(no_executor.num_workers, 2);
  EXPECT_EQ(no_executor.spin_ns, default_spin_ns);
  const scheduler_plan all_cores = plan_scheduler(2, 2);  // one worker shares a core: no watch
  EXPECT_EQ(all_cores.num_workers, 1);
  EXPECT_EQ(all_cores.spin_ns, 0);
  const scheduler_plan oversubscribed = plan_scheduler(4, 9);
  EXPECT_EQ(oversubscribed.num_workers, 1);
  EXPECT_EQ(oversubscribed.spin_ns, 0);
  const scheduler_plan big = plan_scheduler(64, 16);
  EXPECT_EQ(big.num_workers, 48);
  EXPECT_EQ(big.spin_ns, default_spin_ns);
  EXPECT_EQ(plan_scheduler(8, -3).num_workers, 8);  // a negative count is none
  EXPECT_GE(hardware_cores(), 1);
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
  EXPECT_EQ(hardware_cores(), CPU_COUNT(&before));
  const scheduler_plan p = plan_scheduler(pinned, 1);
  EXPECT_EQ(p.num_workers, 1);
  EXPECT_EQ(p.spin_ns, 0);
}
#endif

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
  EXPECT_EQ(ping_pong(scheduler_plan{2, 0}, 2000), 2000);
  EXPECT_EQ(ping_pong(scheduler_plan{1, 0}, 2000), 2000);
}

TEST(ActorScheduler, SeveralWorkersWatchingTheSameQueue) { EXPECT_EQ(ping_pong(scheduler_plan{3, 50'000}, 2000), 2000); }

}  // namespace
}  // namespace troupe::actors
