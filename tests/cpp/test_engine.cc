// The multipath engine's failover of control messages: a credit, descriptor
// or barrier token posted on a path that dies before delivering it is sent
// again on a live path, so a waiting peer still gets it (two ranks as
// threads over four real loopback paths).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

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

// A control message as it comes off the wire (engine_state.h's ControlHeader:
// type, 3 reserved bytes, sub, seq; then the body).
std::vector<uint8_t> controlMessage(ControlType type, uint64_t seq, uint32_t sub, const std::string& body = "") {
  std::vector<uint8_t> m(16 + body.size(), 0);
  m[0] = static_cast<uint8_t>(type);
  std::memcpy(m.data() + 4, &sub, 4);
  std::memcpy(m.data() + 8, &seq, 8);
  std::memcpy(m.data() + 16, body.data(), body.size());
  return m;
}

std::vector<std::unique_ptr<Engine>> twoEngines(MemoryRendezvous& store,
                                                std::map<std::string, std::string> options = {{"paths", "2"}}) {
  std::vector<std::unique_ptr<Engine>> engines(2);
  auto errors = runRanks(2, [&](int r) {
    engines[r] = std::make_unique<Engine>(options, store, r, 2, after(30));
  });
  for (auto& e : errors) EXPECT_EQ("", errorText(e));
  return engines;
}

// Wait for barrier token (seq, k) from rank 0 at `b`.
bool waitToken(Engine& b, uint64_t seq, uint32_t k, double seconds) {
  auto deadline = after(seconds);
  bool got = false;
  while (!(got = b.takeControl(0, {ControlType::kBarrier, seq, k}, nullptr)) && Clock::now() < deadline)
    b.waitEvent(b.eventCount(), after(0.05));
  return got;
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
    for (uint32_t k = 0; k < 16; ++k)
      ASSERT_TRUE(waitToken(b, 100 + i, k, 10)) << "token " << k << " of round " << i << " was lost with path " << path;
  }
}

// The group secret is in the store only until every rank has it: whoever
// can read the store later cannot present it.
TEST(EngineSetup, TheGroupSecretLeavesTheStoreOnceEveryRankHasIt) {
  MemoryRendezvous store;
  auto engines = twoEngines(store);
  ASSERT_TRUE(engines[0] && engines[1]);
  EXPECT_TRUE(store.has("maestro/endpoints/0"));
  EXPECT_FALSE(store.has("maestro/secret/0"));
}

// Control messages wait in a peer's inbox until their operation takes
// them: a message for an operation far beyond any this rank could be
// waiting for is a protocol error, not memory kept forever.
TEST(EngineControl, AMessageFarAheadOfEveryOperationIsAProtocolError) {
  MemoryRendezvous store;
  auto engines = twoEngines(store);
  ASSERT_TRUE(engines[0] && engines[1]);
  Engine& a = *engines[0];
  auto near = controlMessage(ControlType::kBarrier, 3, 0);
  a.onMessage(1, 0, near.data(), near.size());
  EXPECT_TRUE(a.takeControl(1, {ControlType::kBarrier, 3, 0}, nullptr));
  auto far = controlMessage(ControlType::kBarrier, uint64_t(1) << 40, 0);
  a.onMessage(1, 0, far.data(), far.size());
  try {
    a.checkPeer(1);
    FAIL() << "a message 2^40 operations ahead was kept";
  } catch (const Error& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("protocol error from rank 1")) << e.what();
  }
}

// Aborts are kept while their operation may still ask, not forever; one
// about an operation already finished here is not kept at all.
TEST(EngineControl, AbortsOfFinishedOperationsAreForgotten) {
  MemoryRendezvous store;
  auto engines = twoEngines(store);
  ASSERT_TRUE(engines[0] && engines[1]);
  Engine& a = *engines[0];
  auto abort5 = controlMessage(ControlType::kAbort, 5, 1, "rank 1 gave up");
  a.onMessage(1, 0, abort5.data(), abort5.size());
  std::string why;
  ASSERT_TRUE(a.abortFor(5, &why));
  EXPECT_EQ("rank 1 gave up", why);
  a.retire(5);
  EXPECT_FALSE(a.abortFor(5, &why)) << "kept after its operation finished";
  auto late = controlMessage(ControlType::kAbort, 4, 1, "late");
  a.onMessage(1, 0, late.data(), late.size());
  EXPECT_FALSE(a.abortFor(4, &why)) << "an abort for a finished operation was kept";
  a.checkPeer(1);  // and the peer is fine
}

