// Load balancer (paper §4.4): decides which path carries each chunk.
//
// A scheduler sees only PathViews (state + what the path monitor measured),
// so every policy is unit-tested against reference schedules without a
// network. assign() returns a path index, or kAnyPath: the chunk then waits
// in a shared queue and pull() decides which path with window room takes it
// -- chunk-level ACK clocking in the spirit of MP-RDMA, where faster, less
// congested paths complete sooner and therefore carry more.
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
  double throughput = 0.0;  // measured bytes/s while busy, 0 = not measured yet
  // The estimate is older than the adaptive policies plan with
  // (rate_estimate.h): they count the path as not measured. Weighted
  // shares keep using it: every path gets its share, so none is locked out.
  bool rate_stale = false;
  double rtt = 0.0;         // measured seconds, 0 = not measured yet
  double stalled = 0.0;     // seconds since the last completion while chunks are in flight (0 when idle)
  int message_chunks = 0;   // chunks of the message being placed that the path has taken
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual const char* name() const = 0;
  // The path for the next chunk of a message of message_bytes: an index,
  // kAnyPath, or kNoPath when no path is up.
  virtual int assign(const std::vector<PathView>& paths, uint64_t message_bytes) = 0;
  // Whether kAnyPath chunks are pulled from the shared queue (pull model).
  virtual bool pulls() const { return false; }
  // Pull model: the path that takes the next of `queued` shared chunks
  // (this one is chunk_bytes long) now, or kNoPath to leave it queued.
  // `offer` is a path that just freed window room (a completion: it pulls
  // first), or kAnyPath to choose among every path with room.
  virtual int pull(const std::vector<PathView>& paths, int offer, size_t queued, uint64_t chunk_bytes) {
    (void)paths, (void)offer, (void)queued, (void)chunk_bytes;
    return kNoPath;
  }
};

// One scheduler per peer (schedulers keep per-peer state such as a cursor).
std::unique_ptr<Scheduler> makeScheduler(const Config& config);

// The path for a control message (a barrier token, an operation descriptor,
// a credit: small and latency-bound, so one queued behind another flow's
// bytes waits for them). Under the policies that read RTT (adaptive,
// latency) the live path with the lowest measured RTT, as for their small
// messages; under the others the first live one. kNoPath when none is up.
// Only `up` and `rtt` are read.
int controlPath(Policy policy, const std::vector<PathView>& paths);

}  // namespace multipath
}  // namespace maestro
