// Shared paths: subgroups send on the paths of the default group, each on a
// channel of its own, and run beside it and beside each other. Ranks as
// threads over real loopback sockets; every rank of every group is one
// engine, as in a process per rank.
#include <gtest/gtest.h>
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "collectives/collectives.h"
#include "collectives/p2p.h"
#include "common/error.h"
#include "collective_world.h"
#include "test_util.h"

namespace maestro {
namespace collectives {
namespace {

using multipath::Engine;
using testing::after;
using testing::errorText;
using testing::maestroThreads;
using testing::MemoryRendezvous;
using testing::registered;
using testing::runRanks;

std::map<std::string, std::string> twoPaths() {
  return {{"paths", "2"}, {"chunk_size", "4K"}, {"segment_size", "16K"}};
}

size_t entries(const char* dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}
size_t openDescriptors() { return entries("/proc/self/fd"); }

using Engines = std::vector<std::shared_ptr<Engine>>;

Engines world(int n, const std::map<std::string, std::string>& opts, MemoryRendezvous& store) {
  Engines e(n);
  auto errors = runRanks(n, [&](int r) { e[r] = std::make_shared<Engine>(opts, store, r, n, after(30)); });
  for (auto& x : errors) EXPECT_EQ("", errorText(x));
  return e;
}

// The group of `members` (world ranks, in the group's order) over `parent`:
// entry r is the engine of group rank r (null for ranks not in it).
Engines subgroup(const Engines& parent, const std::vector<int>& members, const std::map<std::string, std::string>& opts,
                 MemoryRendezvous& store) {
  const int n = static_cast<int>(members.size());
  Engines e(n);
  auto errors = runRanks(n, [&](int r) {
    e[r] = std::make_shared<Engine>(opts, store, r, n, after(30), "", Engine::Parent{parent[members[r]], members});
  });
  for (auto& x : errors) EXPECT_EQ("", errorText(x));
  return e;
}

// Allreduce on every rank of `g` at once: rank r adds r + 1 + base.
void allreduceOn(Engines& g, uint64_t seq, size_t count, float base) {
  const int n = static_cast<int>(g.size());
  std::vector<std::vector<float>> data(n);
  for (int r = 0; r < n; ++r) data[r].assign(count, float(r + 1) + base);
  auto errors = runRanks(n, [&](int r) {
    Window win = registered(*g[r], data[r]);
    allreduce(*g[r], seq, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
    g[r]->deregisterMemory(win.region);
  });
  const float want = float(n) * (n + 1) / 2 + n * base;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(want, data[r][i]) << "rank " << r << " element " << i;
    ASSERT_EQ(want, data[r][count - 1]);
  }
}

TEST(SharedPaths, SubgroupsRunBesideTheWorldOnItsPathsOnly) {
  const int n = 4;
  MemoryRendezvous ws, evens_store, odds_store, rev_store;
  Engines w = world(n, twoPaths(), ws);
  for (auto& e : w) EXPECT_EQ(0u, e->channel());
  // Threads by name, maestro's long-lived ones only: the process's own count
  // also holds the threads that just ended (the ranks' threads, the world's
  // connect helpers) until the kernel reaps them.
  const size_t fds = openDescriptors();
  const auto threads = maestroThreads();
  Engines evens = subgroup(w, {0, 2}, twoPaths(), evens_store);
  Engines odds = subgroup(w, {1, 3}, twoPaths(), odds_store);
  auto ring = twoPaths();
  ring["algo"] = "allreduce:ring";  // the statistics below are the ring's (the tuner would take another)
  Engines rev = subgroup(w, {3, 2, 1, 0}, ring, rev_store);
  // One channel per group on each rank: evens and odds share no rank, so
  // both take the first free one; the reversed group the next.
  for (auto& e : evens) EXPECT_EQ(1u, e->channel());
  for (auto& e : odds) EXPECT_EQ(1u, e->channel());
  for (auto& e : rev) EXPECT_EQ(2u, e->channel());
  EXPECT_EQ(fds, openDescriptors()) << "a group on shared paths opened sockets";
  EXPECT_EQ(threads, maestroThreads()) << "a group on shared paths started threads (the owner's monitor ticks it)";
  for (auto& e : rev) EXPECT_EQ(2, e->paths());
  // Every group at once, several times over: each result is exact.
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> groups;
    std::vector<std::string> failed(4);
    auto run = [&](int i, Engines& g, float base) {
      groups.emplace_back([&, i, base] {
        try {
          allreduceOn(g, 1 + round, 30000 + 1000 * i, base);
          if (::testing::Test::HasFatalFailure()) failed[i] = "wrong result";
        } catch (const std::exception& e) {
          failed[i] = e.what();
        }
      });
    };
    run(0, w, 0);
    run(1, evens, 100);
    run(2, odds, 200);
    run(3, rev, 300);
    for (auto& t : groups) t.join();
    for (int i = 0; i < 4; ++i) EXPECT_EQ("", failed[i]) << "group " << i << " round " << round;
  }
  EXPECT_EQ(fds, openDescriptors());
  // Path statistics are the group's own view, peers named in its ranks:
  // its ring sends to group rank 1 only (world rank 2).
  auto stats = rev[0]->pathStats();
  ASSERT_EQ(6u, stats.size());
  for (const auto& s : stats) {
    EXPECT_EQ("up", s.state);
    EXPECT_EQ(s.peer == 1, s.chunks_sent > 0) << "peer " << s.peer << " path " << s.path;
  }
}

TEST(SharedPaths, PairsTheWorldHasNotConnectedConnectThroughIt) {
  // Eight ranks connect at start-up to ranks 1, 2 and 4 away; a group in
  // steps of 3 has ring neighbours 3 and 5 away.
  const int n = 8;
  MemoryRendezvous ws, gs;
  Engines w = world(n, twoPaths(), ws);
  for (int r = 0; r < n; ++r) ASSERT_FALSE(w[r]->connected((r + 3) % n));
  std::vector<int> members;
  for (int i = 0; i < n; ++i) members.push_back(i * 3 % n);
  Engines g = subgroup(w, members, twoPaths(), gs);
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(0u, g[r]->channel());
    // Its ring neighbours are connected, by the world, at the group's start.
    EXPECT_TRUE(w[members[r]]->connected(members[(r + 1) % n])) << "rank " << r;
    EXPECT_TRUE(g[r]->connected((r + 1) % n));
  }
  allreduceOn(g, 1, 50000, 0);
  // All-to-all through the group: every pair, each through the world.
  const uint64_t count = 2000;
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count * n)), out(n, std::vector<int32_t>(count * n, -1));
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (uint64_t i = 0; i < count; ++i) in[r][q * count + i] = r * 1000000 + q * 10000 + static_cast<int>(i);
  auto errors = runRanks(n, [&](int r) {
    auto& e = *g[r];
    Window input = registered(e, in[r]), output = registered(e, out[r]);
    std::vector<Window> ins, outs;
    std::vector<uint64_t> counts(n, count);
    for (int q = 0; q < n; ++q) {
      ins.push_back(Window{input.region, q * count * sizeof(int32_t)});
      outs.push_back(Window{output.region, q * count * sizeof(int32_t)});
    }
    alltoall(e, 2, ins, counts, outs, counts, DType::kInt32, after(60));
    e.deregisterMemory(input.region);
    e.deregisterMemory(output.region);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
    for (int q = 0; q < n; ++q)
      ASSERT_EQ(q * 1000000 + r * 10000 + 1999, out[r][q * count + count - 1]) << r << " from " << q;
    for (int q = 0; q < n; ++q) EXPECT_TRUE(q == members[r] || w[members[r]]->connected(q));
  }
}

