#include "multipath/scheduler.h"

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

// round_robin: chunk i on path i mod N, skipping paths that are down.
class RoundRobin : public Scheduler {
 public:
  const char* name() const override { return "round_robin"; }
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
  const char* name() const override { return "single"; }
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
  const char* name() const override { return "weighted"; }
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

// adaptive: ACK clocking -- the chunk goes to whichever path frees window
// room first.
class Adaptive : public Scheduler {
 public:
  const char* name() const override { return "adaptive"; }
  int assign(const std::vector<PathView>& paths, uint64_t) override {
    return anyUp(paths) ? kAnyPath : kNoPath;
  }
  bool pulls() const override { return true; }
};

// latency: small messages (barrier tokens, tiny tensors) take the path with
// the lowest measured RTT (paper Fig. 12f); large ones are spread adaptively.
class Latency : public Adaptive {
 public:
  explicit Latency(uint64_t small_msg) : small_msg_(small_msg) {}
  const char* name() const override { return "latency"; }
  int assign(const std::vector<PathView>& paths, uint64_t message_bytes) override {
    if (message_bytes > small_msg_) return Adaptive::assign(paths, message_bytes);
    int best = kNoPath;
    double best_rtt = std::numeric_limits<double>::infinity();
    for (size_t p = 0; p < paths.size(); ++p) {
      if (!paths[p].up) continue;
      double rtt = paths[p].rtt > 0 ? paths[p].rtt : std::numeric_limits<double>::max();
      if (best == kNoPath || rtt < best_rtt) {
        best = static_cast<int>(p);
        best_rtt = rtt;
      }
    }
    return best;
  }

 private:
  uint64_t small_msg_;
};

}  // namespace

std::unique_ptr<Scheduler> makeScheduler(const Config& config) {
  switch (config.policy) {
    case Policy::kRoundRobin: return std::make_unique<RoundRobin>();
    case Policy::kSingle: return std::make_unique<Single>();
    case Policy::kWeighted: return std::make_unique<Weighted>(config.weights);
    case Policy::kAdaptive: return std::make_unique<Adaptive>();
    case Policy::kLatency: return std::make_unique<Latency>(config.small_msg);
  }
  fail("unknown policy");
}

}  // namespace multipath
}  // namespace maestro
