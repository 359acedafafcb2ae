#include "multipath/rate_estimate.h"

namespace maestro {
namespace multipath {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void RateEstimate::completed(uint64_t bytes, Clock::time_point now) {
  bytes_ += bytes;
  chunks_++;
  const double busy = seconds(now - mark_);
  if (busy < kSample || chunks_ < kChunks) return;
  const double sample = static_cast<double>(bytes_) / busy;
  const bool fresh = rate_ > 0 && seconds(now - sampled_) < kStale;
  rate_ = fresh ? rate_ + kGain * (sample - rate_) : sample;
  sampled_ = now;
  mark_ = now;
  bytes_ = 0;
  chunks_ = 0;
}

bool RateEstimate::stale(Clock::time_point now) const { return rate_ > 0 && seconds(now - sampled_) >= kStale; }

}  // namespace multipath
}  // namespace maestro
