// Path monitor (paper §4.3): a path's throughput while busy, and how long
// the scheduler may plan with it.
//
// A sample covers at least kSample seconds with chunks in flight and at
// least kChunks chunks: the bytes completed over that time (idle gaps never
// count, so a lightly used path is not mistaken for a slow one). Samples
// are averaged (EWMA).
//
// Why two chunks: the time of a chunk that had the path to itself is its
// latency as much as the path's rate, and with mid-size messages (one or
// two chunks per path and step) the only busy spells long enough to be a
// sample were those of a chunk that was slow for once (a connection's slow
// start, a queue). Such samples made equal paths look two times apart.
//
// Why estimates age: the adaptive policies plan with them, and a path
// gets new samples only while it carries chunks (weighted shares give every
// path chunks, and plan with value() whatever its age). An estimate that makes a
// path look slow would keep the path idle, and the estimate unchanged, for
// good: on the lab, one slow first chunk kept a path out of a 256 KiB
// allgather's traffic for a whole run. So an estimate is planned with for
// kStale seconds after its last sample only; then the path counts as not
// measured (the scheduler plans it at the mean of the others), takes its
// share again, and its next sample starts a new average.
#pragma once

#include <cstdint>

#include "common/clock.h"

namespace maestro {
namespace multipath {

class RateEstimate {
 public:
  static constexpr double kSample = 0.004;  // seconds: the shortest busy interval a sample covers
  static constexpr int kChunks = 2;         // the fewest chunks a sample covers
  static constexpr double kStale = 0.1;     // seconds: how long an estimate is planned with after its last sample
  static constexpr double kGain = 0.2;      // weight of a new sample in the average

  // The path went from idle to busy at `now` (its first chunk in flight).
  void busy(Clock::time_point now) {
    mark_ = now;
    bytes_ = 0;
    chunks_ = 0;
  }
  // A chunk of `bytes` completed at `now`.
  void completed(uint64_t bytes, Clock::time_point now);
  // A new connection (another route): nothing measured yet.
  void reset() { *this = RateEstimate(); }
  // The last estimate, bytes/s, however old (0: never measured): for
  // statistics and for rules that judge the path's own recent traffic.
  double value() const { return rate_; }
  // Whether there is an estimate and it is too old to plan with at `now`
  // (kStale after its last sample): the adaptive policies then count the
  // path as not measured.
  bool stale(Clock::time_point now) const;

 private:
  double rate_ = 0;
  Clock::time_point sampled_{};  // when rate_ took its last sample
  Clock::time_point mark_{};     // start of the current sample
  uint64_t bytes_ = 0;           // bytes completed since mark_
  int chunks_ = 0;               // chunks completed since mark_
};

}  // namespace multipath
}  // namespace maestro
