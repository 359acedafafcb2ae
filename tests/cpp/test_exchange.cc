// Reduce, gather, scatter and all-to-all over the multipath engine, ranks as
// threads over four loopback paths: every root, every reduce op, sizes that
// leave blocks empty or uneven and span many chunks and messages, uneven
// all-to-all splits (some empty) read from and written to offsets inside one
// buffer; ranks that disagree (sizes, splits, root, collective) fail on
// every rank with a message naming the disagreement, fast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collective_world.h"

namespace maestro {
namespace collectives {
namespace {

using testing::after;
using testing::errorText;
using testing::registered;
using testing::runRanks;
using testing::World;

int64_t value(int rank, uint64_t i) { return static_cast<int64_t>((i * 31 + rank * 17) % 97) - 40; }

class Exchange : public ::testing::TestWithParam<int> {};

TEST_P(Exchange, ReduceEveryOpToEveryRoot) {
  const int n = GetParam();
  World w(n);
  uint64_t seq = 1;
  for (uint64_t count : {0ull, 1ull, 1001ull, 70001ull})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct})
      for (int root = 0; root < n; ++root, ++seq) {
        std::vector<std::vector<int64_t>> data(n, std::vector<int64_t>(count));
        for (int r = 0; r < n; ++r)
          for (uint64_t i = 0; i < count; ++i) data[r][i] = op == ReduceOp::kProduct ? 1 + (i + r) % 2 : value(r, i);
        auto before = data;
        auto errors = runRanks(n, [&](int r) {
          auto& e = *w.engines[r];
          Window win = registered(e, data[r]);
          reduce(e, seq, win, count, DType::kInt64, op, root, after(60));
          if (win.region.valid()) e.deregisterMemory(win.region);
        });
        for (auto& err : errors) ASSERT_EQ("", errorText(err));
        for (uint64_t i = 0; i < count; ++i) {
          int64_t acc = before[0][i];
          for (int q = 1; q < n; ++q) {
            int64_t v = before[q][i];
            if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
            if (op == ReduceOp::kMin) acc = std::min(acc, v);
            if (op == ReduceOp::kMax) acc = std::max(acc, v);
            if (op == ReduceOp::kProduct) acc *= v;
          }
          if (op == ReduceOp::kAvg) acc /= n;
          ASSERT_EQ(acc, data[root][i]) << reduceOpName(op) << " root " << root << " i " << i << " of " << count;
        }
        for (int r = 0; r < n; ++r)
          if (r != root) ASSERT_EQ(before[r], data[r]) << "reduce modified non-root rank " << r;
      }
}

TEST_P(Exchange, GatherAndScatterFromEveryRoot) {
  const int n = GetParam();
  World w(n);
  uint64_t seq = 1;
  for (uint64_t count : {0ull, 1ull, 3333ull, 50001ull})
    for (int root = 0; root < n; ++root, seq += 2) {
      std::vector<std::vector<float>> in(n, std::vector<float>(count));
      std::vector<std::vector<std::vector<float>>> blocks(n, std::vector<std::vector<float>>(n, std::vector<float>(count, -1)));
      std::vector<std::vector<float>> out(n, std::vector<float>(count, -1));
      for (int r = 0; r < n; ++r)
        for (uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<float>(value(r, i));
      for (int q = 0; q < n; ++q)  // the root's scatter inputs
        for (uint64_t i = 0; i < count; ++i) blocks[root][q][i] = static_cast<float>(value(q + 100, i));
      auto errors = runRanks(n, [&](int r) {
        auto& e = *w.engines[r];
        Window input = registered(e, in[r]), output = registered(e, out[r]);
        std::vector<Window> gathered;  // the root's, one per rank
        if (r == root)
          for (int q = 0; q < n; ++q) gathered.push_back(registered(e, blocks[r][q]));
        gather(e, seq, input, gathered, count, DType::kFloat32, root, after(60));
        // Scatter what was there before the gather: the root reloads it.
        if (r == root)
          for (int q = 0; q < n; ++q)
            for (uint64_t i = 0; i < count; ++i) {
              ASSERT_EQ(static_cast<float>(value(q, i)), blocks[r][q][i]) << "gather root " << root << " block " << q;
              blocks[r][q][i] = static_cast<float>(value(q + 100, i));
            }
        scatter(e, seq + 1, gathered, output, count, DType::kFloat32, root, after(60));
        for (const Window& g : gathered)
          if (g.region.valid()) e.deregisterMemory(g.region);
        for (const Window& x : {input, output})
          if (x.region.valid()) e.deregisterMemory(x.region);
      });
      for (auto& err : errors) ASSERT_EQ("", errorText(err));
      for (int r = 0; r < n; ++r)
        for (uint64_t i = 0; i < count; ++i)
          ASSERT_EQ(static_cast<float>(value(r + 100, i)), out[r][i]) << "scatter root " << root << " rank " << r;
    }
}

// The reduced blocks stop at the root: a reduce moves about 3/4 of an
// allreduce's bytes ((n-1) tensors in the reduce-scatter, (n-1)/2 in the
// gather along the ring, against 2(n-1)).
TEST_P(Exchange, ReduceSendsLessThanAllreduce) {
  const int n = GetParam();
  World w(n);
  const uint64_t count = 1 << 20;
  auto bytesSent = [&]() {
    uint64_t total = 0;
    for (auto& e : w.engines)
      for (const auto& p : e->pathStats()) total += p.bytes_sent;
    return total;
  };
  auto run = [&](uint64_t seq, bool all) {
    const uint64_t before = bytesSent();
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      std::vector<float> t(count, 1.0f);
      Window win = registered(e, t);
      if (all) allreduce(e, seq, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
      else reduce(e, seq, win, count, DType::kFloat32, ReduceOp::kSum, n - 1, after(60));
      e.deregisterMemory(win.region);
    });
    for (auto& err : errors) EXPECT_EQ("", errorText(err));
    return bytesSent() - before;
  };
  const uint64_t allreduced = run(1, true), reduced = run(2, false);
  EXPECT_GT(allreduced, 2 * (n - 1) * count * 4 * 95 / 100) << "the allreduce's own bytes";
  EXPECT_LT(reduced, allreduced * 8 / 10) << "reduce " << reduced << " bytes, allreduce " << allreduced;
}

// Rank p sends split(p, q) elements to rank q: uneven, some empty, read from
// and written to offsets inside one buffer per rank.
void alltoallWithUnevenSplits(int n, std::map<std::string, std::string> opts) {
  World w(n, opts);
  for (uint64_t scale : {0ull, 1ull, 7ull, 5003ull}) {
    auto split = [&](int p, int q) -> uint64_t { return ((p * 7 + q * 3) % 4) * scale; };
    std::vector<std::vector<int32_t>> in(n), out(n);
    std::vector<std::vector<uint64_t>> in_off(n, std::vector<uint64_t>(n + 1)), out_off(n, std::vector<uint64_t>(n + 1));
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        in_off[r][q + 1] = in_off[r][q] + split(r, q);
        out_off[r][q + 1] = out_off[r][q] + split(q, r);
      }
      in[r].resize(in_off[r][n]);
      out[r].assign(out_off[r][n], -1);
      for (int q = 0; q < n; ++q)
        for (uint64_t i = 0; i < split(r, q); ++i) in[r][in_off[r][q] + i] = r * 1000000 + q * 10000 + static_cast<int>(i % 9999);
    }
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Window input = registered(e, in[r]), output = registered(e, out[r]);
      std::vector<Window> ins, outs;
      std::vector<uint64_t> sends, recvs;
      for (int q = 0; q < n; ++q) {
        ins.push_back(Window{input.region, in_off[r][q] * 4});
        outs.push_back(Window{output.region, out_off[r][q] * 4});
        sends.push_back(split(r, q));
        recvs.push_back(split(q, r));
      }
      alltoall(e, scale + 1, ins, sends, outs, recvs, DType::kInt32, after(60));
      for (const Window& x : {input, output})
        if (x.region.valid()) e.deregisterMemory(x.region);
    });
    for (auto& err : errors) ASSERT_EQ("", errorText(err));
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        for (uint64_t i = 0; i < split(q, r); ++i)
          ASSERT_EQ(q * 1000000 + r * 10000 + static_cast<int>(i % 9999), out[r][out_off[r][q] + i])
              << "rank " << r << " from " << q << " element " << i << " scale " << scale;
  }
}

