// The collectives over the multipath engine, ranks as threads in one process
// over four real loopback paths (127.0.0.1-4): results against a reference,
// for sizes that exercise empty blocks, uneven blocks and many segments; a
// disagreement between ranks ends in an error on every rank, not a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

#include "collectives/collectives.h"
#include "collectives/plan.h"
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

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllreduceSumMatchesReference) {
  const int n = GetParam();
  World w(n);
  uint64_t seq = 1;
  for (uint64_t count : {0ull, 1ull, 3ull, 1000ull, 12345ull, 300000ull}) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) data[r][i] = static_cast<float>((i * 7 + r * 13) % 1000);
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Window win = registered(e, data[r]);
      allreduce(e, seq, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
      if (win.region.valid()) e.deregisterMemory(win.region);
    });
    for (auto& err : errors) ASSERT_EQ("", errorText(err)) << count;
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>((i * 7 + q * 13) % 1000);
        ASSERT_EQ(want, data[r][i]) << "rank " << r << " element " << i << " of " << count;
      }
    ++seq;
  }
}

TEST_P(Collectives, AllreduceEveryOpOnInt64) {
  World w(GetParam());
  uint64_t seq = 1;
  testing::allreduceEveryOpOnInt64(w, &seq);
}

TEST_P(Collectives, ReduceScatterAllgatherBroadcastBarrier) {
  const int n = GetParam();
  World w(n);
  const uint64_t count = 7777;  // per rank
  std::vector<std::vector<float>> in(n, std::vector<float>(count * n)), rs(n, std::vector<float>(count)),
      ag(n, std::vector<float>(count * n)), bc(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count * n; ++i) in[r][i] = static_cast<float>((i + 3 * r) % 101);
    for (uint64_t i = 0; i < count; ++i) bc[r][i] = r == n - 1 ? static_cast<float>(i % 113) : -1.0f;
  }
  auto before = in;
  auto errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    reduceScatter(e, 1, in[r].data(), rs[r].data(), count, DType::kFloat32, ReduceOp::kSum, after(60));
    Window agw = registered(e, ag[r]);
    std::vector<float> mine(count, static_cast<float>(r + 1));
    allgather(e, 2, mine.data(), agw, count, DType::kFloat32, after(60));
    Window bcw = registered(e, bc[r]);
    broadcast(e, 3, bcw, count, DType::kFloat32, n - 1, after(60));
    barrier(e, 4, after(60));
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
  EXPECT_EQ(before, in) << "reduce_scatter must not modify its input";
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += static_cast<float>((r * count + i + 3 * q) % 101);
      ASSERT_EQ(want, rs[r][i]) << "reduce_scatter rank " << r << " i " << i;
      ASSERT_EQ(static_cast<float>(i % 113), bc[r][i]) << "broadcast rank " << r;
    }
    for (int q = 0; q < n; ++q)
      for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(static_cast<float>(q + 1), ag[r][q * count + i]);
  }
}

// Mismatched sizes: every rank gets an error naming the disagreement, fast.
TEST_P(Collectives, MismatchedShapesFailOnEveryRank) {
  const int n = GetParam();
  World w(n);
  std::vector<std::vector<float>> data(n, std::vector<float>(1000, 1.0f));
  auto t0 = Clock::now();
  auto errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    uint64_t count = r == 1 ? 999 : 1000;
    Region reg = e.registerMemory(data[r].data(), 4000);
    allreduce(e, 1, Window{reg, 0}, count, DType::kFloat32, ReduceOp::kSum, after(60));
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  for (int r = 0; r < n; ++r) {
    std::string msg = errorText(errors[r]);
    EXPECT_NE(std::string::npos, msg.find("different tensors")) << "rank " << r << ": " << msg;
    EXPECT_NE(std::string::npos, msg.find("999")) << msg;
  }
}

// A rank that never calls the collective: the others time out with a message
// that says what they waited for (not a hang).
TEST(CollectivesTimeout, MissingRankTimesOutWithAClearMessage) {
  World w(2);
  std::vector<float> v(100);
  auto& e = *w.engines[0];
  Region reg = e.registerMemory(v.data(), 400);
  try {
    allreduce(e, 1, Window{reg, 0}, 100, DType::kFloat32, ReduceOp::kSum, after(1));
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& err) {
    EXPECT_NE(std::string::npos, std::string(err.what()).find("rank 1 to start the same collective")) << err.what();
  }
}

