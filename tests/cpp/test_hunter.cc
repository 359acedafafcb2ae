// Path hunting's decisions against reference sequences of monitor ticks,
// without a network: which path is re-opened when, and never too often.
#include <gtest/gtest.h>

#include "multipath/hunter.h"

namespace maestro {
namespace multipath {
namespace {

Hunter make(std::map<std::string, std::string> knobs = {}) {
  knobs.emplace("hunt", "on");
  return Hunter(Config::resolve(knobs));
}

std::vector<HuntSample> rates(const std::vector<double>& mbps) {
  std::vector<HuntSample> v;
  for (double r : mbps) v.push_back({true, true, r * 1e6});
  return v;
}

// Runs `ticks` monitor ticks of `dt` seconds over the same samples; returns
// (tick, path) of every re-opening decided.
std::vector<std::pair<int, int>> run(const Hunter& h, const std::vector<HuntSample>& s, std::vector<HuntState>& st,
                                     int ticks, double dt = 0.5, Clock::time_point start = Clock::now()) {
  std::vector<std::pair<int, int>> out;
  for (int t = 0; t < ticks; ++t) {
    auto now = start + std::chrono::milliseconds(static_cast<int>(t * dt * 1000));
    for (int i : h.tick(s, st, dt, now)) out.emplace_back(t, i);
  }
  return out;
}

TEST(Hunter, OnWhereDiscoveryRunsUnlessSaidOtherwise) {
  EXPECT_FALSE(Hunter(Config::resolve({})).enabled());
  EXPECT_TRUE(Hunter(Config::resolve({{"discovery", "ttl"}})).enabled());
  EXPECT_FALSE(Hunter(Config::resolve({{"discovery", "ttl"}, {"hunt", "off"}})).enabled());
  EXPECT_TRUE(make().enabled());
  Hunter off = Hunter(Config::resolve({{"hunt", "off"}}));
  std::vector<HuntState> st(4);
  EXPECT_TRUE(run(off, rates({25, 25, 5, 25}), st, 100).empty());
}

TEST(Hunter, ASlowPathIsReopenedAfterHuntAfterSecondsOfBusyTime) {
  Hunter h = make();  // ratio 0.6, after 3 s, interval 10 s
  std::vector<HuntState> st(4);
  // Path 2 at a fifth of its siblings: slow from the first tick; 3 s of
  // 0.5 s ticks = the 6th tick (index 5).
  auto got = run(h, rates({25, 25, 5, 25}), st, 8);
  ASSERT_EQ(1u, got.size());
  EXPECT_EQ(5, got[0].first);
  EXPECT_EQ(2, got[0].second);
  EXPECT_EQ(1, st[2].streak);
}

TEST(Hunter, PathsNearTheirSiblingsAreLeftAlone) {
  Hunter h = make();
  std::vector<HuntState> st(4);
  // 0.7 of the median is above the 0.6 threshold: unequal, not hot.
  EXPECT_TRUE(run(h, rates({25, 25, 17.5, 25}), st, 100).empty());
  // Every path equally slow: nothing to hunt for (no sibling is faster).
  EXPECT_TRUE(run(h, rates({5, 5, 5, 5}), st, 100).empty());
}

TEST(Hunter, IdleOrUnusablePathsAreNotJudged) {
  Hunter h = make();
  std::vector<HuntState> st(4);
  auto s = rates({25, 25, 5, 25});
  s[2].busy = false;  // between operations: its sample is stale
  EXPECT_TRUE(run(h, s, st, 100).empty());
  s[2].busy = true;
  s[2].usable = false;  // down, in doubt or being re-opened
  EXPECT_TRUE(run(h, s, st, 100).empty());
  s = rates({25, 25, 5, 25});
  for (int i : {0, 1, 3}) s[i].busy = false;  // no busy sibling to compare with
  EXPECT_TRUE(run(h, s, st, 100).empty());
}

TEST(Hunter, SlownessMustOutweighFineTime) {
  Hunter h = make();
  std::vector<HuntState> st(2);
  auto slow = rates({25, 5}), fine = rates({25, 25});
  auto start = Clock::now();
  // Slow as often as fine (1.5 s each, in turn): never 3 s ahead.
  for (int round = 0; round < 20; ++round) {
    EXPECT_TRUE(run(h, slow, st, 3, 0.5, start).empty());
    EXPECT_TRUE(run(h, fine, st, 3, 0.5, start).empty());
  }
  // Slow five looks in six (a loaded path whose rate swings around the
  // threshold): 2 s ahead per round, so re-opened in the second round,
  // where one fine look in a row would have restarted the count for ever.
  st.assign(2, HuntState{});
  std::vector<std::pair<int, int>> got;
  for (int round = 0; round < 3 && got.empty(); ++round) {
    got = run(h, slow, st, 5, 0.5, start);
    if (got.empty()) EXPECT_TRUE(run(h, fine, st, 1, 0.5, start).empty());
    else EXPECT_EQ(1, round);
  }
  ASSERT_EQ(1u, got.size());
  EXPECT_EQ(1, got[0].second);
}

TEST(Hunter, RepeatedHuntsBackOffAndNeverFlap) {
  Hunter h = make({{"hunt_after", "1"}, {"hunt_interval", "10"}});
  std::vector<HuntState> st(4);
  // A path that stays slow whatever route it gets: re-opened after 1 s,
  // then at most every 10, 20, 40, 80, 160, 160... s.
  auto got = run(h, rates({25, 25, 5, 25}), st, 2 * 600, 0.5);  // 600 s
  std::vector<double> at;
  for (auto& g : got) at.push_back(g.first * 0.5);
  ASSERT_GE(at.size(), 5u);
  EXPECT_LE(at.size(), 7u);
  for (size_t i = 1; i < at.size(); ++i)
    EXPECT_GE(at[i] - at[i - 1], std::min(160.0, 10.0 * (1 << (i - 1)))) << "hunt " << i;
}

TEST(Hunter, AStreakEndsOnceThePathIsFineForAnInterval) {
  Hunter h = make({{"hunt_after", "1"}, {"hunt_interval", "10"}});
  std::vector<HuntState> st(2);
  auto start = Clock::now();
  auto slow = rates({25, 5}), fine = rates({25, 25});
  EXPECT_EQ(1u, run(h, slow, st, 4, 0.5, start).size());  // re-opened at 1 s
  EXPECT_EQ(1, st[1].streak);
  run(h, fine, st, 2 * 11, 0.5, start + std::chrono::seconds(2));  // fine for 11 s
  EXPECT_EQ(0, st[1].streak);
  // A new hot spell is answered after hunt_after again, not after a back-off.
  auto got = run(h, slow, st, 4, 0.5, start + std::chrono::seconds(14));
  ASSERT_EQ(1u, got.size());
  EXPECT_EQ(1, got[0].first);  // 1 s of 0.5 s ticks
}

TEST(Hunter, PickRouteAvoidsTheOtherPathsHops) {
  EXPECT_EQ(2, pickRoute({"10.0.0.1", "", "10.0.0.3", "10.0.0.4"}, {"10.0.0.1", "10.0.0.2"}));
  EXPECT_EQ(-1, pickRoute({"10.0.0.1", "", "10.0.0.1"}, {"10.0.0.1"}));
  EXPECT_EQ(-1, pickRoute({}, {}));
  EXPECT_EQ(0, pickRoute({"a"}, {}));
}

TEST(Hunter, KnobsAreValidated) {
  EXPECT_THROW(Config::resolve({{"hunt", "sometimes"}}), Error);
  EXPECT_THROW(Config::resolve({{"hunt_ratio", "1.5"}}), Error);
  EXPECT_THROW(Config::resolve({{"hunt_ratio", "x"}}), Error);
  EXPECT_THROW(Config::resolve({{"hunt_after", "0"}}), Error);
  EXPECT_THROW(Config::resolve({{"hunt_interval", "-1"}}), Error);
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
