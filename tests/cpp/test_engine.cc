// The multipath engine's failover of control messages: a credit, descriptor
// or barrier token posted on a path that dies before delivering it is sent
// again on a live path, so a waiting peer still gets it (two ranks as
// threads over four real loopback paths).
#include <gtest/gtest.h>

#include <thread>

#include "collectives/collectives.h"
#include "multipath/engine.h"
#include "test_util.h"

namespace maestro {
namespace multipath {
namespace {

using testing::after;
using testing::errorText;
using testing::MemoryRendezvous;
using testing::runRanks;

bool allUp(Engine& e) {
  for (const auto& s : e.pathStats())
    if (s.state == "down") return false;
  return true;
}

int firstUpPath(Engine& e, int peer) {
  for (const auto& s : e.pathStats())
    if (s.peer == peer && s.state != "down") return s.path;
  return -1;
}

TEST(EngineControl, MessagesOnAPathClosedUnderThemStillArrive) {
  MemoryRendezvous store;
  std::vector<std::unique_ptr<Engine>> engines(2);
  auto errors = runRanks(2, [&](int r) {
    engines[r] = std::make_unique<Engine>(std::map<std::string, std::string>{{"paths", "4"}, {"probe_interval", "0.1"}},
                                          store, r, 2, after(30));
  });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  Engine& a = *engines[0];
  Engine& b = *engines[1];
  for (uint32_t i = 0; i < 12; ++i) {
    // Rank 0 opened every path, so it reconnects them: wait for all.
    auto until = after(20);
    while (!(allUp(a) && allUp(b)) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(allUp(a) && allUp(b)) << "paths did not come back:\n" << a.pathTable();
    // Post a burst of tokens, then kill the path they went on before its
    // sender thread had a chance to flush them all.
    const int path = firstUpPath(a, 1);
    for (uint32_t k = 0; k < 16; ++k) a.sendControl(1, ControlType::kBarrier, 100 + i, k);
    a.transport().closePath(1, path, "closed by the test");
    for (uint32_t k = 0; k < 16; ++k) {
      auto deadline = after(10);
      bool got = false;
      while (!(got = b.takeControl(0, {ControlType::kBarrier, 100 + i, k}, nullptr)) && Clock::now() < deadline)
        b.waitEvent(b.eventCount(), after(0.05));
      ASSERT_TRUE(got) << "token " << k << " of round " << i << " was lost with path " << path;
    }
  }
}

// The group secret is in the store only until every rank has it: whoever
// can read the store later cannot present it.
TEST(EngineSetup, TheGroupSecretLeavesTheStoreOnceEveryRankHasIt) {
  MemoryRendezvous store;
  std::vector<std::unique_ptr<Engine>> engines(2);
  auto errors = runRanks(2, [&](int r) {
    engines[r] = std::make_unique<Engine>(std::map<std::string, std::string>{{"paths", "2"}}, store, r, 2, after(30));
  });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  EXPECT_TRUE(store.has("maestro/endpoints/0"));
  EXPECT_FALSE(store.has("maestro/secret/0"));
}

// A peer's "this path is dead" notice can arrive after the path was already
// reconnected (it travels on another path, the reconnect on its own). The
// engine probes before it believes it: a path that answers stays up.
TEST(EngineFailover, ADeadPathReportAboutALiveConnectionDoesNotCloseIt) {
  MemoryRendezvous store;
  std::vector<std::unique_ptr<Engine>> engines(2);
  auto errors = runRanks(2, [&](int r) {
    engines[r] = std::make_unique<Engine>(
        std::map<std::string, std::string>{{"paths", "2"}, {"probe_interval", "0.1"}, {"path_timeout", "0.5"}}, store,
        r, 2, after(30));
  });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  Engine& a = *engines[0];
  Engine& b = *engines[1];
  b.sendControl(0, ControlType::kPathDown, 0, 0);  // stale: path 0 is fine
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // three path timeouts
  for (const auto& s : a.pathStats()) {
    EXPECT_EQ("up", s.state) << a.pathTable();
    EXPECT_EQ(0u, s.errors) << "path " << s.path << " was closed on a stale report:\n" << a.pathTable();
    EXPECT_EQ(0u, s.reconnects) << a.pathTable();
  }
  // ...and carries data.
  const uint64_t count = 64 * 1024;
  std::vector<std::vector<float>> data(2, std::vector<float>(count, 1.0f));
  errors = runRanks(2, [&](int r) {
    Engine& e = *engines[r];
    collectives::Window w{e.registerMemory(data[r].data(), count * sizeof(float)), 0};
    collectives::allreduce(e, 1, w, count, collectives::DType::kFloat32, collectives::ReduceOp::kSum, after(30));
    e.deregisterMemory(w.region);
  });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  EXPECT_EQ(2.0f, data[0][count - 1]);
  for (const auto& s : a.pathStats()) EXPECT_GT(s.chunks_sent, 0u) << a.pathTable();
}

TEST(EngineAdaptive, ASmallMessageIsSpreadOverThePathsNotPiledOnTheFirst) {
  // 2 ranks, chunks of 4 KiB: each allreduce message is 5 chunks, fewer
  // than one path's window. Adaptive must still use every path.
  MemoryRendezvous store;
  std::vector<std::unique_ptr<Engine>> engines(2);
  auto errors = runRanks(2, [&](int r) {
    engines[r] = std::make_unique<Engine>(
        std::map<std::string, std::string>{{"paths", "4"}, {"chunk_size", "4K"}, {"policy", "adaptive"}}, store, r, 2,
        after(30));
  });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  const uint64_t count = 2 * 5 * 1024;  // two blocks of 20 KiB
  std::vector<std::vector<float>> data(2, std::vector<float>(count, 1.0f));
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    errors = runRanks(2, [&](int r) {
      Engine& e = *engines[r];
      collectives::Window w{e.registerMemory(data[r].data(), count * sizeof(float)), 0};
      collectives::allreduce(e, seq, w, count, collectives::DType::kFloat32, collectives::ReduceOp::kSum, after(30));
      e.deregisterMemory(w.region);
    });
    for (auto& e : errors) ASSERT_EQ("", errorText(e));
  }
  for (const auto& s : engines[0]->pathStats())
    EXPECT_GT(s.chunks_sent, 0u) << "path " << s.path << " carried nothing:\n" << engines[0]->pathTable();
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
