// Load-balancer policies against reference schedules, without a network
// (the aws-ofi-nccl way): given path states, the expected assignment.
#include <gtest/gtest.h>

#include "multipath/scheduler.h"

namespace maestro {
namespace multipath {
namespace {

std::unique_ptr<Scheduler> make(const std::string& policy, std::map<std::string, std::string> extra = {}) {
  extra["policy"] = policy;
  return makeScheduler(Config::resolve(extra));
}

std::vector<int> schedule(Scheduler& s, const std::vector<PathView>& v, int n, uint64_t bytes = 1 << 20) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(s.assign(v, bytes));
  return out;
}

TEST(Scheduler, RoundRobinSkipsDownPaths) {
  auto s = make("round_robin");
  std::vector<PathView> v(4);
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 0, 1}), schedule(*s, v, 6));
  v[1].up = false;
  v[3].up = false;
  EXPECT_EQ((std::vector<int>{2, 0, 2, 0}), schedule(*s, v, 4));
  for (auto& p : v) p.up = false;
  EXPECT_EQ(kNoPath, s->assign(v, 1));
}

TEST(Scheduler, SingleUsesTheFirstLivePath) {
  auto s = make("single");
  std::vector<PathView> v(3);
  EXPECT_EQ((std::vector<int>{0, 0, 0}), schedule(*s, v, 3));
  v[0].up = false;
  EXPECT_EQ((std::vector<int>{1, 1}), schedule(*s, v, 2));
}

TEST(Scheduler, WeightedFollowsConfiguredWeights) {
  auto s = make("weighted", {{"weights", "3,1,0,2"}});
  std::vector<PathView> v(4);
  std::vector<int> counts(4, 0);
  for (int p : schedule(*s, v, 600)) counts[p]++;
  EXPECT_EQ((std::vector<int>{300, 100, 0, 200}), counts);
  // Smooth: the heavy path is never used more than its share in a row.
  auto first = schedule(*make("weighted", {{"weights", "3,1,0,2"}}), v, 6);
  EXPECT_EQ((std::vector<int>{0, 3, 0, 1, 3, 0}), first);
}

TEST(Scheduler, WeightedFollowsMeasuredThroughputWithoutWeights) {
  auto s = make("weighted");
  std::vector<PathView> v(3);
  v[0].throughput = 100e6;
  v[1].throughput = 50e6;
  v[2].throughput = 0;  // not measured yet: counts as the mean (75e6)
  std::vector<int> counts(3, 0);
  for (int p : schedule(*s, v, 900)) counts[p]++;
  EXPECT_EQ((std::vector<int>{400, 200, 300}), counts);
  v[0].up = false;
  counts.assign(3, 0);
  for (int p : schedule(*s, v, 500)) counts[p]++;
  EXPECT_EQ(0, counts[0]);
}

TEST(Scheduler, AdaptiveLetsTheFirstFreePathPull) {
  auto s = make("adaptive");
  std::vector<PathView> v(4);
  EXPECT_TRUE(s->pulls());
  EXPECT_EQ(kAnyPath, s->assign(v, 1 << 20));
  for (auto& p : v) p.up = false;
  EXPECT_EQ(kNoPath, s->assign(v, 1 << 20));
}

// Paths with the given rates (chunks per second) and chunks in flight.
std::vector<PathView> paths(std::vector<double> rates, std::vector<int> inflight, uint64_t chunk) {
  std::vector<PathView> v(rates.size());
  for (size_t i = 0; i < v.size(); ++i) {
    v[i].throughput = rates[i] * static_cast<double>(chunk);
    v[i].inflight = inflight[i];
  }
  return v;
}

// Weighted shares need no ageing: every path gets its share and so keeps
// being measured. Counting a stale estimate as the mean put a loaded path
// at an equal share between messages (load_balance: 0.80 of the residual
// capacity against 0.98).
TEST(Scheduler, WeightedKeepsFollowingAStaleEstimate) {
  auto s = make("weighted");
  std::vector<PathView> v(2);
  v[0].throughput = 3e6;
  v[1].throughput = 1e6;
  v[1].rate_stale = true;
  std::vector<int> counts(2, 0);
  for (int p : schedule(*s, v, 400)) counts[p]++;
  EXPECT_EQ((std::vector<int>{300, 100}), counts);
}

