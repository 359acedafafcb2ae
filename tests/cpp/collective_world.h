// A group of engines, one per rank, in one process (the collectives' C++
// tests run the ranks as threads over four real loopback paths).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/op.h"
#include "multipath/engine.h"
#include "test_util.h"

namespace maestro {
namespace testing {

// Small chunks and segments so that modest tensors span many chunks,
// segments and scratch-slot reuses.
inline std::map<std::string, std::string> smallUnits() {
  return {{"chunk_size", "4K"}, {"segment_size", "16K"}, {"scratch_slots", "2"}, {"paths", "4"}};
}

struct World {
  explicit World(int n, std::map<std::string, std::string> opts = smallUnits()) : engines(n) {
    auto errors = runRanks(n, [&](int r) {
      engines[r] = std::make_unique<multipath::Engine>(opts, store, r, n, after(30));
    });
    for (auto& e : errors) EXPECT_EQ("", errorText(e));
  }
  MemoryRendezvous store;
  std::vector<std::unique_ptr<multipath::Engine>> engines;
};

// Closes rank 0's paths to rank 1, one at a time, while the ranks run
// operations (`started` counts them on rank 0; `finished` says they
// stopped), until a close made a chunk go again on another path; done()
// then says so, and the ranks stop at the next operation they agree on. A
// small chunk on loopback is acknowledged within microseconds, so the one
// seen in flight may be acknowledged before the close lands (the closing
// thread descheduled in between): then nothing is sent again, and the next
// path is closed, up to all but one. join() before reading what it saw.
struct PathCloser {
  PathCloser(World& w, const std::atomic<int>& started, const std::atomic<bool>& finished, int paths, int from = 0,
             int to = 1)
      : thread([this, &w, &started, &finished, paths, from, to] {
          const auto until = after(60);
          int path = 0;
          while (!finished.load() && Clock::now() < until && path < paths - 1) {
            if (started.load() > 20 && w.engines[from]->inflightOn(to, path) > 0) {
              w.engines[from]->transport().closePath(to, path, "closed by the test");
              closed_mid_operation = closed_mid_operation || !finished.load();
              const auto flushed = after(0.5);
              while (resent(w) == 0 && Clock::now() < flushed)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
              if (resent(w) > 0) break;
              ++path;
            }
            std::this_thread::yield();
          }
          done_ = true;
        }) {}
  ~PathCloser() {
    if (thread.joinable()) thread.join();
  }
  void join() { thread.join(); }
  // It closed a path that made a chunk go again, or gave up.
  bool done() const { return done_.load(); }
  // Chunks sent again, every rank's paths.
  static uint64_t resent(World& w) {
    uint64_t sum = 0;
    for (auto& e : w.engines)
      for (const auto& s : e->pathStats()) sum += s.resent;
    return sum;
  }
  std::atomic<bool> done_{false};
  bool closed_mid_operation = false;  // written by the thread, read after join()
  std::thread thread;
};

// An allreduce of 5001 int64 elements with every reduce op, each checked
// element by element on every rank (operations seq, seq + 1, ...; seq is
// left after the last). With a root: a reduce into it, every other rank's
// tensor checked unchanged.
inline void allreduceEveryOpOnInt64(World& w, uint64_t* seq, int root = -1) {
  using namespace collectives;
  const int n = static_cast<int>(w.engines.size());
  const uint64_t count = 5001;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct,
                      ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    std::vector<std::vector<int64_t>> data(n, std::vector<int64_t>(count));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) data[r][i] = static_cast<int64_t>((i * 31 + r * 17) % 97) - 40;
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Region reg = e.registerMemory(data[r].data(), count * 8);
      if (root < 0) allreduce(e, *seq, Window{reg, 0}, count, DType::kInt64, op, after(60));
      else reduce(e, *seq, Window{reg, 0}, count, DType::kInt64, op, root, after(60));
      e.deregisterMemory(reg);
    });
    ++*seq;
    for (auto& err : errors) ASSERT_EQ("", errorText(err));
    for (uint64_t i = 0; i < count; ++i) {
      int64_t acc = static_cast<int64_t>((i * 31) % 97) - 40;
      for (int q = 1; q < n; ++q) {
        int64_t v = static_cast<int64_t>((i * 31 + q * 17) % 97) - 40;
        if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
        if (op == ReduceOp::kMin) acc = std::min(acc, v);
        if (op == ReduceOp::kMax) acc = std::max(acc, v);
        if (op == ReduceOp::kProduct) acc *= v;
        if (op == ReduceOp::kBand) acc &= v;
        if (op == ReduceOp::kBor) acc |= v;
        if (op == ReduceOp::kBxor) acc ^= v;
      }
      if (op == ReduceOp::kAvg) acc /= n;
      for (int r = 0; r < n; ++r) {
        const int64_t own = static_cast<int64_t>((i * 31 + r * 17) % 97) - 40;
        ASSERT_EQ(root < 0 || r == root ? acc : own, data[r][i]) << reduceOpName(op) << " rank " << r << " i " << i;
      }
    }
  }
}

