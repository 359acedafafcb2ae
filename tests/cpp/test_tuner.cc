// The tuner's choices (which algorithm at which size, and MAESTRO_ALGO
// forcing one), and the small-message allreduce it chooses, recursive
// doubling: ranks as threads over four real loopback paths, results exact
// and the same bits on every rank, groups that are and are not a power of
// two (the fold), every size class, a path closed mid-operation, a missing
// partner.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "collectives/collectives.h"
#include "collectives/tuner.h"
#include "common/config.h"
#include "multipath/engine.h"
#include "collective_world.h"
#include "test_util.h"

namespace maestro {
namespace collectives {
namespace {

using testing::after;
using testing::errorText;
using testing::registered;
using testing::runRanks;
using testing::World;

std::map<std::string, std::string> forced(const std::string& algo) {
  auto opts = testing::smallUnits();
  opts["algo"] = algo;
  return opts;
}

// Every rank of w but `absent` runs op on a tensor of 100 floats (the ops
// time out quickly); what each one's error says ("" for the absent rank).
// A rank failing otherwise than by throwing fails the test.
std::vector<std::string> errorsWithoutRank(World& w, int n, int absent,
                                           const std::function<void(multipath::Engine&, const Window&)>& op) {
  std::vector<std::string> what(n);
  auto errors = runRanks(n, [&](int r) {
    if (r == absent) return;
    auto& e = *w.engines[r];
    std::vector<float> v(100, 1.0f);
    Window win = registered(e, v);
    try {
      op(e, win);
    } catch (const Error& err) {
      what[r] = err.what();
    }
    e.deregisterMemory(win.region);
  });
  for (auto& err : errors) EXPECT_EQ("", errorText(err));
  return what;
}

TuneFacts facts(OpKind kind, uint64_t bytes, int ranks, bool spans = true) {
  TuneFacts f;
  f.kind = kind;
  f.bytes = bytes;
  f.ranks = ranks;
  f.spans_hosts = spans;
  f.transport = "tcp";
  return f;
}

TEST(Tuner, SmallAllreducesGoByRecursiveDoublingLargeOnesByTheRing) {
  for (int n : {2, 3, 4, 8, 64})
    for (bool spans : {false, true}) {
      const uint64_t limit = recursiveDoublingLimit(n, spans, "tcp");
      ASSERT_GT(limit, 0u) << n << " ranks";
      for (uint64_t bytes : {uint64_t(0), uint64_t(4), uint64_t(4096), limit})
        EXPECT_EQ(Algorithm::kRecursiveDoubling, tunedAlgorithm(facts(OpKind::kAllreduce, bytes, n, spans)))
            << bytes << " bytes, " << n << " ranks";
      for (uint64_t bytes : {limit + 1, uint64_t(1) << 20, uint64_t(256) << 20})
        EXPECT_EQ(Algorithm::kRing, tunedAlgorithm(facts(OpKind::kAllreduce, bytes, n, spans)))
            << bytes << " bytes, " << n << " ranks";
    }
  EXPECT_EQ(Algorithm::kDirect, tunedAlgorithm(facts(OpKind::kReduce, kDirectReduceBytes, 4)));
  EXPECT_EQ(Algorithm::kTree, tunedAlgorithm(facts(OpKind::kReduce, kDirectReduceBytes + 1, 4)));
  EXPECT_EQ(Algorithm::kTree, tunedAlgorithm(facts(OpKind::kReduce, kSmallReduceBytes, 4)));
  EXPECT_EQ(Algorithm::kRing, tunedAlgorithm(facts(OpKind::kReduce, kSmallReduceBytes + 1, 4)));
  EXPECT_EQ(Algorithm::kRing, tunedAlgorithm(facts(OpKind::kBroadcast, 4, 4)));
}

TEST(Tuner, MaestroAlgoForcesAnAlgorithmOnTheOperationsThatHaveIt) {
  const auto small = facts(OpKind::kAllreduce, 64, 4), large = facts(OpKind::kAllreduce, 64 << 20, 4);
  const auto small_reduce = facts(OpKind::kReduce, 64, 4);
  Config auto_ = Config::resolve();
  EXPECT_FALSE(choose(auto_, small).forced);
  EXPECT_EQ(Algorithm::kRecursiveDoubling, choose(auto_, small).algorithm);

  Config ring = Config::resolve({{"algo", "ring"}});  // allreduce and reduce both have a ring
  EXPECT_EQ(Algorithm::kRing, choose(ring, small).algorithm);
  EXPECT_TRUE(choose(ring, small).forced);
  EXPECT_EQ(Algorithm::kRing, choose(ring, small_reduce).algorithm);

  Config rd = Config::resolve({{"algo", "recursive_doubling"}});  // allreduce only
  EXPECT_EQ(Algorithm::kRecursiveDoubling, choose(rd, large).algorithm);
  EXPECT_EQ(Algorithm::kDirect, choose(rd, small_reduce).algorithm) << "reduce has no recursive doubling: tuned";
  EXPECT_FALSE(choose(rd, small_reduce).forced);

  Config per_op = Config::resolve({{"algo", " Allreduce:Ring , reduce:direct"}});
  EXPECT_EQ(Algorithm::kRing, choose(per_op, small).algorithm);
  EXPECT_EQ(Algorithm::kDirect, choose(per_op, facts(OpKind::kReduce, 64 << 20, 4)).algorithm);
  for (const auto& k : knobs())
    if (std::string(k.name) == "algo") EXPECT_EQ("allreduce:ring,reduce:direct", k.show(per_op));
}

TEST(Tuner, ABadMaestroAlgoIsRefusedSayingWhatExists) {
  auto refused = [](const std::string& text) {
    try {
      Config::resolve({{"algo", text}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(std::string::npos, refused("butterfly").find("'butterfly' is not an algorithm")) << refused("butterfly");
  EXPECT_NE(std::string::npos, refused("butterfly").find("allreduce: ring, recursive_doubling; reduce: ring, direct, tree"))
      << refused("butterfly");
  EXPECT_NE(std::string::npos, refused("allreduce:tree").find("is not an algorithm of allreduce"))
      << refused("allreduce:tree");
  EXPECT_NE(std::string::npos, refused("reduce:recursive_doubling").find("is not an algorithm of reduce"))
      << refused("reduce:recursive_doubling");
  EXPECT_NE(std::string::npos, refused("broadcast:ring").find("'broadcast' is not an operation"))
      << refused("broadcast:ring");
  EXPECT_NE(std::string::npos, refused("ring,allreduce:recursive_doubling").find("forces two algorithms"))
      << refused("ring,allreduce:recursive_doubling");
}

TEST(Tuner, TheGroupsTableIsDescribed) {
  World w(2, forced("reduce:ring"));
  const std::string text = describeTuner(*w.engines[0]);
  EXPECT_NE(std::string::npos, text.find("MAESTRO_ALGO=reduce:ring")) << text;
  EXPECT_NE(std::string::npos, text.find("allreduce: recursive_doubling up to ")) << text;
  EXPECT_NE(std::string::npos, text.find("reduce: direct up to 16384 bytes, tree up to 65536 bytes, ring above -- forced: ring")) << text;
  EXPECT_NE(std::string::npos, text.find("chunks: 4096 bytes")) << text;
  EXPECT_NE(std::string::npos, text.find("at most 8 chunks of them a path")) << text;
}

// The exchange's window: the knob, else 2 chunks a path across hosts and
// the path window (0) on one host.
TEST(Tuner, TheExchangeHoldsTwoChunksAPathAcrossHosts) {
  World one(2);
  EXPECT_EQ(0, exchangeWindow(*one.engines[0])) << "ranks of one host: the path window";
  setRingSpansHosts(true);
  EXPECT_EQ(kExchangeWindowAcrossHosts, exchangeWindow(*one.engines[0]));
  {
    // Across hosts the exchange goes in the smallest chunks, and says so.
    World cut(2, {{"chunk_size", "16K"}, {"min_chunk_size", "4K"}});
    const std::string text = describeTuner(*cut.engines[0]);
    EXPECT_NE(std::string::npos, text.find("a path, cut into chunks of 4096 bytes to another host")) << text;
  }
  resetRingSpansHosts();
  auto opts = testing::smallUnits();
  opts["exchange_window"] = "3";
  World knob(2, opts);
  EXPECT_EQ(3, exchangeWindow(*knob.engines[0]));
}

// Every rank's result, checked against the reference and against rank 0's
// bits.
class RecursiveDoubling : public ::testing::TestWithParam<int> {};

TEST_P(RecursiveDoubling, EverySizeIsExactAndTheSameBitsOnEveryRank) {
  const int n = GetParam();
  World w(n, forced("recursive_doubling"));
  uint64_t seq = 1;
  // 0, tiny, one chunk, many chunks, many segments (16 KiB segments).
  for (uint64_t count : {0ull, 1ull, 3ull, 1000ull, 12345ull, 100000ull}) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) data[r][i] = static_cast<float>((i * 7 + r * 13) % 1000);
    std::vector<std::vector<float>> noisy(n, std::vector<float>(count));  // not exact in float: order shows
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) noisy[r][i] = 1.0f / static_cast<float>(3 + i % 17 + 5 * r);
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Window a = registered(e, data[r]), b = registered(e, noisy[r]);
      allreduce(e, seq, a, count, DType::kFloat32, ReduceOp::kSum, after(60));
      allreduce(e, seq + 1, b, count, DType::kFloat32, ReduceOp::kAvg, after(60));
      if (a.region.valid()) e.deregisterMemory(a.region);
      if (b.region.valid()) e.deregisterMemory(b.region);
    });
    seq += 2;
    for (auto& err : errors) ASSERT_EQ("", errorText(err)) << count;
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>((i * 7 + q * 13) % 1000);
        ASSERT_EQ(want, data[r][i]) << "rank " << r << " element " << i << " of " << count;
        double mean = 0;
        for (int q = 0; q < n; ++q) mean += 1.0 / (3 + i % 17 + 5 * q);
        ASSERT_NEAR(mean / n, noisy[r][i], 1e-6) << "rank " << r << " element " << i;
      }
      ASSERT_TRUE(count == 0 || std::memcmp(noisy[0].data(), noisy[r].data(), count * sizeof(float)) == 0)
          << "rank " << r << " holds other bits than rank 0 (" << count << " elements)";
    }
  }
}