TEST(Scheduler, AdaptiveOfferedPathTakesWhileTheQueueIsLong) {
  auto s = make("adaptive");
  const uint64_t L = 51200;
  // Path 3 runs at a quarter of the others' rate and holds 2 chunks: it
  // would finish one more at 12 chunk times of a fast path; the fast paths,
  // 8 in flight each, finish 1 new one each within 0.8 of that (the margin)
  // and a second only after it.
  auto v = paths({4, 4, 4, 1}, {8, 8, 8, 2}, L);
  EXPECT_EQ(3, s->pull(v, 3, 4, L));        // 4 queued: more than they can take
  EXPECT_EQ(kNoPath, s->pull(v, 3, 3, L));  // the tail: they finish all 3 well before
  EXPECT_EQ(kNoPath, s->pull(v, 3, 1, L));
  // Idle, path 3 finishes one at 4 chunk times: before the fast paths have
  // drained their own 8.
  v[3].inflight = 0;
  EXPECT_EQ(3, s->pull(v, 3, 1, L));
  // A full window never takes.
  v[3].inflight = 8;
  EXPECT_EQ(kNoPath, s->pull(v, 3, 100, L));
}

// The tail rule keeps a path out only for paths clearly faster than it
// (under 0.75 of their estimate): equal paths' estimates spread that far,
// and acting on the spread left a path idle while the others queued (on
// the ECMP lab a 1 MiB allreduce at 0.91-0.96 of the limit against
// round_robin's 0.97).
TEST(Scheduler, AdaptiveTailRuleIgnoresEstimatesWithinTheirSpread) {
  auto s = make("adaptive");
  const uint64_t L = 51200;
  // Path 3 at 0.8 of the others' estimate, 2 in flight: it would finish one
  // more at 3 / 3.2 = 0.94 chunk times of a rate-1 path; the others, 1 in
  // flight each, would each finish a new one by 0.5. Within the spread:
  // path 3 takes the last chunk.
  auto v = paths({4, 4, 4, 3.2}, {1, 1, 1, 2}, L);
  EXPECT_EQ(3, s->pull(v, 3, 1, L));
  // At 0.7 of their estimate the others are clearly faster: it waits.
  v = paths({4, 4, 4, 2.8}, {1, 1, 1, 2}, L);
  EXPECT_EQ(kNoPath, s->pull(v, 3, 1, L));
  // Only the clearly faster path is counted on (the two at 3 would finish
  // a new one each): with 2 in flight it finishes one of 2 queued chunks
  // before path 3 finishes one more, not both, so path 3 takes.
  v = paths({4, 3, 3, 2.8}, {2, 1, 1, 2}, L);
  EXPECT_EQ(3, s->pull(v, 3, 2, L));
  EXPECT_EQ(kNoPath, s->pull(v, 3, 1, L));
}

TEST(Scheduler, AdaptiveDoesNotCountOnStalledOrUnmeasuredPaths) {
  auto s = make("adaptive");
  const uint64_t L = 51200;
  auto v = paths({4, 4, 4, 1}, {8, 8, 8, 2}, L);
  ASSERT_EQ(kNoPath, s->pull(v, 3, 3, L));
  // The fast paths completed nothing for a minute, 30 times what their 8
  // chunks take (a cut link): not counted on.
  for (int p = 0; p < 3; ++p) v[p].stalled = 60.0;
  EXPECT_EQ(3, s->pull(v, 3, 3, L));
  // Fast paths that are not measured yet are not counted on either; a
  // path not measured yet always takes.
  v = paths({0, 0, 0, 1}, {8, 8, 8, 2}, L);
  EXPECT_EQ(3, s->pull(v, 3, 1, L));
  v = paths({4, 4, 4, 0}, {8, 8, 8, 2}, L);
  EXPECT_EQ(3, s->pull(v, 3, 1, L));
  v[1].up = false;
  EXPECT_EQ(kNoPath, s->pull(v, 1, 100, L));  // down: never
}

// Why a path's estimate must age (multipath/rate_estimate.h): lone chunks
// skip a path whose estimate is under half the best one, so such a path
// never gets a chunk -- and so never a new sample. Mid-size messages keep a
// path busy for less than a sample takes, so there the estimates go stale,
// the paths count as not measured, and lone chunks go to every path in turn.
TEST(Scheduler, AdaptiveNeverPicksAPathWhoseEstimateIsLowUntilItIsUnmeasured) {
  const uint64_t L = 65536;
  auto s = make("adaptive");
  auto v = paths({6.5, 6.3, 6.0, 3.2}, {0, 0, 0, 0}, L);  // estimates seen on the lab, in MB/s
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 100; ++i) counts[s->pull(v, kAnyPath, 1, L)]++;
  EXPECT_EQ(0, counts[3]);
  for (auto& p : v) p.rate_stale = true;  // every estimate went stale
  counts.assign(4, 0);
  for (int i = 0; i < 100; ++i) counts[s->pull(v, kAnyPath, 1, L)]++;
  EXPECT_EQ((std::vector<int>{25, 25, 25, 25}), counts);
}