TEST(SharedPaths, OtherPathKnobsOrTheKnobOffOpenPathsOfTheirOwn) {
  const int n = 2;
  MemoryRendezvous ws, a, b;
  Engines w = world(n, twoPaths(), ws);
  auto one_path = twoPaths();
  one_path["paths"] = "1";
  Engines g1 = subgroup(w, {0, 1}, one_path, a);
  auto off = twoPaths();
  off["share_paths"] = "0";
  Engines g2 = subgroup(w, {1, 0}, off, b);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(0u, g1[r]->channel());
    EXPECT_EQ(1, g1[r]->paths());
    EXPECT_EQ(0u, g2[r]->channel());
  }
  allreduceOn(g1, 1, 20000, 0);
  allreduceOn(g2, 1, 20000, 0);
}

TEST(SharedPaths, AGroupOutlivesTheDefaultGroupsHandleAndChannelsAreReused) {
  const int n = 3;
  MemoryRendezvous ws, a, b, c;
  Engines w = world(n, twoPaths(), ws);
  {
    Engines g = subgroup(w, {2, 0, 1}, twoPaths(), a);
    for (auto& e : g) EXPECT_EQ(1u, e->channel());
    allreduceOn(g, 1, 10000, 0);
  }  // gone: its channel is free again
  Engines g = subgroup(w, {1, 2, 0}, twoPaths(), b);
  for (auto& e : g) EXPECT_EQ(1u, e->channel());
  Engines split = subgroup(g, {0, 2}, twoPaths(), c);  // a subgroup of a subgroup: still the world's paths
  for (auto& e : split) EXPECT_EQ(2u, e->channel());
  w.clear();  // the default group's handles go; the paths stay for the groups on them
  allreduceOn(g, 1, 10000, 0);
  allreduceOn(split, 1, 10000, 5);
  std::vector<std::exception_ptr> errors = runRanks(n, [&](int r) { barrier(*g[r], 2, after(30)); });
  for (auto& e : errors) EXPECT_EQ("", errorText(e));
}