// A rank whose operation failed says why in its goodbye: a peer that meets
// only its departure -- the abort it relayed never reached it, the two were
// not connected then -- fails naming that failure, not a bare "shut down".
// A rank that leaves without a failure, or after one of an operation the
// peer has finished, says nothing more.
TEST(EngineControl, APeerThatLeavesAfterAFailureSaysWhy) {
  const std::string failure = "maestro allreduce #3 failed on rank 1: ranks called different tensors";
  for (const std::string kind : {"failed", "aborted", "none", "finished"}) {
    MemoryRendezvous store;
    auto engines = twoEngines(store);
    ASSERT_TRUE(engines[0] && engines[1]);
    Engine& a = *engines[0];
    a.sendControl(1, ControlType::kBarrier, 1, 0);  // the pair connects
    ASSERT_TRUE(waitToken(*engines[1], 1, 0, 20));
    if (kind == "failed" || kind == "finished") engines[1]->noteFailure(3, failure);
    if (kind == "aborted") engines[1]->broadcastAbort(3, failure);
    if (kind == "finished") a.retire(3);
    engines[1].reset();
    std::string error;
    for (auto deadline = after(20); error.empty() && Clock::now() < deadline;) {
      try {
        a.checkPeer(1);
        a.waitEvent(a.eventCount(), after(0.05));
      } catch (const Error& e) {
        error = e.what();
      }
    }
    EXPECT_NE(std::string::npos, error.find("rank 1 has shut down its process group")) << kind << ": " << error;
    if (kind == "none" || kind == "finished")
      EXPECT_EQ(std::string::npos, error.find("after a failure there")) << kind << ": " << error;
    else
      EXPECT_NE(std::string::npos, error.find("after a failure there: " + failure)) << kind << ": " << error;
  }
}

// More control messages on a path than it has confirmed: none is given up.
// The path is closed under them; every one arrives over the other path.
TEST(EngineControl, TenThousandControlMessagesOnAPathClosedUnderThemAllArrive) {
  MemoryRendezvous store;
  auto engines = twoEngines(store);
  ASSERT_TRUE(engines[0] && engines[1]);
  Engine& a = *engines[0];
  Engine& b = *engines[1];
  constexpr uint32_t kTokens = 10000;
  const int path = firstUpPath(a, 1);
  for (uint32_t k = 0; k < kTokens; ++k) a.sendControl(1, ControlType::kBarrier, 7, k);
  a.transport().closePath(1, path, "closed by the test");
  for (uint32_t k = 0; k < kTokens; ++k)
    ASSERT_TRUE(waitToken(b, 7, k, 20)) << "token " << k << " of " << kTokens << " was lost with path " << path;
}

// A failed operation's writes stop: once cancelSends() returns, none is
// posted again, so the caller may hand the source back to the user.
TEST(EngineCancel, AFailedOperationsWritesStopWhenCancelReturns) {
  MemoryRendezvous store;
  auto engines = twoEngines(store, {{"paths", "2"}, {"chunk_size", "4K"}});
  ASSERT_TRUE(engines[0] && engines[1]);
  Engine& a = *engines[0];
  Engine& b = *engines[1];
  const size_t bytes = 32 << 20;
  std::vector<uint8_t> src(bytes, 7), dst(bytes, 0);
  Region s = a.registerMemory(src.data(), bytes);
  Region d = b.registerMemory(dst.data(), bytes);
  RemoteRegion remote = toRemote(d);
  remote.key = b.expose(d);
  const uint32_t tag = 1u << kEpochShift;  // operation #1's first message
  auto op = a.write(1, s, 0, remote, 0, bytes, tag);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  a.cancelSends(1, "cancelled by the test", std::chrono::milliseconds(2000));
  EXPECT_TRUE(op->failed() || op->done());
  auto sent = [&] {
    uint64_t n = 0;
    for (const auto& st : a.pathStats()) n += st.chunks_sent;
    return n;
  };
  const uint64_t at_cancel = sent();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(at_cancel, sent()) << "chunks of the cancelled write were still sent";
  EXPECT_LT(at_cancel, bytes / 4096) << "the write finished before it was cancelled: the test proves nothing";
  b.conceal(d);
  b.deregisterMemory(d);
  a.deregisterMemory(s);
}