// Without an offer the paths with room take turns; the earliest estimated
// finish decides only when the turn finds none: here path 0's window is
// full and path 1 is slow, so the slow path takes it rather than none.
TEST(Scheduler, AdaptiveWithoutAnOfferTakesTurnsAndElseTheEarliestFinish) {
  auto s = make("adaptive");
  const uint64_t L = 51200;
  auto v = paths({2, 1, 1, 8}, {1, 1, 2, 8}, L);  // path 3: window full
  EXPECT_EQ((std::vector<int>{0, 1, 2, 0}), ([&] {
              std::vector<int> out;
              for (int i = 0; i < 4; ++i) out.push_back(s->pull(v, kAnyPath, 100, L));
              return out;
            })());
  auto alone = make("adaptive");
  v = paths({4, 1}, {8, 0}, L);
  EXPECT_EQ(1, alone->pull(v, kAnyPath, 100, L));
  // Without measured rates: in turn too.
  auto fresh = make("adaptive");
  v = paths({0, 0, 0, 0}, {0, 0, 0, 0}, L);
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 0}), ([&] {
              std::vector<int> out;
              for (int i = 0; i < 5; ++i) out.push_back(fresh->pull(v, kAnyPath, 100, L));
              return out;
            })());
}

// A pipelined ring's one-chunk messages over four equal paths (1 MiB
// allreduces on the lab): estimates 15-28 MB/s, some paths with a chunk of
// the last step still in flight. Going where those estimates said each
// chunk would finish first reached 0.87 of the limit; taking turns, as
// round_robin does, 0.94. A path under half the best estimate is skipped.
TEST(Scheduler, AdaptiveGivesLoneChunksToEqualPathsInTurnWhateverTheirNoise) {
  const uint64_t L = 65536;
  auto s = make("adaptive");
  auto v = paths({17e6 / L, 15e6 / L, 28e6 / L, 25e6 / L}, {1, 0, 1, 0}, L);
  v[0].stalled = 0.0002;  // just posted
  v[2].stalled = 0.002;
  std::vector<int> order;
  for (int i = 0; i < 8; ++i) order.push_back(s->pull(v, kAnyPath, 1, L));
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}), order);
  v[1].throughput = 13e6;  // under half of 28 MB/s
  order.clear();
  for (int i = 0; i < 6; ++i) order.push_back(s->pull(v, kAnyPath, 1, L));
  EXPECT_EQ((std::vector<int>{0, 2, 3, 0, 2, 3}), order);
}

// The next ring step's chunks while one path still carries the end of the
// last step's: that path is most of the way through its chunk, so one more
// there ends sooner than a second chunk on an idle path. Counting its chunk
// as whole put two of the four on one idle path, and the step took two
// chunk times (a 4 MiB allreduce on the lab ran at 0.85 of round robin).
// One message of `chunks` chunks placed without an offer, as pumpAll does:
// the chunks each path took.
std::vector<int> placeMessage(Scheduler& s, std::vector<PathView>& v, size_t chunks, uint64_t chunk_bytes) {
  std::vector<int> counts(v.size(), 0);
  for (size_t queued = chunks; queued > 0; --queued) {
    const int p = s.pull(v, kAnyPath, queued, chunk_bytes);
    EXPECT_GE(p, 0);
    if (p < 0) break;
    counts[p]++;
    v[p].inflight++;
    v[p].message_chunks++;
  }
  return counts;
}

TEST(Scheduler, AdaptiveCountsWhatAPathHasAlreadyDoneOfItsChunk) {
  const uint64_t L = 65536;
  auto s = make("adaptive");
  auto v = paths({1, 1, 1, 1}, {0, 0, 1, 0}, L);  // one chunk per second on each path
  v[2].stalled = 0.8;                               // its chunk has 0.2 s to go
  EXPECT_EQ((std::vector<int>{1, 1, 1, 1}), placeMessage(*s, v, 4, L));
}

