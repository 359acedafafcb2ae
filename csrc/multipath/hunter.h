// Path hunting (CAVER's "hunt for the less-congested path"; Google PLB's
// re-hash on persistent congestion).
//
// Discovery puts a peer's paths on distinct core routes at set-up, but under
// ECMP nothing moves a path later: when background traffic heats the spine
// one path hashed onto, that path stays slow for as long as the traffic
// lasts (the adaptive scheduler gives it less, but the pair loses its share
// of the fabric). The hunter watches every path's delivery rate while busy
// over each look (RateEstimate::busyRateSinceLastLook) against its
// siblings'; a path below `hunt_ratio` of their median for `hunt_after`
// seconds of busy time more than it was above it is re-opened from a source port whose
// route (probed with discovery's TTL-limited SYNs on that exact 5-tuple)
// uses a core hop no other path of the peer uses -- or, without discovery,
// from a fresh port (a blind re-hash, as PLB does). The engine drains the
// path, swaps the connection and lets the scheduler refill it.
//
// Bounded: one path is re-opened at most every `hunt_interval` seconds,
// doubling (up to 16x) while it keeps being slow after each re-opening, and
// the streak resets only once it has been fine for an interval -- so a
// fabric that is hot everywhere costs a few connections, never a flap.
//
// The decision and the choice of route are pure functions of the samples
// (no sockets), unit-tested in tests/cpp/test_hunter.cc.
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "common/config.h"

namespace maestro {
namespace multipath {

// Seconds between the hunter's looks at a peer's paths. The monitor ticks
// far more often while chunks are in flight (failover needs it); a look
// that short would see a slow path's one good chunk, or a sibling between
// two chunks, as a fine interval and restart the slow count, so the hunter
// keeps its own, slower cadence: each look spans many chunk times.
constexpr double kHuntTick = 0.5;

struct HuntState {
  double slow_for = 0;  // busy seconds spent slow, less those spent fine since (never below 0)
  double fine_for = 0;  // busy seconds spent not slow, in a row
  Clock::time_point last{};  // the last re-opening decided
  int streak = 0;            // re-openings without a fine interval between them
  uint64_t hunts = 0;        // re-openings done (path_stats)
  Clock::time_point reopened{};  // the last re-opening done, whichever side or group decided it
  // Being re-opened: no new chunks; set on the opener while it drains and
  // swaps, on the acceptor from the opener's notice until the new
  // connection arrives (or `since` + a few seconds, if it never does).
  bool active = false;
  Clock::time_point since{};
  std::string next_route;  // the core hop the new connection was chosen for
};

struct HuntSample {
  bool busy = false;      // carried data (or held chunks) since the last look
  bool usable = false;    // up, not in doubt, not being re-opened
  double throughput = 0;  // bytes/s while busy since the last look (0: none delivered)
};

class Hunter {
 public:
  Hunter() = default;  // disabled
  explicit Hunter(const Config& config);
  bool enabled() const { return enabled_; }
  // One look (`dt` seconds since the last, about kHuntTick) over one peer's paths:
  // updates `states` and returns the paths to re-open now.
  std::vector<int> tick(const std::vector<HuntSample>& paths, std::vector<HuntState>& states, double dt,
                        Clock::time_point now) const;
  // Seconds before a path with `streak` recent re-openings may be re-opened again.
  double interval(int streak) const;

 private:
  bool enabled_ = false;
  double ratio_ = 1, after_ = 0, interval_ = 0;
};

// The first candidate whose probed core hop is known and not in `avoid`
// (the hops the peer's other paths take, and the hot one); -1 if none.
int pickRoute(const std::vector<std::string>& hops, const std::vector<std::string>& avoid);

}  // namespace multipath
}  // namespace maestro