// A ring of more messages than tags (groups beyond 513 ranks) reuses its
// tags within the operation. The window is lowered to 1-5 tags so that
// rings of 2-5 ranks reuse them over and over: allreduce (many segments, and
// blocks left empty by tiny tensors), reduce_scatter, allgather and a large
// reduce (whose allgather phase skips empty messages) stay exact.
TEST(RingTagWindow, ARingLongerThanItsTagsReusesThem) {
  struct Restore {
    ~Restore() { setRingTagWindow(0); }
  } restore;
  auto opts = testing::smallUnits();
  opts["algo"] = "allreduce:ring";  // tiny tensors too (the tuner would take another algorithm)
  for (int n : {2, 3, 5}) {
    World w(n, opts);
    uint64_t seq = 1;
    for (uint32_t window : {1u, 2u, 5u}) {
      setRingTagWindow(window);
      for (uint64_t count : {1ull, 4ull, 40000ull}) {  // 40000 floats: 160 KB, tens of 16 KB segments
        std::vector<std::vector<float>> data(n, std::vector<float>(count)), red(n, std::vector<float>(count));
        std::vector<std::vector<float>> rs_in(n, std::vector<float>(count * n)), rs_out(n, std::vector<float>(count));
        std::vector<std::vector<float>> gathered(n, std::vector<float>(count * n));
        for (int r = 0; r < n; ++r) {
          for (uint64_t i = 0; i < count; ++i) data[r][i] = red[r][i] = static_cast<float>((i * 7 + r * 13) % 1000);
          for (uint64_t i = 0; i < count * n; ++i) rs_in[r][i] = static_cast<float>((i + 3 * r) % 11);
        }
        const int root = n - 1;
        const uint64_t base = seq;
        auto errors = runRanks(n, [&](int r) {
          auto& e = *w.engines[r];
          Window win = registered(e, data[r]), rw = registered(e, red[r]), all = registered(e, gathered[r]);
          std::vector<float> mine(data[r]);
          allreduce(e, base, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
          reduceScatter(e, base + 1, rs_in[r].data(), rs_out[r].data(), count, DType::kFloat32, ReduceOp::kSum,
                        after(60));
          allgather(e, base + 2, mine.data(), all, count, DType::kFloat32, after(60));
          reduce(e, base + 3, rw, count, DType::kFloat32, ReduceOp::kMax, root, after(60));
          e.deregisterMemory(win.region);
          e.deregisterMemory(rw.region);
          e.deregisterMemory(all.region);
        });
        seq += 4;
        for (int r = 0; r < n; ++r) ASSERT_EQ("", errorText(errors[r])) << n << " ranks, window " << window;
        for (int r = 0; r < n; ++r)
          for (uint64_t i = 0; i < count; ++i) {
            float sum = 0, most = 0, rs = 0;
            for (int q = 0; q < n; ++q) {
              const float v = static_cast<float>((i * 7 + q * 13) % 1000);
              sum += v;
              most = std::max(most, v);
              rs += static_cast<float>((r * count + i + 3 * q) % 11);
            }
            ASSERT_EQ(sum, data[r][i]) << "allreduce: " << n << " ranks, window " << window << ", rank " << r;
            ASSERT_EQ(rs, rs_out[r][i]) << "reduce_scatter: " << n << " ranks, window " << window << ", rank " << r;
            if (r == root) ASSERT_EQ(most, red[r][i]) << "reduce: " << n << " ranks, window " << window;
            for (int q = 0; q < n; ++q)
              ASSERT_EQ(static_cast<float>((i * 7 + q * 13) % 1000), gathered[r][q * count + i])
                  << "allgather: " << n << " ranks, window " << window << ", rank " << r << " block " << q;
          }
      }
    }
  }
}

// 64 ranks as threads of one process, 2 real loopback paths between every
// pair (8,064 sockets, one event loop): every collective exact.
TEST(CollectivesScale, SixtyFourRanksAsThreads) {
  constexpr int n = 64;
  World w(n, {{"paths", "2"}, {"chunk_size", "16K"}, {"segment_size", "64K"}});
  for (auto& e : w.engines) ASSERT_TRUE(e) << "a rank did not join";
  const uint64_t count = 4099;  // uneven blocks
  std::vector<std::vector<float>> data(n, std::vector<float>(count)), gathered(n, std::vector<float>(count * n));
  std::vector<std::vector<float>> scattered(n, std::vector<float>(count));
  std::vector<std::vector<float>> rs_in(n, std::vector<float>(count * n));
  for (int r = 0; r < n; ++r)
    for (uint64_t i = 0; i < count; ++i) data[r][i] = static_cast<float>((i + r) % 17);
  for (int r = 0; r < n; ++r)
    for (uint64_t i = 0; i < count * n; ++i) rs_in[r][i] = static_cast<float>((i + 3 * r) % 11);
  auto errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    Window win = registered(e, data[r]);
    allreduce(e, 1, win, count, DType::kFloat32, ReduceOp::kSum, after(120));
    Window all = registered(e, gathered[r]);
    allgather(e, 2, data[r].data(), all, count, DType::kFloat32, after(120));
    reduceScatter(e, 3, rs_in[r].data(), scattered[r].data(), count, DType::kFloat32, ReduceOp::kSum, after(120));
    broadcast(e, 4, win, count, DType::kFloat32, 63, after(120));
    barrier(e, 5, after(120));
    e.deregisterMemory(all.region);
    e.deregisterMemory(win.region);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i) {
      float sum = 0, rs = 0;
      for (int q = 0; q < n; ++q) {
        sum += static_cast<float>((i + q) % 17);
        rs += static_cast<float>((r * count + i + 3 * q) % 11);
      }
      ASSERT_EQ(sum, data[r][i]) << "allreduce+broadcast, rank " << r << " element " << i;
      ASSERT_EQ(rs, scattered[r][i]) << "reduce_scatter, rank " << r << " element " << i;
    }
    for (int q = 0; q < n; ++q)  // rank q's tensor after the allreduce: the sum
      ASSERT_EQ(data[q][7], gathered[r][q * count + 7]) << "allgather, rank " << r << " block " << q;
  }
}