// A ring step's four chunks while each path still carries a chunk of the
// step before (rates in MB/s and progress seen on the lab, a 1 MiB
// allreduce): path 3's chunk has just started. By the estimates a second
// chunk on path 2 ends a little sooner than one behind path 3's, but the
// estimates are within their noise, and 17 % of the steps doubled up a path
// that way and ended a chunk time late (adaptive at 0.77-0.87 of the limit,
// round robin at 0.96). A message now goes one chunk per path first.
TEST(Scheduler, AdaptiveSpreadsAMessageBeforeDoublingUpAPath) {
  const uint64_t L = 65536;
  auto s = make("adaptive");
  std::vector<PathView> v(4);
  const double rates[] = {26.1e6, 25.5e6, 27.0e6, 24.5e6}, stalled[] = {0.0021, 0.0015, 0.0025, 0.0};
  for (int p = 0; p < 4; ++p) {
    v[p].throughput = rates[p];
    v[p].stalled = stalled[p];
    v[p].inflight = 1;
  }
  EXPECT_EQ((std::vector<int>{1, 1, 1, 1}), placeMessage(*s, v, 4, L));
  // A completion on a path that has a chunk of the message leaves the next
  // one to a path that has none; on a path that has none, it takes it.
  for (auto& p : v) p.message_chunks = 0;
  v[0].message_chunks = 1;
  EXPECT_EQ(kNoPath, s->pull(v, 0, 3, L));
  EXPECT_EQ(1, s->pull(v, 1, 3, L));
  // A path so slow that the others finish every queued chunk first is not
  // waited for: the spread skips it.
  for (auto& p : v) {
    p.message_chunks = 1;
    p.inflight = 1;
    p.stalled = 0;
  }
  v[3].message_chunks = 0;
  v[3].throughput = 1e6;
  v[3].inflight = 0;
  EXPECT_EQ(0, s->pull(v, 0, 1, L));
}

// A message of N chunks over paths of rates 4:3:2:1, simulated chunk by
// chunk the way the engine drives the scheduler (a completion offers its
// own path first, then every path with room may pull). Returns when the
// last chunk completes, in units of one chunk on a rate-1 path.
double makespan(Scheduler& s, const std::vector<double>& rates, int n_chunks, int window) {
  const uint64_t L = 51200;
  const size_t n = rates.size();
  std::vector<PathView> v = paths(rates, std::vector<int>(n, 0), L);
  for (auto& p : v) p.window = window;
  std::vector<double> busy_until(n, 0.0);
  std::vector<std::vector<double>> done(n);  // completion times of chunks in flight
  size_t queued = static_cast<size_t>(n_chunks);
  double now = 0, last = 0;
  auto post = [&](size_t p) {
    busy_until[p] = std::max(busy_until[p], now) + 1.0 / rates[p];
    done[p].push_back(busy_until[p]);
    v[p].inflight++;
    queued--;
  };
  auto pump_all = [&] {
    while (queued > 0) {
      int p = s.pull(v, kAnyPath, queued, L);
      if (p < 0) break;
      post(static_cast<size_t>(p));
    }
  };
  pump_all();
  while (true) {
    int next = -1;
    for (size_t p = 0; p < n; ++p)
      if (!done[p].empty() && (next < 0 || done[p].front() < done[static_cast<size_t>(next)].front())) next = static_cast<int>(p);
    if (next < 0) break;
    now = last = done[static_cast<size_t>(next)].front();
    done[static_cast<size_t>(next)].erase(done[static_cast<size_t>(next)].begin());
    v[static_cast<size_t>(next)].inflight--;
    while (queued > 0 && s.pull(v, next, queued, L) == next) post(static_cast<size_t>(next));
    pump_all();
  }
  EXPECT_EQ(0u, queued) << "chunks left behind";
  return last;
}

TEST(Scheduler, AdaptiveFinishesAMessageOverUnequalPathsNearTheIdeal) {
  // 320 chunks (16 MiB of 50 KiB) over paths of rates 4:3:2:1: ideally 32
  // time units. Pulling whenever there is room, the rate-1 path ends up
  // with up to 8 of the last chunks and finishes several units late.
  auto s = make("adaptive");
  const std::vector<double> rates{4, 3, 2, 1};
  const double ideal = 320 / 10.0;
  const double t = makespan(*s, rates, 320, 8);
  EXPECT_LE(t, ideal + 1.0) << "one chunk time of the slowest path over the ideal at most";
  // Equal paths: no chunk is held back, the message ends at the ideal.
  auto e = make("adaptive");
  EXPECT_LE(makespan(*e, {1, 1, 1, 1}, 320, 8), 80.0 + 1e-9);
}

