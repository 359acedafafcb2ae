#include "multipath/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace maestro {
namespace multipath {
namespace {

bool anyUp(const std::vector<PathView>& paths) {
  for (const auto& p : paths)
    if (p.up) return true;
  return false;
}

// The live path with the lowest measured RTT (one not measured yet counts
// after every measured one; ties go to the lowest index), among those with
// nothing in flight or queued if idle_only; kNoPath when there is none.
int lowestRtt(const std::vector<PathView>& paths, bool idle_only) {
  int best = kNoPath;
  double best_rtt = 0;
  for (size_t p = 0; p < paths.size(); ++p) {
    if (!paths[p].up || (idle_only && paths[p].inflight > 0)) continue;
    const double rtt = paths[p].rtt > 0 ? paths[p].rtt : std::numeric_limits<double>::max();
    if (best == kNoPath || rtt < best_rtt) {
      best = static_cast<int>(p);
      best_rtt = rtt;
    }
  }
  return best;
}

// round_robin: chunk i on path i mod N, skipping paths that are down.
class RoundRobin : public Scheduler {
 public:
  const char* name() const override { return policyName(Policy::kRoundRobin); }
  int assign(const std::vector<PathView>& paths, uint64_t) override {
    const int n = static_cast<int>(paths.size());
    for (int k = 0; k < n; ++k) {
      int p = (cursor_ + k) % n;
      if (paths[p].up) {
        cursor_ = (p + 1) % n;
        return p;
      }
    }
    return kNoPath;
  }

 private:
  int cursor_ = 0;
};

// single: one path (the lowest-numbered one that is up): the baseline.
class Single : public Scheduler {
 public:
  const char* name() const override { return policyName(Policy::kSingle); }
  int assign(const std::vector<PathView>& paths, uint64_t) override {
    for (size_t p = 0; p < paths.size(); ++p)
      if (paths[p].up) return static_cast<int>(p);
    return kNoPath;
  }
};

// weighted: smooth weighted round robin over the configured weights, or,
// without configured weights, over the measured throughputs (paths not
// measured yet count as the mean of the measured ones, or 1 when none is).
class Weighted : public Scheduler {
 public:
  explicit Weighted(std::vector<double> configured) : configured_(std::move(configured)) {}
  const char* name() const override { return policyName(Policy::kWeighted); }
  int assign(const std::vector<PathView>& paths, uint64_t) override {
    const size_t n = paths.size();
    if (current_.size() != n) current_.assign(n, 0.0);
    std::vector<double> w(n, 0.0);
    double measured_sum = 0;
    int measured = 0;
    for (size_t p = 0; p < n; ++p)
      if (paths[p].up && paths[p].throughput > 0) {
        measured_sum += paths[p].throughput;
        ++measured;
      }
    double fallback = measured ? measured_sum / measured : 1.0;
    double total = 0;
    for (size_t p = 0; p < n; ++p) {
      if (!paths[p].up) continue;
      if (!configured_.empty()) w[p] = p < configured_.size() ? configured_[p] : 0.0;
      else w[p] = paths[p].throughput > 0 ? paths[p].throughput : fallback;
      total += w[p];
    }
    if (!anyUp(paths)) return kNoPath;
    if (total <= 0) {  // every live path has weight 0: fall back to equal shares
      for (size_t p = 0; p < n; ++p) w[p] = paths[p].up ? 1.0 : 0.0;
      total = 0;
      for (double x : w) total += x;
    }
    int best = -1;
    for (size_t p = 0; p < n; ++p) {
      if (!paths[p].up) {
        current_[p] = 0;
        continue;
      }
      current_[p] += w[p];
      if (best < 0 || current_[p] > current_[best]) best = static_cast<int>(p);
    }
    current_[best] -= total;
    return best;
  }

