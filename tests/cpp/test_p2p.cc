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
  World(int n, uint64_t piece = 0) : engines(n), p2p(n) {
    std::map<std::string, std::string> opts{{"chunk_size", "4K"}, {"paths", "4"}};
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

TEST(P2PErrors, SizeMismatchFailsBothSides) {
  World w(2);
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
  // Both still exchange afterwards.
  errors = runRanks(2, [&](int r) {
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

}  // namespace
}  // namespace collectives
}  // namespace maestro
