// Disjoint path selection against reference cases (no network).
#include <gtest/gtest.h>

#include "multipath/discovery.h"

namespace maestro {
namespace multipath {
namespace {

std::vector<Candidate> hops(const std::vector<std::pair<const char*, const char*>>& v) {
  std::vector<Candidate> out;
  for (auto& p : v) out.push_back({p.first, p.second});
  return out;
}

TEST(Discovery, PicksOneCandidatePerDistinctHop) {
  // Forward hops of 8 candidates: s0 s0 s1 s0 s2 s1 s3 s2 -> one per spine.
  auto c = hops({{"s0", ""}, {"s0", ""}, {"s1", ""}, {"s0", ""}, {"s2", ""}, {"s1", ""}, {"s3", ""}, {"s2", ""}});
  Selection s = selectDisjoint(c, 4, true, false);
  EXPECT_EQ((std::vector<int>{0, 2, 4, 6}), s.chosen);
  EXPECT_EQ(4, s.distinct_forward);
  EXPECT_TRUE(fullyDisjoint(s, 4, true, false));
}

TEST(Discovery, TheDataDirectionWins) {
  // Candidate 1 is new backward only, candidate 2 new forward only: with
  // data flowing forward, 2 is taken first.
  auto c = hops({{"a", "x"}, {"a", "y"}, {"b", "x"}});
  Selection s = selectDisjoint(c, 2, true, false);
  EXPECT_EQ((std::vector<int>{0, 2}), s.chosen);
  s = selectDisjoint(c, 2, false, true);
  EXPECT_EQ((std::vector<int>{0, 1}), s.chosen);
}

TEST(Discovery, BothDirectionsWhenBothCarryData) {
  auto c = hops({{"a", "x"}, {"a", "y"}, {"b", "x"}, {"b", "y"}, {"c", "z"}});
  Selection s = selectDisjoint(c, 3, true, true);
  EXPECT_EQ((std::vector<int>{0, 3, 4}), s.chosen);
  EXPECT_EQ(3, s.distinct_forward);
  EXPECT_EQ(3, s.distinct_backward);
}

TEST(Discovery, UnknownHopsFillTheRemainingSlots) {
  auto c = hops({{"", ""}, {"s1", ""}, {"", ""}, {"s1", ""}});
  Selection s = selectDisjoint(c, 3, true, false);
  EXPECT_EQ((std::vector<int>{1, 0, 2}), s.chosen);
  EXPECT_EQ(1, s.distinct_forward);
  EXPECT_FALSE(fullyDisjoint(s, 3, true, false));
}

TEST(Discovery, FewerCandidatesThanWanted) {
  auto c = hops({{"s0", ""}, {"s1", ""}});
  Selection s = selectDisjoint(c, 4, true, false);
  EXPECT_EQ(2u, s.chosen.size());
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