// One large reduce_scatter does not keep its working copy pinned for the
// life of the group: after a run of small operations it is given back.
TEST(CollectivesMemory, ALargeOperationsBufferIsFreedAfterSmallOnes) {
  World w(2);
  auto reduceScatterOf = [&](uint64_t count, uint64_t seq) {
    std::vector<std::vector<float>> in(2, std::vector<float>(2 * count, 1.0f)), out(2, std::vector<float>(count));
    auto errors = runRanks(2, [&](int r) {
      reduceScatter(*w.engines[r], seq, in[r].data(), out[r].data(), count, DType::kFloat32, ReduceOp::kSum,
                    after(30));
    });
    for (auto& err : errors) ASSERT_EQ("", errorText(err));
    for (int r = 0; r < 2; ++r) ASSERT_EQ(2.0f, out[r][count - 1]);
  };
  reduceScatterOf(4 << 20, 1);  // 32 MiB in per rank
  const size_t big = w.engines[0]->bufferBytes();
  EXPECT_GE(big, size_t(32) << 20) << "the reduce_scatter's working copy";
  for (uint64_t seq = 2; seq < 2 + 32; ++seq) reduceScatterOf(1024, seq);
  EXPECT_LT(w.engines[0]->bufferBytes(), size_t(4) << 20) << "still holding " << w.engines[0]->bufferBytes();
}

