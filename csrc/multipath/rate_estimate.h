// Path monitor (paper §4.3): a path's throughput while busy, and how long
// the scheduler may plan with it.
//
// A sample is the bytes completed between completions while the path kept
// chunks in flight throughout, over at least kSample seconds and kChunks
// chunks. It starts at a completion that leaves chunks in flight, not at a
// post: the first completion of a busy spell comes a round trip after the
// post, and the last one of a spell (the path then empty) ends it. Idle
// gaps never count, so a lightly used path is not mistaken for a slow one.
// Samples are averaged (EWMA).
//
// Why between completions: counted from the post, a path that carries one
// or two chunks at a time (mid-size messages, a pipelined ring) measures
// its round trip as much as its rate, and a path given more chunks in a row
// measures faster and is given more still. On the lab's 1 MiB ring, four
// paths sharing one 125 MB/s link were estimated at 5 to 54 MB/s, and one
// of them carried 195 chunks where another carried 89. A path that only
// ever holds one chunk at a time gives no sample: its estimate ages out
// (below) and the scheduler plans it as the others. A path slow enough to
// matter keeps the next chunk waiting behind its first, and is measured.
//
// Why two chunks: one interval between completions can be a chunk that was
// slow for once (a connection's slow start, a queue), or one posted late.
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
  static constexpr double kSample = 0.004;  // seconds: the shortest interval a sample covers
  static constexpr int kChunks = 2;         // the fewest chunks a sample counts (after its first completion)
  static constexpr double kStale = 0.1;     // seconds: how long an estimate is planned with after its last sample
  static constexpr double kGain = 0.2;      // weight of a new sample in the average

  // The path went from idle to busy at `now` (its first chunk in flight):
  // no sample spans the gap.
  void busy(Clock::time_point now);
  // A chunk of `bytes` completed at `now`, leaving `remaining` chunks in
  // flight or queued on the path.
  void completed(uint64_t bytes, Clock::time_point now, int remaining);
  // A new connection (another route): nothing measured yet.
  void reset() { *this = RateEstimate(); }
  // The last estimate, bytes/s, however old (0: never measured): for
  // statistics and for rules that judge the path's own recent traffic.
  double value() const { return rate_; }
  // Whether there is an estimate and it is too old to plan with at `now`
  // (kStale after its last sample): the adaptive policies then count the
  // path as not measured.
  bool stale(Clock::time_point now) const;

  // Totals since the connection opened: the bytes completed, and the
  // seconds the path held chunks (the spell under way counted up to `now`).
  // Over an interval, their quotient is the path's delivery rate while
  // busy, round trips and all: what path hunting compares. Unlike the
  // estimate, every path that carried chunks has one -- a fast path that
  // delivers each chunk before the next is posted too, so that a slow path
  // beside it is seen slow.
  struct Busy {
    uint64_t bytes = 0;
    double seconds = 0;
  };
  Busy busyTotals(Clock::time_point now) const;
  // That quotient since the previous call (bytes/s; 0 when the path held
  // no chunks meanwhile): path hunting's look. reset() starts it afresh.
  double busyRateSinceLastLook(Clock::time_point now);

 private:
  double rate_ = 0;
  Clock::time_point sampled_{};  // when rate_ took its last sample
  bool started_ = false;         // a sample is under way (since mark_)
  Clock::time_point mark_{};     // the completion the current sample starts at
  uint64_t bytes_ = 0;           // bytes completed since mark_
  int chunks_ = 0;               // chunks completed since mark_
  bool busy_ = false;            // the path holds chunks (since spell_)
  Clock::time_point spell_{};
  Busy busy_totals_;             // up to the spell under way
  Busy looked_;                  // busyTotals() at the last busyRateSinceLastLook()
};

}  // namespace multipath
}  // namespace maestro
