// The path monitor's throughput estimate (multipath/rate_estimate.h), on a
// synthetic clock: what a sample covers, and when an estimate stops being
// planned with.
#include <gtest/gtest.h>

#include "multipath/rate_estimate.h"

namespace maestro {
namespace multipath {
namespace {

Clock::time_point at(double seconds) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

TEST(RateEstimate, ASampleCoversAtLeastItsMinimumBusyTimeAndTwoChunks) {
  RateEstimate r;
  r.busy(at(10.0));
  r.completed(1000, at(10.001));  // 1 ms busy: too short to be a sample
  EXPECT_EQ(0.0, r.value());
  EXPECT_FALSE(r.stale(at(10.001))) << "nothing measured is not stale";
  r.completed(3000, at(10.004));  // 4 ms, 4000 bytes in all
  EXPECT_DOUBLE_EQ(1e6, r.value());
  EXPECT_FALSE(r.stale(at(10.004)));
  // One chunk alone, however long it took, is its latency as much as the
  // path's rate: no sample.
  RateEstimate lone;
  lone.busy(at(0.0));
  lone.completed(65536, at(0.020));
  EXPECT_EQ(0.0, lone.value());
  lone.completed(65536, at(0.021));  // the second chunk makes it one
  EXPECT_DOUBLE_EQ(131072 / 0.021, lone.value());
}

TEST(RateEstimate, IdleGapsDoNotCount) {
  RateEstimate r;
  r.busy(at(1.0));
  r.completed(2000, at(1.002));
  r.completed(2000, at(1.004));  // 1e6 B/s
  // Idle for 50 ms, then busy again: the next sample starts at the post.
  r.busy(at(1.054));
  r.completed(2000, at(1.056));
  r.completed(2000, at(1.058));  // 1e6 B/s again, not 4000 B over 54 ms
  EXPECT_DOUBLE_EQ(1e6, r.value());
  // A lone chunk's spell leaves nothing behind for the next one.
  r.busy(at(2.0));
  r.completed(2000, at(2.001));
  r.busy(at(3.0));
  r.completed(2000, at(3.002));
  r.completed(2000, at(3.004));
  EXPECT_DOUBLE_EQ(1e6, r.value());
}

TEST(RateEstimate, FreshSamplesAreAveraged) {
  RateEstimate r;
  r.busy(at(0.0));
  r.completed(2000, at(0.002));
  r.completed(2000, at(0.004));   // 1e6
  r.completed(6000, at(0.006));
  r.completed(6000, at(0.008));  // 3e6: 1e6 + 0.2 * 2e6
  EXPECT_DOUBLE_EQ(1.4e6, r.value());
}

// The estimate that kept a path idle: planned with only while fresh; the
// next sample after that starts a new average.
TEST(RateEstimate, AStaleEstimateIsNotPlannedWithAndIsReplaced) {
  RateEstimate r;
  r.busy(at(0.0));
  r.completed(2000, at(0.010));
  r.completed(2000, at(0.020));  // two slow chunks: 2e5 B/s
  EXPECT_FALSE(r.stale(at(0.020 + RateEstimate::kStale / 2)));
  // No sample since: the scheduler sees a path not measured yet.
  EXPECT_TRUE(r.stale(at(0.020 + RateEstimate::kStale)));
  EXPECT_DOUBLE_EQ(2e5, r.value()) << "statistics keep the last estimate";
  // Its share again, at its real rate: a new estimate, not 2e5 averaged in.
  r.busy(at(1.0));
  r.completed(20000, at(1.002));
  r.completed(20000, at(1.004));
  EXPECT_DOUBLE_EQ(1e7, r.value());
  EXPECT_FALSE(r.stale(at(1.004)));
}

TEST(RateEstimate, ResetForgetsEverything) {
  RateEstimate r;
  r.busy(at(0.0));
  r.completed(2000, at(0.002));
  r.completed(2000, at(0.004));
  ASSERT_GT(r.value(), 0.0);
  r.reset();
  EXPECT_EQ(0.0, r.value());
  EXPECT_FALSE(r.stale(at(1.0))) << "nothing measured is not stale";
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