// A descriptor that names the right collective but carries no buffer (a
// buggy or hostile peer) is refused, not read past its end.
TEST(CollectivesDescriptor, ADescriptorWithoutItsBufferIsRefused) {
  World w(2);
  std::vector<float> data(1000, 1.0f);
  std::string error;
  auto errors = runRanks(2, [&](int r) {
    auto& e = *w.engines[r];
    if (r == 0) {
      Window win = registered(e, data);
      try {
        broadcast(e, 1, win, data.size(), DType::kFloat32, 0, after(10));
      } catch (const Error& ex) {
        error = ex.what();
      }
      e.deregisterMemory(win.region);
    } else {
      OpDesc d;  // what rank 0 sends, without the window that follows it
      d.kind = static_cast<uint8_t>(OpKind::kBroadcast);
      d.dtype = static_cast<uint8_t>(DType::kFloat32);
      d.root = 0;
      d.count = data.size();
      e.sendControl(0, multipath::ControlType::kDesc, 1, 0, &d, sizeof d);
    }
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
  EXPECT_NE(std::string::npos, error.find("malformed operation descriptor from rank 1: 0 buffers, expected 1")) << error;
}

// A staged buffer as forced staging makes it: each piece is copied in from
// the caller's data only when the ring waits for more (stageMore), and each
// part reported final is copied back at once. It records what the ring did.
class PieceStager : public StagedBuffer {
 public:
  PieceStager(std::vector<float>& host, const std::vector<float>& caller, std::vector<Span> pieces)
      : host_(host), caller_(caller), pieces_(std::move(pieces)), back(caller.size(), -1.0f), finals(caller.size(), 0) {}
  bool ready(uint64_t offset, uint64_t bytes) override {
    for (size_t j = 0; j < pieces_.size(); ++j)
      if (pieces_[j].offset < offset + bytes && offset < pieces_[j].offset + pieces_[j].bytes && j >= staged_)
        return false;
    if (staged_ < pieces_.size()) went_ahead = true;  // the ring used bytes before the whole tensor was in
    return true;
  }
  bool stageMore() override {
    if (staged_ == pieces_.size()) return false;
    const Span& p = pieces_[staged_++];
    std::memcpy(reinterpret_cast<uint8_t*>(host_.data()) + p.offset,
                reinterpret_cast<const uint8_t*>(caller_.data()) + p.offset, p.bytes);
    return true;
  }
  void final(uint64_t offset, uint64_t bytes) override {
    for (uint64_t i = offset / 4; i < (offset + bytes) / 4; ++i) {
      back[i] = host_[i];
      ++finals[i];
    }
  }
  bool went_ahead = false;
  std::vector<float> back;  // the caller's tensor after the copies back
  std::vector<int> finals;  // how often each element was reported final

 private:
  std::vector<float>& host_;
  const std::vector<float>& caller_;
  std::vector<Span> pieces_;
  size_t staged_ = 0;
};

// A staged allreduce: the stand-in starts as garbage and is filled piece by
// piece while the ring runs. The ring must read no byte before its piece is
// in, must start before the last piece is, and must report each element final exactly
// once, holding its reduced value then -- with a window of tags of its own
// and one short enough to reuse them.
TEST_P(Collectives, AStagedAllreduceGoesAheadOfItsCopiesAndReportsEachElementFinalOnce) {
  struct Restore {
    ~Restore() { setRingTagWindow(0); }
  } restore;
  const int n = GetParam();
  World w(n);
  uint64_t seq = 1;
  for (uint32_t window : {0u, 3u}) {
    setRingTagWindow(window);
    for (uint64_t count : {1ull, 1001ull, 300000ull}) {
      std::vector<std::vector<float>> caller(n, std::vector<float>(count)), host(n, std::vector<float>(count, -7e9f));
      for (int r = 0; r < n; ++r)
        for (uint64_t i = 0; i < count; ++i) caller[r][i] = static_cast<float>((i * 7 + r * 13) % 1000);
      std::vector<std::unique_ptr<PieceStager>> stagers;
      for (int r = 0; r < n; ++r)
        stagers.push_back(std::make_unique<PieceStager>(host[r], caller[r],
                                                        allreduceStagingOrder(count, 4, r, n, 32 << 10)));
      auto errors = runRanks(n, [&](int r) {
        auto& e = *w.engines[r];
        Window win = registered(e, host[r]);
        allreduce(e, seq, win, count, DType::kFloat32, ReduceOp::kSum, after(60), stagers[r].get());
        e.deregisterMemory(win.region);
      });
      ++seq;
      for (int r = 0; r < n; ++r) ASSERT_EQ("", errorText(errors[r])) << n << " ranks, window " << window;
      for (int r = 0; r < n; ++r) {
        if (count == 300000) EXPECT_TRUE(stagers[r]->went_ahead) << "rank " << r;
        for (uint64_t i = 0; i < count; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += static_cast<float>((i * 7 + q * 13) % 1000);
          ASSERT_EQ(1, stagers[r]->finals[i]) << "rank " << r << " element " << i << " of " << count;
          ASSERT_EQ(want, stagers[r]->back[i]) << "rank " << r << " element " << i << " of " << count;
          ASSERT_EQ(want, host[r][i]) << "rank " << r << " element " << i << " of " << count;
        }
      }
    }
  }
}

// A copy in that fails mid-pipeline (a CUDA error on a GPU): the rank whose
// copy failed fails the operation on every rank at once, naming itself and
// the cause -- with pieces staged and not, and messages in flight -- and
// the ranks go on to the next operation.
TEST(StagedAllreduce, ACopyThatFailsMidPipelineFailsEveryRankAtOnce) {
  struct FailingStager : PieceStager {
    using PieceStager::PieceStager;
    bool stageMore() override {
      if (++calls == 4) throw Error("a copy into the stand-in failed");
      return PieceStager::stageMore();
    }
    int calls = 0;
  };
  const int n = 3;
  World w(n);
  const uint64_t count = 300000;
  std::vector<std::vector<float>> caller(n, std::vector<float>(count, 1.0f)), host(n, std::vector<float>(count));
  std::vector<std::unique_ptr<PieceStager>> stagers;
  for (int r = 0; r < n; ++r) {
    auto order = allreduceStagingOrder(count, 4, r, n, 32 << 10);
    if (r == 1) stagers.push_back(std::make_unique<FailingStager>(host[r], caller[r], order));
    else stagers.push_back(std::make_unique<PieceStager>(host[r], caller[r], order));
  }
  const auto start = std::chrono::steady_clock::now();
  auto errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    Window win = registered(e, host[r]);
    try {
      allreduce(e, 1, win, count, DType::kFloat32, ReduceOp::kSum, after(60), stagers[r].get());
    } catch (...) {
      e.deregisterMemory(win.region);
      throw;
    }
    e.deregisterMemory(win.region);
  });
  // A liveness bound (the group timeout is 60 s): the abort reaches every rank at once.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  for (int r = 0; r < n; ++r) {
    const std::string text = errorText(errors[r]);
    EXPECT_NE(std::string::npos, text.find("failed on rank 1: could not stage its tensor: a copy into the stand-in "
                                           "failed"))
        << "rank " << r << ": " << text;
  }
  // The next operation runs.
  std::vector<std::vector<float>> data(n, std::vector<float>(1000, 2.0f));
  errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    Window win = registered(e, data[r]);
    allreduce(e, 2, win, 1000, DType::kFloat32, ReduceOp::kSum, after(60));
    e.deregisterMemory(win.region);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
    ASSERT_EQ(2.0f * n, data[r][999]);
  }
}