TEST(Scheduler, LatencyPinsSmallMessagesToTheLowestRtt) {
  auto s = make("latency", {{"small_msg", "16K"}});
  std::vector<PathView> v(4);
  v[0].rtt = 0.004;
  v[1].rtt = 0.001;
  v[2].rtt = 0.0005;
  v[3].rtt = 0;  // unmeasured: never preferred over a measured one
  EXPECT_EQ(2, s->assign(v, 100));
  EXPECT_EQ(2, s->assign(v, 16 * 1024));
  EXPECT_EQ(kAnyPath, s->assign(v, 16 * 1024 + 1));  // large: spread
  v[2].up = false;
  EXPECT_EQ(1, s->assign(v, 100));
}

// A small message is latency-bound: adaptive sends it whole to the idle
// path with the lowest RTT, never behind another path's chunks, and takes
// turns (the shared queue) only when every live path holds chunks; a larger
// one is always spread.
TEST(Scheduler, AdaptiveSendsASmallMessageToTheIdlePathWithTheLowestRtt) {
  std::vector<PathView> v(4);
  auto d = make("adaptive");  // the default: up to 4 KiB
  EXPECT_EQ(0, d->assign(v, 4096));  // nothing measured: the first idle path
  EXPECT_EQ(kAnyPath, d->assign(v, 4097));
  auto s = make("adaptive", {{"small_msg", "16K"}});
  EXPECT_EQ(0, s->assign(v, 4096));
  v[0].rtt = 0.004;
  v[1].rtt = 0.001;
  v[2].rtt = 0.0005;
  v[3].rtt = 0;  // unmeasured: after every measured one
  EXPECT_EQ((std::vector<int>{2, 2, 2}), schedule(*s, v, 3, 4096));  // sticks to it while it is idle
  EXPECT_EQ(2, s->assign(v, 16 * 1024));
  EXPECT_EQ(kAnyPath, s->assign(v, 16 * 1024 + 1));  // larger: spread
  v[2].inflight = 1;  // busy: the next lowest RTT that is idle
  EXPECT_EQ(1, s->assign(v, 4096));
  v[1].inflight = 2;
  v[0].inflight = 1;
  EXPECT_EQ(3, s->assign(v, 4096));  // idle, unmeasured
  v[3].inflight = 1;
  EXPECT_EQ(kAnyPath, s->assign(v, 4096));  // every path holds chunks: in turn
  v[3].inflight = 0;
  v[3].up = false;
  EXPECT_EQ(kAnyPath, s->assign(v, 4096));  // a path that is down is not idle
  for (auto& p : v) p.up = false;
  EXPECT_EQ(kNoPath, s->assign(v, 4096));
}

// Control messages (barrier tokens, descriptors) are latency-bound like a
// small message: under adaptive and latency the live path with the lowest
// RTT, busy or not (a control message is a few bytes); under the policies
// that ignore RTT the first live path.
TEST(Scheduler, ControlMessagesTakeTheLowestRttPathUnderThePoliciesThatReadIt) {
  std::vector<PathView> v(4);
  EXPECT_EQ(0, controlPath(Policy::kAdaptive, v));  // nothing measured: the first
  v[0].rtt = 0.004;
  v[1].rtt = 0.001;
  v[2].rtt = 0.0005;
  v[2].inflight = 8;  // busy with data: still the one
  v[3].rtt = 0;       // unmeasured: after every measured one
  EXPECT_EQ(2, controlPath(Policy::kAdaptive, v));
  EXPECT_EQ(2, controlPath(Policy::kLatency, v));
  EXPECT_EQ(0, controlPath(Policy::kRoundRobin, v));
  EXPECT_EQ(0, controlPath(Policy::kWeighted, v));
  EXPECT_EQ(0, controlPath(Policy::kSingle, v));
  v[2].up = false;
  EXPECT_EQ(1, controlPath(Policy::kAdaptive, v));
  v[0].up = false;
  EXPECT_EQ(1, controlPath(Policy::kRoundRobin, v));
  for (auto& p : v) p.up = false;
  EXPECT_EQ(kNoPath, controlPath(Policy::kAdaptive, v));
  EXPECT_EQ(kNoPath, controlPath(Policy::kSingle, v));
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
