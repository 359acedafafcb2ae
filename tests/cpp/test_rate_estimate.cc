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

TEST(RateEstimate, ASampleIsTheRateBetweenCompletionsWhileThePathHoldsChunks) {
  RateEstimate r;
  r.busy(at(10.010));
  r.completed(1000, at(10.010), 2);  // a round trip after the post: the sample starts here
  EXPECT_EQ(0.0, r.value());
  r.completed(2000, at(10.012), 1);  // 2 ms: too short to be a sample
  EXPECT_EQ(0.0, r.value());
  EXPECT_FALSE(r.stale(at(10.012))) << "nothing measured is not stale";
  r.completed(2000, at(10.014), 1);  // 4 ms, 4000 bytes since the first completion
  EXPECT_DOUBLE_EQ(1e6, r.value()) << "not 5000 bytes over the 14 ms since the post";
  EXPECT_FALSE(r.stale(at(10.014)));
  // Two chunks at least: one interval alone may be a chunk slow for once.
  RateEstimate one;
  one.busy(at(0.001));
  one.completed(65536, at(0.001), 1);
  one.completed(65536, at(0.021), 1);
  EXPECT_EQ(0.0, one.value());
  one.completed(65536, at(0.022), 0);  // the second makes it one; the path is then empty
  EXPECT_DOUBLE_EQ(131072 / 0.021, one.value());
}

// A path that holds one chunk at a time measures its round trip, not its
// rate: it gives no sample, however many chunks it carries.
TEST(RateEstimate, ChunksThatHadThePathAloneGiveNoSample) {
  RateEstimate r;
  for (int i = 0; i < 20; ++i) {
    r.busy(at(0.010 * (i + 1)));
    r.completed(65536, at(0.010 * (i + 1)), 0);
  }
  EXPECT_EQ(0.0, r.value());
}

// The hunter's measure: bytes over the time the path held chunks, round
// trips included, idle gaps not. A path that delivers each chunk before the
// next is posted has one too (it has no estimate), so a slow sibling that
// is measured can be compared with it.
TEST(RateEstimate, BusyTotalsCountTheTimeThePathHeldChunks) {
  RateEstimate fast, slow;
  double t = 1.0;
  for (int i = 0; i < 50; ++i) {
    fast.busy(at(t));  // one 16 KiB chunk at a time, 100 us each
    fast.completed(16384, at(t + 0.0001), 0);
    slow.busy(at(t));  // two at a time at 2 MB/s
    slow.completed(16384, at(t + 0.008), 1);
    slow.completed(16384, at(t + 0.016), 0);
    t += 0.02;
  }
  EXPECT_EQ(0.0, fast.value()) << "no two chunks at once: no estimate";
  const auto f = fast.busyTotals(at(t));
  EXPECT_EQ(50u * 16384, f.bytes);
  EXPECT_NEAR(50 * 0.0001, f.seconds, 1e-9) << "idle gaps do not count";
  const auto s = slow.busyTotals(at(t));
  EXPECT_NEAR(16384 / 0.008, s.bytes / s.seconds, 1.0);
  // A spell under way counts up to now; chunks queued behind an empty
  // path keep the spell going.
  slow.busy(at(t));
  EXPECT_NEAR(s.seconds + 0.005, slow.busyTotals(at(t + 0.005)).seconds, 1e-9);
  slow.completed(16384, at(t + 0.008), 1);
  slow.busy(at(t + 0.010));
  slow.completed(16384, at(t + 0.016), 0);
  EXPECT_NEAR(s.seconds + 0.016, slow.busyTotals(at(t + 1)).seconds, 1e-9);
  // The look's rate: since the previous look (here, all of it), nothing
  // when the path held nothing since, and afresh after a reset.
  EXPECT_NEAR(2 * 16384 / 0.016, slow.busyRateSinceLastLook(at(t + 1)), 1.0);
  EXPECT_EQ(0.0, slow.busyRateSinceLastLook(at(t + 2)));
  slow.reset();
  EXPECT_EQ(0u, slow.busyTotals(at(t + 1)).bytes);
  slow.busy(at(t + 3));
  slow.completed(16384, at(t + 3.004), 0);
  EXPECT_NEAR(16384 / 0.004, slow.busyRateSinceLastLook(at(t + 4)), 1.0);
}

TEST(RateEstimate, IdleGapsDoNotCount) {
  RateEstimate r;
  r.busy(at(1.000));
  r.completed(2000, at(1.000), 2);
  r.completed(2000, at(1.002), 1);
  r.completed(2000, at(1.004), 0);  // 1e6 B/s; the path is then empty
  // Idle for 50 ms, then busy again: the next sample starts at the first
  // completion after the gap.
  r.busy(at(1.056));
  r.completed(2000, at(1.056), 2);
  r.completed(2000, at(1.058), 1);
  r.completed(2000, at(1.060), 0);  // 1e6 B/s again, not 4000 B over 56 ms
  EXPECT_DOUBLE_EQ(1e6, r.value());
  // A spell the path emptied mid-sample leaves nothing behind for the next.
  r.busy(at(2.000));
  r.completed(2000, at(2.000), 1);
  r.completed(2000, at(2.001), 0);
  r.busy(at(3.000));
  r.completed(2000, at(3.000), 2);
  r.completed(2000, at(3.002), 1);
  r.completed(2000, at(3.004), 0);
  EXPECT_DOUBLE_EQ(1e6, r.value());
}

TEST(RateEstimate, FreshSamplesAreAveraged) {
  RateEstimate r;
  r.busy(at(0.000));
  r.completed(2000, at(0.000), 4);
  r.completed(2000, at(0.002), 3);
  r.completed(2000, at(0.004), 2);  // 1e6
  r.completed(6000, at(0.006), 1);
  r.completed(6000, at(0.008), 1);  // 3e6: 1e6 + 0.2 * 2e6
  EXPECT_DOUBLE_EQ(1.4e6, r.value());
}

// The estimate that kept a path idle: planned with only while fresh; the
// next sample after that starts a new average.
TEST(RateEstimate, AStaleEstimateIsNotPlannedWithAndIsReplaced) {
  RateEstimate r;
  r.busy(at(0.000));
  r.completed(2000, at(0.000), 2);
  r.completed(2000, at(0.010), 1);
  r.completed(2000, at(0.020), 0);  // two slow chunks: 2e5 B/s
  EXPECT_FALSE(r.stale(at(0.020 + RateEstimate::kStale / 2)));
  // No sample since: the scheduler sees a path not measured yet.
  EXPECT_TRUE(r.stale(at(0.020 + RateEstimate::kStale)));
  EXPECT_DOUBLE_EQ(2e5, r.value()) << "statistics keep the last estimate";
  // Its share again, at its real rate: a new estimate, not 2e5 averaged in.
  r.busy(at(1.000));
  r.completed(20000, at(1.000), 2);
  r.completed(20000, at(1.002), 1);
  r.completed(20000, at(1.004), 0);
  EXPECT_DOUBLE_EQ(1e7, r.value());
  EXPECT_FALSE(r.stale(at(1.004)));
}

TEST(RateEstimate, ResetForgetsEverything) {
  RateEstimate r;
  r.busy(at(0.000));
  r.completed(2000, at(0.000), 2);
  r.completed(2000, at(0.002), 1);
  r.completed(2000, at(0.004), 0);
  ASSERT_GT(r.value(), 0.0);
  r.reset();
  EXPECT_EQ(0.0, r.value());
  EXPECT_FALSE(r.stale(at(1.0))) << "nothing measured is not stale";
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