// A failed operation none of whose chunks is posted yet (they all wait
// behind another operation's) and which only the engine still holds:
// cancelSends() frees it and drops its queued chunks without touching it
// after the free (the sanitizer builds see a use-after-free otherwise), and
// the operation ahead of it goes on to land exactly.
TEST(EngineCancel, AnOperationOnlyQueuedIsFreedAfterItsChunksAreDropped) {
  MemoryRendezvous store;
  auto engines = twoEngines(store, {{"paths", "2"}, {"chunk_size", "4K"}});
  ASSERT_TRUE(engines[0] && engines[1]);
  Engine& a = *engines[0];
  Engine& b = *engines[1];
  const size_t ahead_bytes = 64 << 20, queued_bytes = 1 << 20;
  std::vector<uint8_t> src(ahead_bytes), dst(ahead_bytes, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  Region s = a.registerMemory(src.data(), ahead_bytes);
  Region d = b.registerMemory(dst.data(), ahead_bytes);
  RemoteRegion remote = toRemote(d);
  remote.key = b.expose(d);
  b.beginOperation(1);
  // Operation #1 fills every path's queue with 16384 chunks; operation #2's
  // chunks queue behind them, so none of them is posted when #2 fails.
  auto ahead = a.write(1, s, 0, remote, 0, ahead_bytes, 1u << kEpochShift);
  std::weak_ptr<SendOp> queued = a.write(1, s, 0, remote, 0, queued_bytes, 2u << kEpochShift);
  ASSERT_FALSE(queued.expired()) << "the engine does not hold the queued operation";
  ASSERT_FALSE(ahead->done()) << "64 MiB in 4 KiB chunks landed before the next write was queued";
  a.cancelSends(2, "cancelled by the test", std::chrono::milliseconds(2000));
  EXPECT_TRUE(queued.expired()) << "the cancelled operation is still held";
  EXPECT_FALSE(ahead->failed()) << ahead->error();
  auto until = after(30);
  while (!ahead->done() && !ahead->failed() && Clock::now() < until) a.waitEvent(a.eventCount(), after(0.05));
  ASSERT_TRUE(ahead->done()) << (ahead->failed() ? ahead->error() : "not done in 30 s");
  EXPECT_TRUE(src == dst) << "the operation ahead of the cancelled one did not land exactly";
  b.conceal(d);
  b.deregisterMemory(d);
  a.deregisterMemory(s);
}

// abort() of the group: the operation running fails at once.
TEST(EngineCancel, InterruptFailsTheRunningOperationAtOnce) {
  MemoryRendezvous store;
  auto engines = twoEngines(store);
  ASSERT_TRUE(engines[0] && engines[1]);
  std::vector<float> data(1000, 1.0f);
  Engine& a = *engines[0];
  collectives::Window w{a.registerMemory(data.data(), data.size() * sizeof(float)), 0};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    a.interrupt("aborted by the test");
  });
  auto start = Clock::now();
  std::string error;
  try {  // rank 1 never joins: without the interrupt this waits 30 s
    collectives::allreduce(a, 1, w, data.size(), collectives::DType::kFloat32, collectives::ReduceOp::kSum, after(30));
  } catch (const Error& e) {
    error = e.what();
  }
  stopper.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(std::string::npos, error.find("aborted by the test")) << error;
  a.deregisterMemory(w.region);
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
  // ...and carries data (a tensor the ring takes: two messages, one per path).
  const uint64_t count = 256 * 1024;
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