// Float sum allreduces of `count` elements back to back on every rank of
// `w` while a PathCloser closes rank 0's paths to rank 1 (all but one of
// `paths`): a close must land mid-operation and make a chunk go again, and
// every result must be exact. At least `ops` of them, and on until the
// closer is done (the ranks agree on when to stop with a one-element
// allreduce after each one from then on: a rank that stopped alone would
// leave the others waiting), at most 50 x `ops`. With a root: reduces into
// it, every other rank's tensor unchanged, and the paths closed are those
// of the rank after the root (which sends to it in any algorithm) to the
// root.
inline void allreducesWhileAPathCloses(World& w, int ops, int paths, uint64_t count, int root = -1) {
  using namespace collectives;
  const int n = static_cast<int>(w.engines.size());
  auto value = [](int r, uint64_t i, int op) { return static_cast<float>((i * (r + 5) + 17 * op + r) % 2003); };
  std::atomic<int> started{0};
  std::atomic<bool> finished{false};
  PathCloser closer(w, started, finished, paths, root < 0 ? 0 : (root + 1) % n, root < 0 ? 1 : root);
  std::vector<int> wrong(n, 0);
  auto errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    std::vector<float> data(count);
    Window win{e.registerMemory(data.data(), count * sizeof(float)), 0};
    std::vector<int32_t> more(1);
    Window flag{e.registerMemory(more.data(), sizeof(int32_t)), 0};
    uint64_t seq = 1;
    for (int op = 0; op < 50 * ops; ++op) {
      for (uint64_t i = 0; i < count; ++i) data[i] = value(r, i, op);
      if (r == 0) started++;
      if (root < 0) allreduce(e, seq++, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
      else reduce(e, seq++, win, count, DType::kFloat32, ReduceOp::kSum, root, after(60));
      for (uint64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += value(q, i, op);
        if (data[i] != (root < 0 || r == root ? want : value(r, i, op))) wrong[r]++;
      }
      if (op + 1 < ops) continue;
      more[0] = r == 0 && !closer.done() ? 1 : 0;  // rank 0 asks for another one while the closer works
      allreduce(e, seq++, flag, 1, DType::kInt32, ReduceOp::kMax, after(60));
      if (more[0] == 0) break;
    }
    if (r == 0) finished = true;
    e.deregisterMemory(flag.region);
    e.deregisterMemory(win.region);
  });
  finished = true;
  closer.join();
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
  ASSERT_TRUE(closer.closed_mid_operation) << "the path was not closed while the operations ran: the test proves nothing";
  EXPECT_EQ(std::vector<int>(n, 0), wrong);
  EXPECT_GT(PathCloser::resent(w), 0u) << "no chunk was in flight on any of the " << paths - 1 << " closed paths";
}

// Empty tensors are not registered: an operation on them only handshakes.
template <typename T>
collectives::Window registered(multipath::Engine& e, std::vector<T>& v) {
  return v.empty() ? collectives::Window{} : collectives::Window{e.registerMemory(v.data(), v.size() * sizeof(T)), 0};
}

}  // namespace testing
}  // namespace maestro
