#include "multipath/rate_estimate.h"

namespace maestro {
namespace multipath {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void RateEstimate::completed(uint64_t bytes, Clock::time_point now, int remaining) {
  if (!started_) {
    // The first completion of a spell (a round trip after its post): the
    // sample starts here if the path still holds chunks.
    started_ = remaining > 0;
    mark_ = now;
    bytes_ = 0;
    chunks_ = 0;
    return;
  }
  bytes_ += bytes;
  chunks_++;
  const double span = seconds(now - mark_);
  if (span >= kSample && chunks_ >= kChunks) {
    const double sample = static_cast<double>(bytes_) / span;
    const bool fresh = rate_ > 0 && seconds(now - sampled_) < kStale;
    rate_ = fresh ? rate_ + kGain * (sample - rate_) : sample;
    sampled_ = now;
    mark_ = now;
    bytes_ = 0;
    chunks_ = 0;
  }
  if (remaining == 0) started_ = false;  // the path is empty: the spell ends
}

bool RateEstimate::stale(Clock::time_point now) const { return rate_ > 0 && seconds(now - sampled_) >= kStale; }

}  // namespace multipath
}  // namespace maestro
