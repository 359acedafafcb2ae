// Load balancer (paper §4.4): decides which path carries each chunk.
//
// A scheduler sees only PathViews (state + what the path monitor measured),
// so every policy is unit-tested against reference schedules without a
// network. assign() returns a path index, or kAnyPath: the chunk then waits
// in a shared queue and the first path with window room takes it -- chunk-
// level ACK clocking in the spirit of MP-RDMA, where faster, less congested
// paths complete sooner and therefore carry more.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/config.h"

namespace maestro {
namespace multipath {

constexpr int kAnyPath = -1;
constexpr int kNoPath = -2;

struct PathView {
  bool up = true;
  int inflight = 0;         // chunks outstanding on the path
  int window = 8;           // chunks the path may hold
  double weight = 1.0;      // configured relative weight (policy=weighted)
  double throughput = 0.0;  // measured bytes/s, 0 = not measured yet
  double rtt = 0.0;         // measured seconds, 0 = not measured yet
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual const char* name() const = 0;
  // The path for the next chunk of a message of message_bytes: an index,
  // kAnyPath, or kNoPath when no path is up.
  virtual int assign(const std::vector<PathView>& paths, uint64_t message_bytes) = 0;
  // Whether an idle path may take kAnyPath chunks (pull model).
  virtual bool pulls() const { return false; }
};

// One scheduler per peer (schedulers keep per-peer state such as a cursor).
std::unique_ptr<Scheduler> makeScheduler(const Config& config);

}  // namespace multipath
}  // namespace maestro