TEST_P(RecursiveDoubling, EveryOpOnInt64AndSignedZerosAgree) {
  const int n = GetParam();
  World w(n, forced("recursive_doubling"));
  uint64_t seq = 1;
  testing::allreduceEveryOpOnInt64(w, &seq);
  // MIN and MAX of -0 and +0 are equal either way round, yet their bits
  // differ: every rank must still hold the same bits.
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<std::vector<float>> zeros(n, std::vector<float>(64));
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 64; ++i) zeros[r][i] = ((i >> (r % 6)) & 1) ? -0.0f : 0.0f;
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Window win = registered(e, zeros[r]);
      allreduce(e, seq, win, 64, DType::kFloat32, op, after(60));
      e.deregisterMemory(win.region);
    });
    ++seq;
    for (auto& err : errors) ASSERT_EQ("", errorText(err));
    for (int r = 1; r < n; ++r)
      for (int i = 0; i < 64; ++i)
        ASSERT_EQ(std::signbit(zeros[0][i]), std::signbit(zeros[r][i])) << reduceOpName(op) << " rank " << r << " i " << i;
  }
}

// The tuner picks recursive doubling for small tensors and the ring for the
// rest; a sequence that alternates between them reuses tags and scratch.
TEST_P(RecursiveDoubling, TheTunersChoicesAlternateExactly) {
  const int n = GetParam();
  World w(n);  // defaults: the tuner chooses
  const uint64_t limit = recursiveDoublingLimit(n, ringSpansHosts(*w.engines[0]), w.engines[0]->transportName());
  const uint64_t small = limit / 4, large = limit / 4 + 1;  // floats: the largest below the limit, the smallest above
  ASSERT_EQ(Algorithm::kRecursiveDoubling, choose(*w.engines[0], OpKind::kAllreduce, small * 4).algorithm);
  ASSERT_EQ(Algorithm::kRing, choose(*w.engines[0], OpKind::kAllreduce, large * 4).algorithm);
  uint64_t seq = 1;
  for (int round = 0; round < 6; ++round) {
    const uint64_t count = round % 2 ? large : small;
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) data[r][i] = static_cast<float>((i * 3 + r * 5 + round) % 777);
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Window win = registered(e, data[r]);
      allreduce(e, seq, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
      e.deregisterMemory(win.region);
    });
    ++seq;
    for (auto& err : errors) ASSERT_EQ("", errorText(err));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>((i * 3 + q * 5 + round) % 777);
        ASSERT_EQ(want, data[r][i]) << "round " << round << " rank " << r << " element " << i;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RecursiveDoubling, ::testing::Values(2, 3, 4, 5, 6, 7, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

// A partner that never enters the operation: the others time out naming it
// (a rank folded in waits for its pair, the pair for it).
TEST(RecursiveDoublingTimeout, AMissingPartnerIsNamed) {
  World w(3, forced("recursive_doubling"));
  // rank 2 is folded into rank 0
  auto what = errorsWithoutRank(w, 3, 2, [](multipath::Engine& e, const Window& win) {
    allreduce(e, 1, win, 100, DType::kFloat32, ReduceOp::kSum, after(1));
  });
  EXPECT_NE(std::string::npos, what[0].find("rank 2 to start the same collective")) << what[0];
  EXPECT_NE(std::string::npos, what[0].find("by recursive_doubling")) << what[0];
  EXPECT_NE(std::string::npos, what[1].find("timed out")) << what[1];
}

// A path closed while the exchanges run: its chunks go again on the
// others, nothing is lost, every result exact (testing::allreducesWhileAPathCloses).
TEST(RecursiveDoublingFailover, APathClosedMidOperationLosesNothing) {
  const int n = 4, ops = 300, paths = 4;
  World w(n, {{"chunk_size", "4K"}, {"segment_size", "16K"}, {"paths", "4"}, {"algo", "recursive_doubling"}});
  const uint64_t count = 6000;  // 24000 bytes: 6 chunks a message
  testing::allreducesWhileAPathCloses(w, ops, paths, count);
}

// The binomial tree reduce, forced: every root, every size class, the root
// holding the sum and every other rank's tensor unchanged.
class TreeReduce : public ::testing::TestWithParam<int> {};

TEST_P(TreeReduce, EveryRootAndSizeIsExactAndOnlyTheRootChanges) {
  const int n = GetParam();
  World w(n, forced("reduce:tree"));
  uint64_t seq = 1;
  for (int root : {0, n - 1, n / 2})
    for (uint64_t count : {0ull, 1ull, 1000ull, 12345ull, 100000ull}) {
      auto value = [&](int r, uint64_t i) { return static_cast<float>((i * 7 + r * 13 + root) % 1000); };
      std::vector<std::vector<float>> data(n, std::vector<float>(count));
      for (int r = 0; r < n; ++r)
        for (uint64_t i = 0; i < count; ++i) data[r][i] = value(r, i);
      auto errors = runRanks(n, [&](int r) {
        auto& e = *w.engines[r];
        Window win = registered(e, data[r]);
        reduce(e, seq, win, count, DType::kFloat32, ReduceOp::kSum, root, after(60));
        if (win.region.valid()) e.deregisterMemory(win.region);
      });
      ++seq;
      for (auto& err : errors) ASSERT_EQ("", errorText(err)) << "root " << root << ", " << count << " elements";
      for (int r = 0; r < n; ++r)
        for (uint64_t i = 0; i < count; ++i) {
          float want = value(r, i);
          if (r == root) {
            want = 0;
            for (int q = 0; q < n; ++q) want += value(q, i);
          }
          ASSERT_EQ(want, data[r][i]) << "root " << root << " rank " << r << " element " << i << " of " << count;
        }
    }
}

TEST_P(TreeReduce, EveryOpOnInt64) {
  World w(GetParam(), forced("reduce:tree"));
  uint64_t seq = 1;
  testing::allreduceEveryOpOnInt64(w, &seq, GetParam() - 1);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TreeReduce, ::testing::Values(2, 3, 5, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

// A child that never enters the operation: its parent times out naming it,
// and so does its own child (rank 3, which would send to it).
TEST(TreeReduceTimeout, AMissingChildIsNamed) {
  World w(4, forced("reduce:tree"));
  // root 0's children are 1 and 2; 3 sends to 2
  auto what = errorsWithoutRank(w, 4, 2, [](multipath::Engine& e, const Window& win) {
    reduce(e, 1, win, 100, DType::kFloat32, ReduceOp::kSum, 0, after(1));
  });
  EXPECT_NE(std::string::npos, what[0].find("rank 2 to start the same collective")) << what[0];
  EXPECT_NE(std::string::npos, what[0].find("by tree")) << what[0];
  EXPECT_NE(std::string::npos, what[3].find("rank 2")) << what[3];
}

// A path closed while the tree runs: its chunks go again on the others,
// nothing is lost, the root's every result exact.
TEST(TreeReduceFailover, APathClosedMidOperationLosesNothing) {
  const int n = 4, ops = 300, paths = 4;
  World w(n, {{"chunk_size", "4K"}, {"segment_size", "16K"}, {"paths", "4"}, {"algo", "reduce:tree"}});
  testing::allreducesWhileAPathCloses(w, ops, paths, 6000, 0);
}

}  // namespace
}  // namespace collectives
}  // namespace maestro
