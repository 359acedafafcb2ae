// Connections on first use: a group connects its ring neighbours at
// start-up and any other pair when an operation first needs it (the lower
// rank opens the paths, so both sides of the pair must ask); aborts reach
// ranks that have no paths to the rank that raised them. Ranks as threads
// over real loopback sockets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "collective_world.h"
#include "collectives/collectives.h"
#include "collectives/op.h"
#include "collectives/p2p.h"
#include "common/config.h"
#include "common/error.h"
#include "common/net.h"
#include "test_util.h"

namespace maestro {
namespace collectives {
namespace {

using testing::after;
using testing::errorText;
using testing::registered;
using testing::runRanks;
using testing::World;

std::map<std::string, std::string> twoPaths(std::string connect = "lazy") {
  return {{"paths", "2"}, {"chunk_size", "4K"}, {"segment_size", "16K"}, {"connect", connect}};
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The peers a rank connects to at start-up: its ring neighbours and its
// barrier partners, ranks 2^k apart either way.
std::vector<int> atStart(int r, int n) {
  std::vector<int> v;
  for (int d = 1; d < n; d *= 2)
    for (int q : {(r + d) % n, (r + n - d % n) % n})
      if (q != r && std::find(v.begin(), v.end(), q) == v.end()) v.push_back(q);
  return sorted(v);
}

TEST(Connect, RingAndBarrierPartnersAtStartTheRestOnFirstUse) {
  const int n = 6;
  World w(n, twoPaths());
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(atStart(r, n), sorted(w.engines[r]->activePeers())) << "rank " << r;
    EXPECT_EQ(4u, atStart(r, n).size());
    EXPECT_FALSE(w.engines[r]->connected((r + 3) % n));  // 3 apart: neither neighbours nor partners
    // Path statistics list the connected peers' paths only.
    EXPECT_EQ(8u, w.engines[r]->pathStats().size()) << "rank " << r;
  }
  // A ring collective and a barrier need nothing more.
  std::vector<std::vector<float>> data(n, std::vector<float>(10000, 1.0f));
  auto errors = runRanks(n, [&](int r) {
    Window win = registered(*w.engines[r], data[r]);
    allreduce(*w.engines[r], 1, win, data[r].size(), DType::kFloat32, ReduceOp::kSum, after(60));
    w.engines[r]->deregisterMemory(win.region);
    barrier(*w.engines[r], 2, after(60));
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
    EXPECT_EQ(float(n), data[r][9999]);
    EXPECT_EQ(atStart(r, n), sorted(w.engines[r]->activePeers())) << "rank " << r;
  }
  // All-to-all writes to every rank: every pair connects, and it is exact.
  const uint64_t count = 3000;  // elements per pair, several chunks each
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count * n)), out(n, std::vector<int32_t>(count * n, -1));
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (uint64_t i = 0; i < count; ++i) in[r][q * count + i] = r * 1000000 + q * 10000 + static_cast<int>(i);
  errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    Window input = registered(e, in[r]), output = registered(e, out[r]);
    std::vector<Window> ins, outs;
    for (int q = 0; q < n; ++q) {
      ins.push_back(Window{input.region, q * count * 4});
      outs.push_back(Window{output.region, q * count * 4});
    }
    alltoall(e, 3, ins, std::vector<uint64_t>(n, count), outs, std::vector<uint64_t>(n, count), DType::kInt32,
             after(60));
    e.deregisterMemory(input.region);
    e.deregisterMemory(output.region);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
    EXPECT_EQ(n - 1, static_cast<int>(w.engines[r]->activePeers().size())) << "rank " << r;
    for (int q = 0; q < n; ++q)
      if (q != r) EXPECT_TRUE(w.engines[r]->connected(q)) << "rank " << r << " to " << q;
    EXPECT_EQ(2u * (n - 1), w.engines[r]->pathStats().size()) << "rank " << r;
    for (int q = 0; q < n; ++q)
      for (uint64_t i : {0ul, count / 2, count - 1})
        ASSERT_EQ(q * 1000000 + r * 10000 + static_cast<int>(i), out[r][q * count + i])
            << "rank " << r << " from rank " << q << " element " << i;
  }
}

TEST(Connect, EagerConnectsEveryRankAtStart) {
  const int n = 5;
  World w(n, twoPaths("eager"));
  for (int r = 0; r < n; ++r) EXPECT_EQ(n - 1, static_cast<int>(w.engines[r]->activePeers().size())) << "rank " << r;
}

// Point to point between ranks that are not ring neighbours, the sender
// first and the receiver a while later, in both directions of a pair: the
// higher rank cannot open the pair's paths, so it waits for the lower one to
// ask (by its receive) -- and the message is neither lost nor an error.
TEST(Connect, PointToPointBetweenStrangersInEitherOrder) {
  const int n = 6;
  World w(n, twoPaths());
  std::vector<std::unique_ptr<PointToPoint>> p2p(n);
  for (int r = 0; r < n; ++r) p2p[r] = std::make_unique<PointToPoint>(*w.engines[r]);
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string error;
    PointToPoint::Done callback() {
      return [this](std::exception_ptr e, int) {
        std::lock_guard<std::mutex> lock(mu);
        error = errorText(e);
        done = true;
        cv.notify_all();
      };
    }
    std::string wait() {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; })) return "hung";
      return error;
    }
  };
  const size_t bytes = 100000;
  // (sender, receiver): higher to lower, then lower to higher.
  for (auto [from, to] : {std::pair<int, int>{4, 1}, std::pair<int, int>{2, 5}}) {
    ASSERT_FALSE(w.engines[from]->connected(to));
    std::vector<uint8_t> src(bytes), dst(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + from);
    Window s{w.engines[from]->registerMemory(src.data(), bytes), 0};
    Window d{w.engines[to]->registerMemory(dst.data(), bytes), 0};
    Outcome sent, got;
    p2p[from]->send(to, 3, s, bytes, after(60), sent.callback());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the receiver comes late
    p2p[to]->recv(from, 3, d, bytes, after(60), got.callback());
    EXPECT_EQ("", sent.wait());
    EXPECT_EQ("", got.wait());
    EXPECT_TRUE(dst == src) << from << " -> " << to;
    EXPECT_TRUE(w.engines[from]->connected(to));
    w.engines[from]->deregisterMemory(s.region);
    w.engines[to]->deregisterMemory(d.region);
  }
  for (auto& p : p2p) p.reset();
}