// Path hunting's mechanics, without a slow path to find: the acceptor asks
// the opener to move a path (as it does when the path is slow towards the
// opener); without discovery the opener re-opens it from a fresh source
// port while allreduces stream over every path. The path comes back on the
// new port, no chunk is lost, and neither side counts it as a failure.
TEST(EngineHunting, AReopenedPathMovesPortsMidStreamAndNothingIsLost) {
  MemoryRendezvous store;
  // hunt_after: the detector itself stays out of it (loopback paths on a busy host differ).
  auto engines = twoEngines(store, {{"paths", "2"}, {"hunt", "on"}, {"hunt_after", "3600"}, {"chunk_size", "16K"}});
  Engine& a = *engines[0];  // opens every path (the lower rank)
  Engine& b = *engines[1];
  const std::string before = a.pathStats()[1].description;
  const uint64_t count = 1 << 20;  // 4 MiB per allreduce
  std::vector<std::vector<float>> data(2, std::vector<float>(count));
  std::atomic<bool> asked{false};
  for (uint64_t seq = 1; seq <= 12; ++seq) {
    for (int r = 0; r < 2; ++r) std::fill(data[r].begin(), data[r].end(), static_cast<float>(r + seq));
    auto errors = runRanks(2, [&](int r) {
      Engine& e = *engines[r];
      if (r == 1 && seq == 3 && !asked.exchange(true)) {
        // Path 1's transport id is 1 (no discovery).
        std::thread([&b] { b.sendControl(0, ControlType::kHuntAsk, 0, 1); }).detach();
      }
      collectives::Window w{e.registerMemory(data[r].data(), count * sizeof(float)), 0};
      collectives::allreduce(e, seq, w, count, collectives::DType::kFloat32, collectives::ReduceOp::kSum, after(30));
      e.deregisterMemory(w.region);
    });
    for (auto& e : errors) ASSERT_EQ("", errorText(e));
    for (int r = 0; r < 2; ++r)
      ASSERT_EQ(static_cast<float>(1 + 2 * seq), data[r][count - 1]) << "allreduce " << seq << " rank " << r;
  }
  // The re-opening is asynchronous: give it its bounded time.
  auto deadline = after(10);
  while (Clock::now() < deadline && (a.pathStats()[1].hunts == 0 || b.pathStats()[1].hunts == 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (Engine* e : {&a, &b}) {
    auto stats = e->pathStats();
    EXPECT_EQ(1u, stats[1].hunts) << e->pathTable();
    EXPECT_EQ(0u, stats[0].hunts) << e->pathTable();
    for (const auto& s : stats) {
      EXPECT_EQ("up", s.state) << e->pathTable();
      EXPECT_EQ(0u, s.errors) << "a re-opening counted as a failure:\n" << e->pathTable();
      EXPECT_EQ(0u, s.reconnects) << e->pathTable();
    }
  }
  EXPECT_NE(before, a.pathStats()[1].description) << "path 1 kept its source port";
  // ...and the new connection carries data.
  const uint64_t sent = a.pathStats()[1].chunks_sent;
  auto errors = runRanks(2, [&](int r) {
    Engine& e = *engines[r];
    collectives::Window w{e.registerMemory(data[r].data(), count * sizeof(float)), 0};
    collectives::allreduce(e, 13, w, count, collectives::DType::kFloat32, collectives::ReduceOp::kSum, after(30));
    e.deregisterMemory(w.region);
  });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  EXPECT_GT(a.pathStats()[1].chunks_sent, sent) << a.pathTable();
}

// Hunting messages out of place are ignored, not trusted: an offer sent to
// the opener, a pick nobody offered, a malformed body.
TEST(EngineHunting, MisplacedOrMalformedHuntMessagesAreIgnored) {
  MemoryRendezvous store;
  auto engines = twoEngines(store, {{"paths", "2"}, {"hunt", "on"}, {"hunt_after", "3600"}});
  Engine& a = *engines[0];
  Engine& b = *engines[1];
  uint16_t port = 1;
  b.sendControl(0, ControlType::kHuntOffer, 0, 1, &port, 2);   // offers go to the acceptor
  b.sendControl(0, ControlType::kHuntPick, 0, 1, &port, 2);    // never offered
  b.sendControl(0, ControlType::kHuntAsk, 0, 99);              // no such path
  b.sendControl(0, ControlType::kHuntPick, 0, 0, "abc", 3);    // odd body
  a.sendControl(1, ControlType::kHuntAsk, 0, 0);               // asks go to the opener
  a.sendControl(1, ControlType::kHunt, 0, 77);                 // no such path
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (Engine* e : {&a, &b})
    for (const auto& s : e->pathStats()) {
      EXPECT_EQ("up", s.state) << e->pathTable();
      EXPECT_EQ(0u, s.hunts) << e->pathTable();
      EXPECT_EQ(0u, s.errors) << e->pathTable();
    }
  // The control: the same engines, asked in place (the acceptor asks the
  // opener to move path 1), do re-open it and count it -- so the zeros
  // above are the messages being ignored, not hunting being off or unseen.
  b.sendControl(0, ControlType::kHuntAsk, 0, 1);
  const auto deadline = after(10);
  while (Clock::now() < deadline && (a.pathStats()[1].hunts == 0 || b.pathStats()[1].hunts == 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (Engine* e : {&a, &b}) {
    EXPECT_EQ(1u, e->pathStats()[1].hunts) << e->pathTable();
    EXPECT_EQ(0u, e->pathStats()[0].hunts) << e->pathTable();
  }
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