TEST(RingSegments, AMidSizeRingAcrossHostsGoesInSmallestChunks) {
  const uint64_t K = 1024, seg = 1 << 20, chunk = 256 * K, floor = 64 * K;
  // 4 paths: blocks above one floor chunk and up to one per path.
  EXPECT_EQ(floor, ringSegmentBytes(256 * K, seg, chunk, floor, 4, true));     // 1 MiB over 4 ranks
  EXPECT_EQ(floor, ringSegmentBytes(64 * K + 64, seg, chunk, floor, 4, true));
  EXPECT_EQ(seg, ringSegmentBytes(64 * K, seg, chunk, floor, 4, true));        // one chunk anyway
  EXPECT_EQ(seg, ringSegmentBytes(256 * K + 64, seg, chunk, floor, 4, true));  // more than one per path
  EXPECT_EQ(floor, ringSegmentBytes(512 * K, seg, chunk, floor, 8, true));     // 8 paths: up to 512 KiB
  // Whole messages: one host, one path, no floor (verbs), or a segment knob below the floor.
  EXPECT_EQ(seg, ringSegmentBytes(256 * K, seg, chunk, floor, 4, false));
  EXPECT_EQ(seg, ringSegmentBytes(256 * K, seg, chunk, floor, 1, true));
  EXPECT_EQ(seg, ringSegmentBytes(256 * K, seg, chunk, chunk, 4, true));
  EXPECT_EQ(32 * K, ringSegmentBytes(100 * K, 32 * K, chunk, floor, 4, true));
}

// The ring's mid-size cut runs where the ranks are on several hosts; here
// they are threads of one process, so the test says they are not.
struct SpansHosts {
  SpansHosts() { setRingSpansHosts(true); }
  ~SpansHosts() { resetRingSpansHosts(); }
};