// Every step in flight at once (the default), and one at a time: each step
// starts only when the one before it has been written.
TEST_P(Exchange, AlltoallWithUnevenSplits) { alltoallWithUnevenSplits(GetParam(), testing::smallUnits()); }

TEST_P(Exchange, AlltoallWithUnevenSplitsOneStepAtATime) {
  auto opts = testing::smallUnits();
  opts["alltoall_window"] = "1";
  alltoallWithUnevenSplits(GetParam(), opts);
}

// A path holding one chunk of the exchange at a time (across hosts the
// tuner holds 2; here the ranks share a host): every chunk placed as a
// completion comes back, every block exact.
TEST_P(Exchange, AlltoallWithUnevenSplitsOneChunkAPath) {
  auto opts = testing::smallUnits();
  opts["exchange_window"] = "1";
  alltoallWithUnevenSplits(GetParam(), opts);
}

// What each rank runs in a disagreement test: rank 1 differs.
void expectEveryRankFails(int n, const std::function<void(multipath::Engine&, int)>& op, const std::string& want) {
  World w(n);
  auto t0 = Clock::now();
  auto errors = runRanks(n, [&](int r) { op(*w.engines[r], r); });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0) << "an error, not the timeout";
  for (int r = 0; r < n; ++r) {
    std::string msg = errorText(errors[r]);
    EXPECT_NE(std::string::npos, msg.find(want)) << "rank " << r << ": " << msg;
  }
}

