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

// paths=auto: one path per vNIC unless some rank's route survey saw more
// core hops than that; then one per hop, up to kAutoPathsMax. The largest
// count decides (a rank whose ring neighbour shares its leaf sees none).
TEST(AutoPaths, OnePerVnicUnlessTheRoutersSpreadOverMoreSpines) {
  PathCount c = autoPathCount(4, {});
  EXPECT_EQ(4, c.paths);
  EXPECT_EQ("auto: one per vNIC", c.why);
  c = autoPathCount(4, {0, 4, 0, 3});
  EXPECT_EQ(4, c.paths);
  EXPECT_NE(std::string::npos, c.why.find("found 4 core hops")) << c.why;
  c = autoPathCount(4, {0, 8, 0, 7});
  EXPECT_EQ(8, c.paths);
  EXPECT_NE(std::string::npos, c.why.find("8 core hops")) << c.why;
  EXPECT_NE(std::string::npos, c.why.find("up to 2 flows per vNIC")) << c.why;
  c = autoPathCount(3, {16});
  EXPECT_EQ(16, c.paths);
  EXPECT_NE(std::string::npos, c.why.find("up to 6 flows per vNIC")) << c.why;
  c = autoPathCount(4, {40, 64});
  EXPECT_EQ(kAutoPathsMax, c.paths);
  EXPECT_NE(std::string::npos, c.why.find("(at most 16)")) << c.why;
  // More vNICs than the cap: never fewer paths than vNICs.
  EXPECT_EQ(20, autoPathCount(20, {32}).paths);
}

// The survey stops when no router answered, when a round found nothing
// new, or at its probe budget -- and goes on otherwise.
TEST(AutoPaths, TheSurveyStopsWhenARoundFindsNothingNew) {
  EXPECT_TRUE(surveyDone(4, 0, 0));        // no router answered
  EXPECT_FALSE(surveyDone(4, 3, 3));       // the first round found some
  EXPECT_FALSE(surveyDone(12, 6, 3));      // still finding
  EXPECT_TRUE(surveyDone(28, 6, 0));       // saturated
  EXPECT_TRUE(surveyDone(kSurveyProbes, 14, 2));  // budget spent
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