 private:
  std::vector<double> configured_;
  std::vector<double> current_;
};

// adaptive: ACK clocking -- a queued chunk goes to a path with window room,
// and a completion lets its own path pull first, so each path carries what
// it completes. At the tail of a message that is not enough: a slow path
// that pulls one of the last chunks finishes it long after the fast paths
// have gone idle, and the whole message waits (320 chunks over paths of
// rates 4:3:2:1 took 36 time units instead of 32: test_scheduler.cc). So a
// path takes a chunk only if the other paths could not finish every queued
// chunk well before it would finish this one (kMargin) -- the "earliest
// completion first" rule of multipath TCP schedulers (ECF, BLEST), with
// each path's finish time estimated from its chunks in flight and its
// measured rate, and counting only on paths clearly faster than the one
// kept out (kClearlyFaster).
//
// Without an offer (a message's chunks placed on paths with room), the
// paths take turns: finish times estimated there are too coarse to act on.
// Estimates of equal paths differ by 2 times and more (medians of 12 to
// 28 MB/s in one run on the lab's 25 MB/s links), and a path's chunk in flight may be sent already
// and only wait for its acknowledgement. Acting on such differences (the
// earliest estimated finish, even within a margin) put a second chunk
// behind another while a path sat idle, or gave the path that looked
// fastest a third more of the chunks: a 1 MiB allreduce (a pipelined ring
// of one-chunk messages) reached 0.87 of the limit where taking turns
// reached 0.94, as round_robin does. So the turn skips only a path whose
// estimate is under half the best one (kSlow), a path that holds more
// chunks of the message than another, and, while several chunks wait, a
// path the tail rule keeps out. A lone waiting chunk (a one-chunk message)
// takes the next path in turn. When the turn finds none, the earliest
// estimated finish decides, within kMargin, and the tail rule with it.
//
// A small message (up to small_msg: a barrier token, a step of a small
// allreduce) is latency-bound: it goes whole to the idle path with the
// lowest RTT (every path's is probed), and to the turn only when every
// path holds chunks. Taking turns sent each of recursive doubling's 4 KiB
// steps on another connection: on the lab (4 ranks, cubic, the default)
// a 4 KiB allreduce took 1.1-1.4 ms that way and 0.6-0.8 ms on the
// lowest-RTT path (the latency policy), while with bbr both took 0.7-0.8.
// Only small ones: a 64 KiB allreduce's ring sends 16 KiB steps, and sent
// on the one idle path they took 1.8 ms where taking turns took 1.3.
// A run of small messages leaves the other connections idle, and Linux
// restarts an idle connection's window (slow start after idle). Rotating
// small messages over the paths cost 4 KiB allreduce 40 %; sending one to
// any path idle for 0.1 s kept every connection warm but did not change
// 64 KiB allgather's ratio to round_robin (docs/performance.md).
class Adaptive : public Scheduler {
 public:
  explicit Adaptive(uint64_t small_msg) : small_msg_(small_msg) {}
  const char* name() const override { return policyName(Policy::kAdaptive); }
  int assign(const std::vector<PathView>& paths, uint64_t message_bytes) override {
    if (message_bytes <= small_msg_) {
      const int idle = lowestRtt(paths, /*idle_only=*/true);
      if (idle >= 0) return idle;
    }
    return anyUp(paths) ? kAnyPath : kNoPath;
  }
  bool pulls() const override { return true; }

