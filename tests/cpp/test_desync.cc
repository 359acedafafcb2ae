// collectives/desync.h: naming the ranks that were not in an operation that
// timed out, from the marks in the group's store (ranks as threads).
#include <gtest/gtest.h>

#include <thread>

#include "collectives/desync.h"
#include "common/error.h"
#include "test_util.h"

namespace maestro {
namespace testing {
namespace {

using collectives::describeAbsent;
using collectives::ranksAbsentFrom;

std::vector<std::optional<std::vector<int>>> timeOut(MemoryRendezvous& store, const std::vector<int>& ranks,
                                                     int size, Clock::duration wait) {
  std::vector<std::optional<std::vector<int>>> out(size);
  std::vector<std::thread> threads;
  for (int r : ranks)
    threads.emplace_back([&, r] { out[r] = ranksAbsentFrom(store, 9, r, size, wait); });
  for (auto& t : threads) t.join();
  return out;
}

TEST(Desync, TheRankThatNeverEnteredIsNamedOnEveryOther) {
  MemoryRendezvous store;
  const auto start = Clock::now();
  const auto out = timeOut(store, {0, 1, 3}, 4, std::chrono::milliseconds(300));
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(out[r].has_value()) << r;
    EXPECT_EQ(std::vector<int>{2}, *out[r]) << r;
  }
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300)) << "it must wait for the absent rank's mark";
}

TEST(Desync, WhenEveryRankTimedOutNoneIsNamedAndNobodyWaitsOut) {
  MemoryRendezvous store;
  const auto start = Clock::now();
  const auto out = timeOut(store, {0, 1, 2}, 3, std::chrono::seconds(30));
  for (int r : {0, 1, 2}) {
    ASSERT_TRUE(out[r].has_value()) << r;
    EXPECT_TRUE(out[r]->empty()) << r;
  }
  // Liveness bound: every mark is there within milliseconds, far below the wait.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

TEST(Desync, AnotherOperationsMarksDoNotCount) {
  MemoryRendezvous store;
  store.set("maestro/timed_out/8/1", "1");  // rank 1 timed out in the operation before
  const auto absent = ranksAbsentFrom(store, 9, 0, 2, std::chrono::milliseconds(100));
  ASSERT_TRUE(absent.has_value());
  EXPECT_EQ(std::vector<int>{1}, *absent);
}

class GoneRendezvous : public MemoryRendezvous {
 public:
  void set(const std::string&, const std::string&) override { fail("store: connection reset"); }
};

TEST(Desync, AStoreThatIsGoneTellsNothing) {
  GoneRendezvous store;
  const auto absent = ranksAbsentFrom(store, 9, 0, 4, std::chrono::milliseconds(100));
  EXPECT_FALSE(absent.has_value());
  EXPECT_NE(std::string::npos, describeAbsent(absent, 4, "allreduce #9", std::chrono::seconds(2)).find("could not"));
}

TEST(Desync, TheSentenceNamesTheRanks) {
  const auto two = std::chrono::seconds(2);
  EXPECT_EQ("rank 2 did not enter allreduce #9 (it skipped it, is stuck before it, or entered it over 2 s after "
            "the ranks that timed out in it)",
            describeAbsent(std::vector<int>{2}, 4, "allreduce #9", two));
  EXPECT_EQ(0u, describeAbsent(std::vector<int>{1, 2, 5}, 8, "barrier #3", two).find("ranks 1, 2 and 5 did not enter"));
  EXPECT_EQ("all 4 ranks entered allreduce #9 and timed out in it: the data stopped moving between them",
            describeAbsent(std::vector<int>{}, 4, "allreduce #9", two));
}

}  // namespace
}  // namespace testing
}  // namespace maestro
