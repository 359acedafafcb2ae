// Load-balancer policies against reference schedules, without a network
// (the aws-ofi-nccl way): given path states, the expected assignment.
#include <gtest/gtest.h>

#include "multipath/scheduler.h"

namespace maestro {
namespace multipath {
namespace {

std::unique_ptr<Scheduler> make(const std::string& policy, std::map<std::string, std::string> extra = {}) {
  extra["policy"] = policy;
  return makeScheduler(Config::resolve(extra));
}

std::vector<int> schedule(Scheduler& s, const std::vector<PathView>& v, int n, uint64_t bytes = 1 << 20) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(s.assign(v, bytes));
  return out;
}

TEST(Scheduler, RoundRobinSkipsDownPaths) {
  auto s = make("round_robin");
  std::vector<PathView> v(4);
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 0, 1}), schedule(*s, v, 6));
  v[1].up = false;
  v[3].up = false;
  EXPECT_EQ((std::vector<int>{2, 0, 2, 0}), schedule(*s, v, 4));
  for (auto& p : v) p.up = false;
  EXPECT_EQ(kNoPath, s->assign(v, 1));
}

TEST(Scheduler, SingleUsesTheFirstLivePath) {
  auto s = make("single");
  std::vector<PathView> v(3);
  EXPECT_EQ((std::vector<int>{0, 0, 0}), schedule(*s, v, 3));
  v[0].up = false;
  EXPECT_EQ((std::vector<int>{1, 1}), schedule(*s, v, 2));
}

TEST(Scheduler, WeightedFollowsConfiguredWeights) {
  auto s = make("weighted", {{"weights", "3,1,0,2"}});
  std::vector<PathView> v(4);
  std::vector<int> counts(4, 0);
  for (int p : schedule(*s, v, 600)) counts[p]++;
  EXPECT_EQ((std::vector<int>{300, 100, 0, 200}), counts);
  // Smooth: the heavy path is never used more than its share in a row.
  auto first = schedule(*make("weighted", {{"weights", "3,1,0,2"}}), v, 6);
  EXPECT_EQ((std::vector<int>{0, 3, 0, 1, 3, 0}), first);
}

TEST(Scheduler, WeightedFollowsMeasuredThroughputWithoutWeights) {
  auto s = make("weighted");
  std::vector<PathView> v(3);
  v[0].throughput = 100e6;
  v[1].throughput = 50e6;
  v[2].throughput = 0;  // not measured yet: counts as the mean (75e6)
  std::vector<int> counts(3, 0);
  for (int p : schedule(*s, v, 900)) counts[p]++;
  EXPECT_EQ((std::vector<int>{400, 200, 300}), counts);
  v[0].up = false;
  counts.assign(3, 0);
  for (int p : schedule(*s, v, 500)) counts[p]++;
  EXPECT_EQ(0, counts[0]);
}

TEST(Scheduler, AdaptiveLetsTheFirstFreePathPull) {
  auto s = make("adaptive");
  std::vector<PathView> v(4);
  EXPECT_TRUE(s->pulls());
  EXPECT_EQ(kAnyPath, s->assign(v, 1 << 20));
  for (auto& p : v) p.up = false;
  EXPECT_EQ(kNoPath, s->assign(v, 1 << 20));
}

TEST(Scheduler, LatencyPinsSmallMessagesToTheLowestRtt) {
  auto s = make("latency", {{"small_msg", "16K"}});
  std::vector<PathView> v(4);
  v[0].rtt = 0.004;
  v[1].rtt = 0.001;
  v[2].rtt = 0.0005;
  v[3].rtt = 0;  // unmeasured: never preferred over a measured one
  EXPECT_EQ(2, s->assign(v, 100));
  EXPECT_EQ(2, s->assign(v, 16 * 1024));
  EXPECT_EQ(kAnyPath, s->assign(v, 16 * 1024 + 1));  // large: spread
  v[2].up = false;
  EXPECT_EQ(1, s->assign(v, 100));
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
