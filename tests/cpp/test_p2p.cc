// Point to point over the multipath engine, ranks as threads over four
// loopback paths: exchanges of every size land exactly; messages are cut
// into pieces and wait for free tags when many are in flight; same-tag
// messages match in order, also from any source; mismatched sizes, bad ranks
// and unmatched messages end in errors, not hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "collectives/p2p.h"
#include "common/error.h"
#include "multipath/engine.h"
#include "test_util.h"

namespace maestro {
namespace collectives {
namespace {

using testing::after;
using testing::errorText;
using testing::MemoryRendezvous;
using testing::runRanks;

struct World {
  World(int n, uint64_t piece = 0, std::map<std::string, std::string> extra = {}) : engines(n), p2p(n) {
    std::map<std::string, std::string> opts{{"chunk_size", "4K"}, {"paths", "4"}};
    for (const auto& kv : extra) opts[kv.first] = kv.second;
    auto errors = runRanks(n, [&](int r) {
      engines[r] = std::make_unique<multipath::Engine>(opts, store, r, n, after(30));
      p2p[r] = std::make_unique<PointToPoint>(*engines[r], piece);
    });
    for (auto& e : errors) EXPECT_EQ("", errorText(e));
  }
  ~World() {
    for (auto& p : p2p) p.reset();
  }
  MemoryRendezvous store;
  std::vector<std::unique_ptr<multipath::Engine>> engines;
  std::vector<std::unique_ptr<PointToPoint>> p2p;
};

// A message's outcome, waited for by the test thread.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  int source = -2;
  PointToPoint::Done callback() {
    return [this](std::exception_ptr e, int src) {
      std::lock_guard<std::mutex> lock(mu);
      error = errorText(e);
      source = src;
      done = true;
      cv.notify_all();
    };
  }
  std::string wait(double seconds = 60) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; })) return "hung";
    return error;
  }
};

struct Buffer {
  Buffer(multipath::Engine& e, size_t bytes, uint8_t fill) : engine(e), data(bytes, fill) {
    if (bytes) window = Window{e.registerMemory(data.data(), bytes), 0};
  }
  void fill(const std::vector<uint8_t>& v) { std::copy(v.begin(), v.end(), data.begin()); }  // in place: registered
  ~Buffer() {
    if (window.region.valid()) engine.deregisterMemory(window.region);
  }
  multipath::Engine& engine;
  std::vector<uint8_t> data;
  Window window;
};

std::vector<uint8_t> pattern(size_t bytes, int rank, int salt = 0) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>((i * 131 + rank * 17 + salt * 7) % 251);
  return v;
}

class P2P : public ::testing::TestWithParam<int> {};

TEST_P(P2P, RingExchangeOfEverySize) {
  const int n = GetParam();
  World w(n);
  for (size_t bytes : {0ul, 1ul, 4095ul, 4097ul, 300001ul, 3ul << 20}) {
    auto errors = runRanks(n, [&](int r) {
      auto& e = *w.engines[r];
      Buffer out(e, bytes, 0), in(e, bytes, 0xAA);
      out.fill(pattern(bytes, r));
      Outcome sent, got;
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      // Half the ranks post the recv first, half the send.
      if (r % 2) w.p2p[r]->recv(left, 7, in.window, bytes, after(30), got.callback());
      w.p2p[r]->send(right, 7, out.window, bytes, after(30), sent.callback());
      if (r % 2 == 0) w.p2p[r]->recv(left, 7, in.window, bytes, after(30), got.callback());
      MAESTRO_CHECK(sent.wait() == "", "send: ", sent.error);
      MAESTRO_CHECK(got.wait() == "", "recv: ", got.error);
      MAESTRO_CHECK(got.source == left, "source ", got.source);
      MAESTRO_CHECK(in.data == pattern(bytes, left), "rank ", r, ": wrong bytes from rank ", left);
    });
    for (auto& err : errors) ASSERT_EQ("", errorText(err)) << bytes << " bytes";
  }
}

