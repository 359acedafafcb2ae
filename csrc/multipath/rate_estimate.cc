#include "multipath/rate_estimate.h"

namespace maestro {
namespace multipath {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void RateEstimate::busy(Clock::time_point now) {
  started_ = false;
  if (busy_) busy_totals_.seconds += seconds(now - spell_);  // its chunks were queued, not yet posted
  busy_ = true;
  spell_ = now;
}

void RateEstimate::completed(uint64_t bytes, Clock::time_point now, int remaining) {
  busy_totals_.bytes += bytes;
  if (remaining == 0 && busy_) {
    busy_totals_.seconds += seconds(now - spell_);
    busy_ = false;
  }
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

RateEstimate::Busy RateEstimate::busyTotals(Clock::time_point now) const {
  Busy b = busy_totals_;
  if (busy_ && now > spell_) b.seconds += seconds(now - spell_);
  return b;
}

double RateEstimate::busyRateSinceLastLook(Clock::time_point now) {
  const Busy total = busyTotals(now);
  const double busy_seconds = total.seconds - looked_.seconds;
  const double rate = busy_seconds > 0 ? static_cast<double>(total.bytes - looked_.bytes) / busy_seconds : 0.0;
  looked_ = total;
  return rate;
}

bool RateEstimate::stale(Clock::time_point now) const { return rate_ > 0 && seconds(now - sampled_) >= kStale; }

}  // namespace multipath
}  // namespace maestro