// Rank 0 calls the collective with another size. Only its ring neighbours
// see the mismatch in the handshake; ranks 3 and 5 have no paths to rank 0
// and wait for data from their neighbours. The abort is passed on from rank
// to rank, so every rank fails with the reason, not the timeout.
TEST(Connect, AnAbortReachesRanksWithoutPathsToItsOrigin) {
  const int n = 8;
  World w(n, twoPaths());
  std::vector<std::vector<float>> data(n, std::vector<float>(20000, 1.0f));
  auto errors = runRanks(n, [&](int r) {
    Window win = registered(*w.engines[r], data[r]);
    const uint64_t count = r == 0 ? 19999 : 20000;
    try {
      allreduce(*w.engines[r], 1, win, count, DType::kFloat32, ReduceOp::kSum, after(120));
    } catch (...) {
      w.engines[r]->deregisterMemory(win.region);
      throw;
    }
    w.engines[r]->deregisterMemory(win.region);
  });
  for (int r = 0; r < n; ++r) {
    const std::string msg = errorText(errors[r]);
    EXPECT_NE(std::string::npos, msg.find("different collectives")) << "rank " << r << ": " << msg;
    EXPECT_EQ(std::string::npos, msg.find("timed out")) << "rank " << r << ": " << msg;
    // Nobody connected to rank 0 to be told.
    if (r == 3 || r == 5) EXPECT_FALSE(w.engines[r]->connected(0)) << "rank " << r;
  }
}

// Each rank leaves as soon as its operation returns. A rank may hear its
// new partner's descriptor before its own descriptor to it has left (it
// waits for the pair to connect): the operation returns only once it has,
// or a process that exits right after would take it along.
TEST(Connect, AnExchangeOnNewPairsThenEveryRankLeaves) {
  for (int round = 0; round < 10; ++round) {
    const int n = 6;
    World w(n, twoPaths());
    auto errors = runRanks(n, [&](int r) {
      // An all-to-all of nothing: the handshake with every rank is all of it.
      alltoall(*w.engines[r], 1, std::vector<Window>(n), std::vector<uint64_t>(n, 0), std::vector<Window>(n),
               std::vector<uint64_t>(n, 0), DType::kInt32, after(30));
      MAESTRO_CHECK(w.engines[r]->awaitQueued(1, Clock::now()), "a descriptor still waits for its pair");
      w.engines[r].reset();
    });
    // A failed rank kept its engine: its path table says which connections
    // it saw up and why they went down.
    for (int r = 0; r < n; ++r)
      ASSERT_EQ("", errorText(errors[r])) << "round " << round << " rank " << r << "; its paths:\n"
                                          << (w.engines[r] ? w.engines[r]->pathTable() : std::string("(left)"));
  }
}

