// The heartbeat policy (runtime/balance/liveness.hpp): exact times at which peers are lost.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/balance/liveness.hpp"

namespace troupe::balance {
namespace {

constexpr int64_t ms = 1000000;

TEST(Liveness, APeerSilentForLongerThanTheTimeoutIsLostOnce) {
  liveness l(3, 5000 * ms, 1000 * ms);
  EXPECT_TRUE(l.newly_lost(6000 * ms).empty()) << "exactly the timeout is not yet longer";
  l.heard_from(1, 4000 * ms);
  EXPECT_EQ(l.newly_lost(6001 * ms), (std::vector<size_t>{0, 2}));
  EXPECT_TRUE(l.is_lost(0));
  EXPECT_FALSE(l.is_lost(1));
  EXPECT_TRUE(l.is_lost(2));
  EXPECT_TRUE(l.newly_lost(7000 * ms).empty()) << "each peer is reported once";
  EXPECT_EQ(l.newly_lost(9001 * ms), (std::vector<size_t>{1}));
  l.check_invariants();
}

TEST(Liveness, LostIsFinalAndALateAnswerChangesNothing) {
  liveness l(1, 5000 * ms, 0);
  EXPECT_EQ(l.newly_lost(5001 * ms), (std::vector<size_t>{0}));
  l.heard_from(0, 5002 * ms);
  EXPECT_TRUE(l.is_lost(0));
  EXPECT_TRUE(l.newly_lost(20000 * ms).empty());
}

TEST(Liveness, ARejoinedPeerIsLiveFromItsReturnAndCanBeLostAgain) {
  liveness l(2, 5000 * ms, 0);
  EXPECT_EQ(l.newly_lost(5001 * ms), (std::vector<size_t>{0, 1}));
  l.rejoined(1, 8000 * ms);
  EXPECT_FALSE(l.is_lost(1));
  EXPECT_TRUE(l.is_lost(0));
  EXPECT_TRUE(l.newly_lost(13000 * ms).empty()) << "silent since its return for exactly the timeout";
  l.heard_from(1, 12000 * ms);
  EXPECT_EQ(l.newly_lost(17001 * ms), (std::vector<size_t>{1}));
  l.mark_lost(0);  // lost twice over: no change
  l.rejoined(0, 20000 * ms);
  EXPECT_FALSE(l.is_lost(0));
  l.check_invariants();
}

TEST(Liveness, AnOlderAnswerDoesNotMoveTheLastHeardBack) {
  liveness l(1, 5000 * ms, 0);
  l.heard_from(0, 4000 * ms);
  l.heard_from(0, 3000 * ms);  // a pong that arrives after a newer load report
  EXPECT_TRUE(l.newly_lost(9000 * ms).empty());
  EXPECT_EQ(l.newly_lost(9001 * ms), (std::vector<size_t>{0}));
}

TEST(Liveness, APeerMarkedLostByItsDownMessageIsNotReportedAgain) {
  liveness l(2, 5000 * ms, 0);
  l.mark_lost(1);
  EXPECT_TRUE(l.is_lost(1));
  EXPECT_EQ(l.newly_lost(5001 * ms), (std::vector<size_t>{0}));
  l.check_invariants();
}

}  // namespace
}  // namespace troupe::balance