TEST_P(P2P, SameTagMatchesInOrderAlsoFromAnySource) {
  const int n = GetParam();
  World w(n);
  const int kMessages = 6;
  auto errors = runRanks(n, [&](int r) {
    auto& e = *w.engines[r];
    if (r != 0) {
      // Tags 1, 2, 1, 2, ...: each tag's messages in order.
      std::vector<std::unique_ptr<Buffer>> bufs;
      std::vector<std::unique_ptr<Outcome>> outs;
      for (int i = 0; i < kMessages; ++i) {
        bufs.push_back(std::make_unique<Buffer>(e, 1000, 0));
        bufs.back()->fill(pattern(1000, r, i));
        outs.push_back(std::make_unique<Outcome>());
        w.p2p[r]->send(0, 1 + i % 2, bufs.back()->window, 1000, after(30), outs.back()->callback());
      }
      for (auto& o : outs) MAESTRO_CHECK(o->wait() == "", o->error);
      return;
    }
    // Rank 0: tag 2 first from each sender, then tag 1 from any source.
    for (int q = 1; q < n; ++q)
      for (int i = 1; i < kMessages; i += 2) {
        Buffer in(e, 1000, 0);
        Outcome o;
        w.p2p[0]->recv(q, 2, in.window, 1000, after(30), o.callback());
        MAESTRO_CHECK(o.wait() == "", o.error);
        MAESTRO_CHECK(in.data == pattern(1000, q, i), "tag 2 message ", i, " from rank ", q, " out of order");
      }
    std::vector<int> next(n, 0);
    for (int k = 0; k < (n - 1) * kMessages / 2; ++k) {
      Buffer in(e, 1000, 0);
      Outcome o;
      w.p2p[0]->recv(-1, 1, in.window, 1000, after(30), o.callback());
      MAESTRO_CHECK(o.wait() == "", o.error);
      MAESTRO_CHECK(o.source > 0 && o.source < n, "source ", o.source);
      MAESTRO_CHECK(in.data == pattern(1000, o.source, next[o.source]), "tag 1 from rank ", o.source,
                    " out of order");
      next[o.source] += 2;
    }
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
}

INSTANTIATE_TEST_SUITE_P(Ranks, P2P, ::testing::Values(2, 3), [](const auto& i) {
  return std::to_string(i.param) + "ranks";
});

TEST(P2PPieces, ManyPiecesWaitForFreeTags) {
  // 8 messages of 300 pieces in flight at once need 2400 tags, more than a
  // receiver has for one sender: later ones wait until earlier ones finish.
  World w(2, /*piece=*/4096);
  const size_t bytes = 300 * 4096 - 5;
  const int kMessages = 8;
  auto errors = runRanks(2, [&](int r) {
    auto& e = *w.engines[r];
    std::vector<std::unique_ptr<Buffer>> bufs;
    std::vector<std::unique_ptr<Outcome>> outs;
    for (int i = 0; i < kMessages; ++i) {
      bufs.push_back(std::make_unique<Buffer>(e, bytes, 0));
      outs.push_back(std::make_unique<Outcome>());
      if (r == 0) {
        bufs.back()->fill(pattern(bytes, 0, i));
        w.p2p[0]->send(1, 3, bufs.back()->window, bytes, after(60), outs.back()->callback());
      } else {
        w.p2p[1]->recv(0, 3, bufs.back()->window, bytes, after(60), outs.back()->callback());
      }
    }
    for (int i = 0; i < kMessages; ++i) {
      MAESTRO_CHECK(outs[i]->wait() == "", "message ", i, ": ", outs[i]->error);
      if (r == 1) MAESTRO_CHECK(bufs[i]->data == pattern(bytes, 0, i), "message ", i, " wrong");
    }
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
}

// Rank 0 sends 100 bytes, rank 1's recv has 99: both fail, naming both sizes.
void mismatchedSizes(World& w) {
  auto errors = runRanks(2, [&](int r) {
    auto& e = *w.engines[r];
    Buffer b(e, r == 0 ? 100 : 99, 1);
    Outcome o;
    if (r == 0) w.p2p[0]->send(1, 0, b.window, 100, after(30), o.callback());
    else w.p2p[1]->recv(0, 0, b.window, 99, after(30), o.callback());
    std::string err = o.wait();
    MAESTRO_CHECK(err.find("100") != std::string::npos && err.find("99") != std::string::npos, "rank ", r, ": '",
                  err, "'");
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
}

TEST(P2PErrors, SizeMismatchFailsBothSides) {
  World w(2);
  mismatchedSizes(w);
  // Both still exchange afterwards.
  auto errors = runRanks(2, [&](int r) {
    auto& e = *w.engines[r];
    Buffer b(e, 64, static_cast<uint8_t>(r));
    Outcome o;
    if (r == 0) w.p2p[0]->send(1, 0, b.window, 64, after(30), o.callback());
    else w.p2p[1]->recv(0, 0, b.window, 64, after(30), o.callback());
    MAESTRO_CHECK(o.wait() == "", o.error);
    MAESTRO_CHECK(b.data == std::vector<uint8_t>(64, 0), "rank ", r);
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
}

TEST(P2PErrors, BadRanksAndUnmatchedMessages) {
  World w(2);
  auto& e = *w.engines[0];
  Buffer b(e, 8, 0);
  auto noop = [](std::exception_ptr, int) {};
  EXPECT_THROW(w.p2p[0]->send(0, 0, b.window, 8, after(5), noop), Error);
  EXPECT_THROW(w.p2p[0]->send(2, 0, b.window, 8, after(5), noop), Error);
  EXPECT_THROW(w.p2p[0]->recv(0, 0, b.window, 8, after(5), noop), Error);
  EXPECT_THROW(w.p2p[0]->recv(-2, 0, b.window, 8, after(5), noop), Error);
  // Nobody answers: both time out, with the peer named.
  Outcome s, rv;
  w.p2p[0]->send(1, 5, b.window, 8, after(0.5), s.callback());
  Buffer b2(e, 8, 0);
  w.p2p[0]->recv(-1, 6, b2.window, 8, after(0.5), rv.callback());
  EXPECT_NE(std::string::npos, s.wait(10).find("did not post a matching recv"));
  EXPECT_NE(std::string::npos, rv.wait(10).find("timed out"));
  // Rank 1 posts a recv for the send that gave up: it fails instead of waiting.
  Buffer b3(*w.engines[1], 8, 0);
  Outcome late;
  w.p2p[1]->recv(0, 5, b3.window, 8, after(20), late.callback());
  EXPECT_NE(std::string::npos, late.wait(30).find("gave up its send")) << late.error;
}

// ---------------------------------------------------------------- eager

// One message from `from` to `to` (both threads' parts; the other ranks do
// nothing): the recv posted first or the send, the received bytes checked.
void exchange(World& w, int from, int to, size_t bytes, uint32_t tag, int salt, bool recv_first) {
  auto errors = runRanks(static_cast<int>(w.engines.size()), [&](int r) {
    if (r != from && r != to) return;
    auto& e = *w.engines[r];
    Buffer b(e, bytes, 0x55);
    Outcome o;
    if (r == from) {
      b.fill(pattern(bytes, from, salt));
      if (recv_first) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      w.p2p[r]->send(to, tag, b.window, bytes, after(30), o.callback());
    } else {
      if (!recv_first) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      w.p2p[r]->recv(from, tag, b.window, bytes, after(30), o.callback());
    }
    MAESTRO_CHECK(o.wait() == "", "rank ", r, ": ", o.error);
    if (r == to) MAESTRO_CHECK(b.data == pattern(bytes, from, salt), "wrong bytes, message ", salt);
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err)) << bytes << " bytes, message " << salt;
}

// The pair's first message goes by rendezvous and lends the sender its
// slots; small ones after it go eager, the recv posted before or after, and
// one above the slot size by rendezvous again; every byte exact.
TEST(P2PEager, SmallMessagesAfterThePairsFirstGoEager) {
  World w(2);
  exchange(w, 0, 1, 100, 1, 0, true);
  EXPECT_EQ(0u, w.p2p[0]->eagerSent()) << "no slots are lent before the pair's first GRANT";
  int salt = 1;
  for (size_t bytes : {1ul, 4095ul, 4097ul, 65536ul})
    for (bool recv_first : {true, false}) exchange(w, 0, 1, bytes, 1, salt++, recv_first);
  EXPECT_EQ(8u, w.p2p[0]->eagerSent());
  exchange(w, 0, 1, 65537, 1, salt++, true);  // larger than a slot
  exchange(w, 0, 1, 0, 1, salt++, true);      // empty: nothing to write
  EXPECT_EQ(8u, w.p2p[0]->eagerSent());
  exchange(w, 1, 0, 64, 1, salt++, true);  // the other direction: its own first GRANT
  exchange(w, 1, 0, 64, 1, salt++, false);
  EXPECT_EQ(1u, w.p2p[1]->eagerSent());
}

TEST(P2PEager, OffMeansEveryMessageByRendezvous) {
  World w(2, 0, {{"eager_size", "0"}});
  for (int i = 0; i < 4; ++i) exchange(w, 0, 1, 1000, 1, i, i % 2);
  EXPECT_EQ(0u, w.p2p[0]->eagerSent());
}

// More sends than slots before any recv: the first go eager, the rest wait
// for the receiver's buffer; the recvs, posted later, take them all in order.
TEST(P2PEager, MoreMessagesThanSlotsStayInOrder) {
  World w(2);
  exchange(w, 0, 1, 100, 1, 0, true);
  const int kMessages = 3 * PointToPoint::kEagerSlots;
  auto errors = runRanks(2, [&](int r) {
    auto& e = *w.engines[r];
    std::vector<std::unique_ptr<Buffer>> bufs;
    std::vector<std::unique_ptr<Outcome>> outs;
    for (int i = 0; i < kMessages; ++i) {
      bufs.push_back(std::make_unique<Buffer>(e, 3000, 0));
      outs.push_back(std::make_unique<Outcome>());
      if (r == 0) {
        bufs.back()->fill(pattern(3000, 0, i));
        w.p2p[0]->send(1, 9, bufs.back()->window, 3000, after(30), outs.back()->callback());
      }
    }
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // every send posted, none taken
      for (int i = 0; i < kMessages; ++i)
        w.p2p[1]->recv(0, 9, bufs[i]->window, 3000, after(30), outs[i]->callback());
    }
    for (int i = 0; i < kMessages; ++i) {
      MAESTRO_CHECK(outs[i]->wait() == "", "message ", i, ": ", outs[i]->error);
      if (r == 1) MAESTRO_CHECK(bufs[i]->data == pattern(3000, 0, i), "message ", i, " wrong or out of order");
    }
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
  EXPECT_GE(w.p2p[0]->eagerSent(), static_cast<uint64_t>(PointToPoint::kEagerSlots));
  EXPECT_LT(w.p2p[0]->eagerSent(), static_cast<uint64_t>(kMessages)) << "more eager messages than slots";
  // Every slot came back: a long run of eager messages goes on.
  const uint64_t before = w.p2p[0]->eagerSent();
  for (int i = 0; i < 3 * PointToPoint::kEagerSlots; ++i) exchange(w, 0, 1, 64, 2, i, i % 2);
  EXPECT_GT(w.p2p[0]->eagerSent(), before);
}

// An eager message whose recv has another size fails both sides, naming
// both sizes; its slot comes back.
TEST(P2PEager, ASizeMismatchFailsBothSidesAndTheSlotComesBack) {
  World w(2);
  exchange(w, 0, 1, 100, 1, 0, true);
  for (int round = 0; round < 2 * PointToPoint::kEagerSlots; ++round) {
    SCOPED_TRACE(round);
    mismatchedSizes(w);
  }
  EXPECT_GE(w.p2p[0]->eagerSent(), static_cast<uint64_t>(PointToPoint::kEagerSlots) + 1) << "slots not given back";
  exchange(w, 0, 1, 64, 0, 1, true);
}

// An eager send no recv takes gives up at its deadline, after its write is
// over, and tells the receiver, which drops it: a recv posted later takes
// the next message. Its slot comes back: the counts of released slots ride
// on the receiver's next GRANT or ACCEPT, so once every slot was taken by
// a send that gave up, one message goes by rendezvous and the next eager.
TEST(P2PEager, ASendNoRecvTookGivesUpAndIsNotSeenLater) {
  World w(2);
  exchange(w, 0, 1, 100, 1, 0, true);
  auto& e0 = *w.engines[0];
  for (int i = 0; i < PointToPoint::kEagerSlots; ++i) {
    Buffer b(e0, 8, 0);
    Outcome s;
    w.p2p[0]->send(1, 5, b.window, 8, after(0.3), s.callback());
    EXPECT_NE(std::string::npos, s.wait(10).find("did not post a matching recv")) << s.error;
  }
  EXPECT_EQ(static_cast<uint64_t>(PointToPoint::kEagerSlots), w.p2p[0]->eagerSent());
  exchange(w, 0, 1, 48, 5, 7, false);  // no slot known free: rendezvous; the recv takes this one
  EXPECT_EQ(static_cast<uint64_t>(PointToPoint::kEagerSlots), w.p2p[0]->eagerSent());
  exchange(w, 0, 1, 48, 5, 8, true);  // its GRANT gave the slots back
  EXPECT_EQ(static_cast<uint64_t>(PointToPoint::kEagerSlots) + 1, w.p2p[0]->eagerSent());
}

// A path closed while eager messages flow both ways: their chunks go again
// on the other paths; every message exact, none lost or taken twice.
TEST(P2PEager, APathClosedMidStreamLosesNothing) {
  World w(2);
  exchange(w, 0, 1, 100, 1, 0, true);
  exchange(w, 1, 0, 100, 1, 0, true);
  const int kRounds = 400;
  std::atomic<bool> closed{false};
  auto errors = runRanks(2, [&](int r) {
    auto& e = *w.engines[r];
    Buffer out(e, 20000, 0), in(e, 20000, 0);
    for (int i = 0; i < kRounds; ++i) {
      if (r == 0 && i == kRounds / 3) {
        e.transport().closePath(1, 0, "closed by the test");
        closed = true;
      }
      out.fill(pattern(20000, r, i));
      Outcome s, g;
      w.p2p[r]->recv(1 - r, 3, in.window, 20000, after(30), g.callback());
      w.p2p[r]->send(1 - r, 3, out.window, 20000, after(30), s.callback());
      MAESTRO_CHECK(s.wait() == "", "rank ", r, " send ", i, ": ", s.error);
      MAESTRO_CHECK(g.wait() == "", "rank ", r, " recv ", i, ": ", g.error);
      MAESTRO_CHECK(in.data == pattern(20000, 1 - r, i), "rank ", r, ": message ", i, " wrong");
    }
  });
  for (auto& err : errors) ASSERT_EQ("", errorText(err));
  EXPECT_TRUE(closed);
  EXPECT_GT(w.p2p[0]->eagerSent(), static_cast<uint64_t>(kRounds / 2));
}

}  // namespace
}  // namespace collectives
}  // namespace maestro