// An operation looks at its progress (step) and at the reachability of the
// peers it waits for (depends) several times a round. A peer that sends its
// last message and leaves (goodbye, close) between any two of those looks
// must not fail it: a peer is marked unreachable only after all it sent has
// been delivered, so the message is there for the next look. The neighbour
// that finishes first and destroys its group does exactly this; when the
// mark fell between the operation's reachability check and its health check,
// an all-to-all of nothing failed with "rank 0 has shut down its process
// group" about 1 round in 300 under TSan.
TEST(Connect, APeerThatLeavesRightAfterItsLastMessageFailsNoLookOfTheOperation) {
  using multipath::ControlType;
  // Every look of the first round (the connect, then the round's own).
  for (int at = 1; at <= 4; ++at) {
    World w(2, twoPaths());
    multipath::Engine& me = *w.engines[0];
    int looks = 0;
    auto look = [&] {
      if (++looks != at) return;
      w.engines[1]->sendControl(0, ControlType::kDesc, 1, 0);
      w.engines[1].reset();  // goodbye on every path, then the close
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (me.reachable(1) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_FALSE(me.reachable(1)) << "rank 1 left 20 s ago";
    };
    std::string error;
    try {
      OpContext ctx(me, 1, opDesc(OpKind::kBarrier, DType::kFloat32, 0), after(20));
      ctx.run(
          [&] {
            const bool took = me.takeControl(1, {ControlType::kDesc, 1, 0}, nullptr);
            look();  // after it looked: what lands now is for the next look
            return took;
          },
          [] { return std::string("rank 1's message"); },
          [&] {
            look();
            return std::vector<int>{1};
          });
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_EQ("", error) << "rank 1 left at look " << at;
    EXPECT_GE(looks, at);
  }
}

// A store that hands the other ranks a different endpoint for one path of
// one rank (a listener that takes the connection and never answers its
// hello): that path's connect hangs until the connect timeout.
class SwappedEndpoint : public testing::MemoryRendezvous {
 public:
  SwappedEndpoint(int rank, size_t path) : rank_(rank), path_(path) {}
  ~SwappedEndpoint() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void set(const std::string& key, const std::string& value) override {
    if (key != strcat("maestro/endpoints/", rank_)) return MemoryRendezvous::set(key, value);
    std::vector<std::string> list = splitList(value.substr(3));  // "ok:" + the endpoints
    const std::string ip = list.at(path_).substr(0, list.at(path_).rfind(':'));
    fd_ = net::listenOn(ip, 0);
    list[path_] = strcat(ip, ":", net::localAddress(fd_).port());
    std::string joined;
    for (const auto& e : list) joined += (joined.empty() ? "" : ",") + e;
    MemoryRendezvous::set(key, "ok:" + joined);
  }

 private:
  const int rank_;
  const size_t path_;
  int fd_ = -1;
};

// A peer that exits while its pair connects closes the connections that
// came up before this side installed its paths: they are down from the
// install on, so the peer is failed then -- not taken for a silent one and
// waited on for the peer timeout.
TEST(Connect, APeerThatExitsWhileItsPairConnectsIsFailedOnceItsPathsAreInstalled) {
  const int n = 6;  // ranks 0 and 3 are neither ring neighbours nor barrier partners: they connect on first use
  auto opts = twoPaths();
  opts["connect_timeout"] = "2";
  opts["peer_timeout"] = "60";
  SwappedEndpoint store(3, 1);
  std::vector<std::unique_ptr<multipath::Engine>> engines(n);
  auto errors = runRanks(n, [&](int r) { engines[r] = std::make_unique<multipath::Engine>(opts, store, r, n, after(30)); });
  for (auto& e : errors) ASSERT_EQ("", errorText(e));
  multipath::Engine& me = *engines[0];
  ASSERT_FALSE(me.connected(3));
  const auto start = Clock::now();
  me.connect(3);  // path 0 connects; path 1's hello waits for the connect timeout
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  engines[3].reset();  // closes path 0 before rank 0 has installed its paths
  std::string error;
  while (error.empty() && Clock::now() < start + std::chrono::seconds(15)) {
    try {
      me.checkPeer(3);
      me.waitEvent(me.eventCount(), after(0.05));
    } catch (const Error& e) {
      error = e.what();
    }
  }
  EXPECT_NE(std::string::npos, error.find("rank 3")) << error;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 8) << "failed at the connect timeout (2 s), not a peer timeout: " << error;
}

}  // namespace
}  // namespace collectives
}  // namespace maestro