  int pull(const std::vector<PathView>& paths, int offer, size_t queued, uint64_t chunk_bytes) override {
    const int n = std::min(static_cast<int>(paths.size()), kMaxPaths);
    auto room = [&](int p) { return paths[p].up && paths[p].inflight < paths[p].window; };
    // Paths not measured yet count at the mean measured rate when choosing.
    double sum = 0;
    int measured = 0;
    for (const auto& v : paths)
      if (v.up && rate(v) > 0) {
        sum += rate(v);
        ++measured;
      }
    const double mean = measured ? sum / measured : 0;
    auto finish = [&](int p) {  // when p would finish one more chunk, in chunk times at rate 1 if none is measured
      const double r = rate(paths[p]) > 0 ? rate(paths[p]) : mean;
      if (r <= 0) return paths[p].inflight + 1.0;
      const double one = static_cast<double>(chunk_bytes) / r;
      return held(paths[p], one) + one;
    };
    auto passes = [&](int p) {  // the earliest-completion-first rule
      return rate(paths[p]) <= 0 || !othersFinishFirst(paths, p, kMargin * finish(p), queued, chunk_bytes);
    };
    if (offer >= 0) {
      if (offer >= n || !room(offer) || !passes(offer)) return kNoPath;
      // A second chunk of the message while a path has none waits for the
      // pull without an offer that follows.
      if (paths[offer].message_chunks > 0)
        for (int p = 0; p < n; ++p)
          if (p != offer && room(p) && paths[p].message_chunks == 0 && passes(p)) return kNoPath;
      cursor_ = (offer + 1) % n;
      return offer;
    }
    // Without an offer: in turn, among the paths with room that hold the
    // fewest chunks of the message and are not slow, the first the tail
    // rule lets take it (asked only while several chunks wait).
    auto level = [&](int p) { return paths[p].message_chunks > 0 ? 1 : 0; };
    int lowest = 1;
    double top = 0;
    for (int p = 0; p < n; ++p)
      if (room(p)) lowest = std::min(lowest, level(p));
    for (int p = 0; p < n; ++p)
      if (room(p) && level(p) == lowest) top = std::max(top, rate(paths[p]));
    auto slow = [&](int p) { return rate(paths[p]) > 0 && rate(paths[p]) < kSlow * top; };
    for (int k = 0; k < n; ++k) {
      const int p = (cursor_ + k) % n;
      if (room(p) && level(p) == lowest && !slow(p) && (paths[p].inflight <= 1 || passes(p))) {
        cursor_ = (p + 1) % n;
        return p;
      }
    }
    // None: among the paths with room, those with the fewest chunks of the
    // message; among them, those within the margin of the earliest finish,
    // in turn. The first the rule lets take the chunk takes it.
    bool tried[kMaxPaths] = {};
    for (;;) {
      int best_level = -1;
      double earliest = 0;
      for (int p = 0; p < n; ++p) {
        if (tried[p] || !room(p)) continue;
        const int l = level(p);
        const double f = finish(p);
        if (best_level < 0 || l < best_level || (l == best_level && f < earliest)) {
          best_level = l;
          earliest = f;
        }
      }
      if (best_level < 0) return kNoPath;
      int pick = -1;
      for (int k = 0; k < n && pick < 0; ++k) {
        const int p = (cursor_ + k) % n;
        if (!tried[p] && room(p) && level(p) == best_level && kMargin * finish(p) <= earliest) pick = p;
      }
      if (passes(pick)) {
        cursor_ = (pick + 1) % n;
        return pick;
      }
      tried[pick] = true;
    }
  }

 private:
  static constexpr int kMaxPaths = 64;  // MAESTRO_PATHS is at most 64
  // A finish time is as soon as the soonest if this fraction of it is no
  // later (within 1.25 times); a path is kept out only if the others would
  // finish every queued chunk within this fraction of its own finish time.
  static constexpr double kMargin = 0.8;
  // A path whose estimate is under this fraction of the best one is skipped
  // in the turn (a path not measured, or stale, is not).
  static constexpr double kSlow = 0.5;
  // The tail rule counts only on paths clearly faster than the one it
  // would keep out: p's estimate under this fraction of theirs. Equal
  // paths' estimates spread that far, and a rule acting on the spread kept
  // paths idle: on the ECMP lab a 1 MiB allreduce reached 0.91-0.96 of the
  // limit against round_robin's 0.97; counting only paths clearly faster,
  // 0.97 as round_robin, while under background traffic (residual rates 4:3:2:1)
  // 64 MiB allreduces kept 0.99-1.00 of the residual capacity (a looser
  // 0.5, of the fastest other path's estimate, cost 1-7 % of it). It costs
  // about 1 % at 64 MiB on the pinned lab: adaptive 0.90 against 0.91
  // counting every path (medians of 14 passes, round_robin 0.89 beside
  // both); a rule that keeps both is still to be found.
  static constexpr double kClearlyFaster = 0.75;