// 16 KiB chunks cut down to 4 KiB ones over 4 paths: blocks of 4-16 KiB go
// in 4 KiB segments. Sizes below, inside and above that range, on every
// collective built on the ring, checked element by element.
TEST_P(Collectives, MidSizeRingsInSmallestChunksAreExact) {
  const int n = GetParam();
  SpansHosts spans;
  World w(n, {{"chunk_size", "16K"}, {"min_chunk_size", "4K"}, {"segment_size", "64K"}, {"paths", "4"},
              {"algo", "allreduce:ring"}});
  uint64_t seq = 1;
  auto value = [](int r, uint64_t i) { return static_cast<float>((i * (r + 3) + 131 * r) % 1013); };
  for (uint64_t block_bytes : {4096ull, 4100ull, 12000ull, 16384ull, 16448ull}) {
    const uint64_t count = block_bytes / 4 * n;  // allreduce / reduce: blocks of block_bytes
    std::vector<std::vector<float>> ar(n, std::vector<float>(count)), red(n, std::vector<float>(count)),
        rs(n, std::vector<float>(count / n));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) ar[r][i] = red[r][i] = value(r, i);
    const int root = 1 % n;
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Window arw = registered(e, ar[r]);
      allreduce(e, seq, arw, count, DType::kFloat32, ReduceOp::kSum, after(60));
      std::vector<float> input = red[r];
      reduceScatter(e, seq + 1, input.data(), rs[r].data(), count / n, DType::kFloat32, ReduceOp::kSum, after(60));
      Window redw = registered(e, red[r]);
      reduce(e, seq + 2, redw, count, DType::kFloat32, ReduceOp::kSum, root, after(60));
    });
    seq += 3;
    for (auto& err : errors) ASSERT_EQ("", errorText(err)) << block_bytes;
    for (uint64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i);
      for (int r = 0; r < n; ++r) ASSERT_EQ(want, ar[r][i]) << "allreduce rank " << r << " element " << i;
      ASSERT_EQ(want, red[root][i]) << "reduce element " << i;
      if (i < count / n)
        for (int r = 0; r < n; ++r) {
          float block = 0;
          for (int q = 0; q < n; ++q) block += value(q, r * (count / n) + i);
          ASSERT_EQ(block, rs[r][i]) << "reduce_scatter rank " << r << " element " << i;
        }
    }
  }
}

// A path closed while mid-size rings in smallest chunks run back to back:
// its chunks in flight are sent again on the others, every result exact
// (testing::allreducesWhileAPathCloses).
TEST(MidSizeRing, APathClosedMidPipelineLosesNothing) {
  const int n = 2, ops = 400, paths = 4;
  SpansHosts spans;
  World w(n, {{"chunk_size", "16K"}, {"min_chunk_size", "4K"}, {"segment_size", "64K"}, {"paths", "4"},
              {"algo", "allreduce:ring"}});
  const uint64_t count = 2 * 12000 / 4;  // blocks of 12000 bytes: 3 segments
  testing::allreducesWhileAPathCloses(w, ops, paths, count);
}

TEST(StagingOrder, BlocksInTheOrderTheRingFirstNeedsThemCutIntoWholeElementPieces) {
  // 10 floats on 3 ranks: blocks of 4, 3, 3 elements (bytes 0-16, 16-28, 28-40).
  auto order = allreduceStagingOrder(10, 4, 1, 3, 8);
  std::vector<std::pair<uint64_t, uint64_t>> got;
  for (const auto& s : order) got.emplace_back(s.offset, s.bytes);
  // Rank 1: block 1, then 0, then 2; pieces of 2 elements.
  const std::vector<std::pair<uint64_t, uint64_t>> want = {{16, 8}, {24, 4}, {0, 8}, {8, 8}, {28, 8}, {36, 4}};
  EXPECT_EQ(want, got);
  // A piece smaller than an element is one element; every byte once.
  uint64_t covered = 0;
  for (const auto& s : allreduceStagingOrder(1001, 8, 0, 4, 5)) {
    EXPECT_EQ(8u, s.bytes);
    covered += s.bytes;
  }
  EXPECT_EQ(1001u * 8, covered);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

}  // namespace
}  // namespace collectives
}  // namespace maestro