TEST(SharedPaths, APathThatFailsUnderAGroupFailsOverAndComesBack) {
  const int n = 2;
  MemoryRendezvous ws, gs;
  Engines w = world(n, twoPaths(), ws);
  Engines g = subgroup(w, {1, 0}, twoPaths(), gs);
  // World rank 0's path 0 to world rank 1 is closed under the group: there
  // it is group rank 1's path 0 to group rank 0.
  Engine& closer_side = *g[1];
  const int closed_peer = 0, closed_path = 0, other_path = 1;
  const size_t count = 4 << 20;  // 16 MiB each way
  // Every element its own value on each rank (small integers: exact in
  // float32, and so is their sum): a chunk that lands at the wrong place,
  // or is reduced twice after it was sent again, shows.
  auto value = [](int r, size_t i) { return float((i * (r + 1) + 389 * r) % 1009 + r); };
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) data[r][i] = value(r, i);
  auto slot = [](Engine& e, int peer, int path) {
    for (const auto& s : e.pathStats())
      if (s.peer == peer && s.path == path) return s;
    ADD_FAILURE() << "no path " << path << " to peer " << peer;
    return multipath::PathStats{};
  };
  // The path is closed while the allreduce provably moves data on it, not
  // after a guessed delay. Two ranks run one ring step each way: each rank
  // sends its half of the tensor in the reduce-scatter, then its reduced
  // half in the allgather, in chunks. The reduce-scatter is paced by its
  // scratch credits, so its paths may all be idle for a moment (every chunk
  // acknowledged, the next credit not back yet); the allgather's segments
  // are all ready by then and queue up behind the paths' windows. So the
  // close waits until this rank's allgather has begun, with chunks in flight
  // on the path it closes, and megabytes still to go.
  const uint64_t chunk_bytes = 4096;  // twoPaths()'s chunk_size
  const uint64_t half_chunks = count * sizeof(float) / 2 / chunk_bytes;
  std::atomic<int> finished{0};
  std::atomic<bool> closed_mid_operation{false};
  uint64_t other_path_bytes_at_close = 0;
  std::thread closer([&] {
    const auto until = after(60);
    while (finished.load() == 0 && Clock::now() < until) {
      uint64_t sent = 0;
      for (const auto& s : closer_side.pathStats()) sent += s.chunks_sent;
      // ...and chunks of this group are in flight on the path (posted, not
      // yet acknowledged): a close then flushes them and they are sent again.
      // A moment when every chunk on it is acknowledged (adaptive's choice,
      // or this thread descheduled past the allgather) would leave nothing
      // to re-send: the test waits for the next poll instead.
      if (sent > half_chunks + 32 && closer_side.inflightOn(closed_peer, closed_path) > 0) {
        for (int r = 0; r < n; ++r) other_path_bytes_at_close += slot(*g[r], 1 - r, other_path).bytes_sent;
        closed_mid_operation = finished.load() == 0;
        w[0]->transport().closePath(1, closed_path, "closed by the test");
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  auto errors = runRanks(n, [&](int r) {
    Window win = registered(*g[r], data[r]);
    std::exception_ptr failed;
    try {
      allreduce(*g[r], 1, win, count, DType::kFloat32, ReduceOp::kSum, after(60));
    } catch (...) {
      failed = std::current_exception();
    }
    finished++;
    g[r]->deregisterMemory(win.region);
    if (failed) std::rethrow_exception(failed);
  });
  closer.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ("", errorText(errors[r])) << "rank " << r;
  ASSERT_TRUE(closed_mid_operation) << "the path was not closed while the allreduce ran: the test proves nothing";
  // Every element of every rank is the exact sum.
  for (int r = 0; r < n; ++r) {
    size_t wrong = 0, first = count;
    for (size_t i = 0; i < count; ++i)
      if (data[r][i] != value(0, i) + value(1, i) && wrong++ == 0) first = i;
    ASSERT_EQ(0u, wrong) << "rank " << r << ": first wrong element " << first << " is " << data[r][first] << ", not "
                         << value(0, first) + value(1, first);
  }
  // The failover happened under the operation: chunks posted on the closed
  // path were flushed and sent again, and the path that stayed up carried
  // traffic after the close.
  uint64_t resent = 0, other_path_bytes = 0;
  for (int r = 0; r < n; ++r) {
    for (const auto& s : g[r]->pathStats()) resent += s.resent;
    const auto other = slot(*g[r], 1 - r, other_path);
    EXPECT_GT(other.bytes_sent, 0u) << "rank " << r << " sent nothing on the path that stayed up";
    other_path_bytes += other.bytes_sent;
  }
  EXPECT_GT(resent, 0u) << "no chunk was sent again: the close missed the operation's traffic";
  EXPECT_GT(other_path_bytes, other_path_bytes_at_close) << "the path that stayed up carried nothing after the close";
  // The owner re-opens it; the group sees it up again.
  auto up = [&](Engine& e) {
    for (const auto& s : e.pathStats())
      if (s.state != "up") return false;
    return true;
  };
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until && !(up(*g[0]) && up(*g[1]) && up(*w[0]))) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(up(*g[0]) && up(*g[1]) && up(*w[0]));
  uint64_t errors_seen = 0;
  for (int r = 0; r < n; ++r)
    for (const auto& s : g[r]->pathStats()) errors_seen += s.errors;
  EXPECT_GE(errors_seen, 1u) << "the group did not see the path fail";
  allreduceOn(g, 2, 100000, 0);
}

}  // namespace
}  // namespace collectives
}  // namespace maestro