  // The rate planned with: none while the estimate is stale.
  static double rate(const PathView& v) { return v.rate_stale ? 0.0 : v.throughput; }

  // The time a path needs to finish the chunks it holds, `one` seconds each:
  // less what its first one has been in progress (since the last completion,
  // or the post that made the path busy). A chunk later than its own time
  // counts as done, not as more: the tail of one step's chunks is then seen
  // to end sooner than a whole chunk on another path, and the next step's
  // chunks spread over the paths instead of doubling up on an idle one.
  static double held(const PathView& v, double one) {
    return std::max(0.0, v.inflight * one - std::min(v.stalled, one));
  }

  // Whether the other paths clearly faster than p (kClearlyFaster), each
  // pulling as its in-flight chunks complete, would finish all `queued`
  // chunks strictly before t, when path p would finish one more.
  static bool othersFinishFirst(const std::vector<PathView>& paths, int p, double t, size_t queued,
                                uint64_t chunk_bytes) {
    const double len = static_cast<double>(chunk_bytes ? chunk_bytes : 1);
    double could = 0;
    for (size_t q = 0; q < paths.size(); ++q) {
      const PathView& v = paths[q];
      if (static_cast<int>(q) == p || !v.up || rate(v) <= 0) continue;
      if (rate(paths[p]) >= kClearlyFaster * rate(v)) continue;
      // A path that has completed nothing for a while (blackholed, or its
      // link cut) is not counted on, whatever its rate was.
      const double expected = v.inflight * len / rate(v);
      if (v.inflight > 0 && v.stalled > std::max(0.05, 4 * expected)) continue;
      // Its k-th new chunk completes at held + k * len / rate.
      const double one = len / rate(v);
      could += std::max(0.0, std::ceil((t - held(v, one)) / one) - 1);
    }
    return could >= static_cast<double>(queued);
  }

  int cursor_ = 0;

 protected:
  uint64_t small_msg_;
};

// latency: small messages (barrier tokens, tiny tensors) take the path with
// the lowest measured RTT (paper Fig. 12f), even when it holds chunks
// (adaptive takes it only while it is idle); large ones are spread
// adaptively.
class Latency : public Adaptive {
 public:
  explicit Latency(uint64_t small_msg) : Adaptive(small_msg) {}
  const char* name() const override { return policyName(Policy::kLatency); }
  int assign(const std::vector<PathView>& paths, uint64_t message_bytes) override {
    if (message_bytes > small_msg_) return Adaptive::assign(paths, message_bytes);
    return lowestRtt(paths, /*idle_only=*/false);
  }
};

}  // namespace

std::unique_ptr<Scheduler> makeScheduler(const Config& config) {
  switch (config.policy) {
    case Policy::kRoundRobin: return std::make_unique<RoundRobin>();
    case Policy::kSingle: return std::make_unique<Single>();
    case Policy::kWeighted: return std::make_unique<Weighted>(config.weights);
    case Policy::kAdaptive: return std::make_unique<Adaptive>(config.small_msg);
    case Policy::kLatency: return std::make_unique<Latency>(config.small_msg);
  }
  fail("unknown policy");
}

int controlPath(Policy policy, const std::vector<PathView>& paths) {
  if (policy == Policy::kAdaptive || policy == Policy::kLatency) return lowestRtt(paths, /*idle_only=*/false);
  for (size_t p = 0; p < paths.size(); ++p)
    if (paths[p].up) return static_cast<int>(p);
  return kNoPath;
}

}  // namespace multipath
}  // namespace maestro