TEST_P(Exchange, SplitsThatDisagreeFailOnEveryRank) {
  const int n = GetParam();
  expectEveryRankFails(n, [n](multipath::Engine& e, int r) {
    std::vector<int32_t> in(100 * n), out(100 * n);
    Window input = registered(e, in), output = registered(e, out);
    std::vector<Window> ins, outs;
    for (int q = 0; q < n; ++q) {
      ins.push_back(Window{input.region, q * 400ull});
      outs.push_back(Window{output.region, q * 400ull});
    }
    std::vector<uint64_t> sends(n, 100), recvs(n, 100);
    if (r == 1) sends[0] = 99;  // rank 0 expects 100
    alltoall(e, 1, ins, sends, outs, recvs, DType::kInt32, after(60));
  }, "disagree on what they exchange");
}

TEST_P(Exchange, GatherSizesThatDisagreeFailOnEveryRank) {
  const int n = GetParam();
  expectEveryRankFails(n, [n](multipath::Engine& e, int r) {
    std::vector<float> in(100);
    std::vector<std::vector<float>> outs(n, std::vector<float>(100));
    std::vector<Window> windows;
    if (r == 0)
      for (auto& o : outs) windows.push_back(registered(e, o));
    gather(e, 1, registered(e, in), windows, r == 1 ? 99 : 100, DType::kFloat32, 0, after(60));
  }, "different tensors");
}

TEST_P(Exchange, RootsThatDisagreeFailOnEveryRank) {
  const int n = GetParam();
  expectEveryRankFails(n, [](multipath::Engine& e, int r) {
    std::vector<float> t(1000, 1.0f);
    reduce(e, 1, registered(e, t), t.size(), DType::kFloat32, ReduceOp::kSum, r == 1 ? 1 : 0, after(60));
  }, "different tensors");
}

TEST_P(Exchange, DifferentCollectivesFailOnEveryRank) {
  const int n = GetParam();
  expectEveryRankFails(n, [n](multipath::Engine& e, int r) {
    std::vector<float> t(100 * n, 1.0f);
    Window win = registered(e, t);
    if (r == 1) {
      allreduce(e, 1, win, t.size(), DType::kFloat32, ReduceOp::kSum, after(60));
      return;
    }
    std::vector<Window> blocks;
    for (int q = 0; q < n; ++q) blocks.push_back(Window{win.region, q * 400ull});
    scatter(e, 1, blocks, Window{win.region, 0}, 100, DType::kFloat32, 0, after(60));
  }, "called different collectives");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Exchange, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

}  // namespace
}  // namespace collectives
}  // namespace maestro
