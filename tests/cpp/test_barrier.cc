// What a barrier promises: no rank leaves it before the last rank has
// entered it. Ranks as threads over real loopback paths; one rank enters
// late, and every rank's leaving time is compared with its entering time
// (one clock: one process). A barrier that returned without waiting -- or
// one that waited for its neighbours only -- lets some rank out first.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "collectives/collectives.h"
#include "collective_world.h"
#include "test_util.h"

namespace maestro {
namespace collectives {
namespace {

using testing::after;
using testing::errorText;
using testing::runRanks;
using testing::World;

TEST(Barrier, NoRankLeavesBeforeTheLastHasEntered) {
  const int n = 5;
  World w(n, {{"paths", "2"}});
  for (auto& e : w.engines) ASSERT_TRUE(e) << "a rank did not join";
  // Each rank late in turn, at either end of the ring and in its middle:
  // a barrier that waits for its neighbours only lets the far ranks out.
  uint64_t seq = 1;
  for (int late : {0, 2, n - 1}) {
    std::vector<Clock::time_point> left(n);
    Clock::time_point entered;
    auto errors = runRanks(n, [&](int r) {
      if (r == late) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        entered = Clock::now();
      }
      barrier(*w.engines[r], seq, after(30));
      left[r] = Clock::now();
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(left[r] >= entered) << "rank " << r << " left the barrier "
                                  << std::chrono::duration<double>(entered - left[r]).count()
                                  << " s before rank " << late << " entered it";
    ++seq;
  }
}

// A rank that never comes holds the others until their deadline, which then
// names it: the barrier waits for it, and does not wait for ever.
TEST(Barrier, ARankThatNeverComesHoldsTheOthersUntilTheDeadline) {
  const int n = 3;
  World w(n, {{"paths", "2"}});
  for (auto& e : w.engines) ASSERT_TRUE(e) << "a rank did not join";
  const auto start = Clock::now();
  auto errors = runRanks(n - 1, [&](int r) { barrier(*w.engines[r], 1, after(1)); });
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(waited, 0.9) << "the barrier let ranks out without rank " << n - 1;
  EXPECT_LT(waited, 10.0);
  for (int r = 0; r < n - 1; ++r) {
    const std::string error = errorText(errors[r]);
    EXPECT_NE(std::string::npos, error.find("rank 2")) << "rank " << r << ": " << error;
  }
}

}  // namespace
}  // namespace collectives
}  // namespace maestro
