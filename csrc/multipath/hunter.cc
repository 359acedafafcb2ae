#include "multipath/hunter.h"

#include <algorithm>

namespace maestro {
namespace multipath {

Hunter::Hunter(const Config& config)
    : enabled_(config.hunting()),
      ratio_(config.hunt_ratio),
      after_(config.hunt_after),
      interval_(config.hunt_interval) {}

double Hunter::interval(int streak) const { return interval_ * (1 << std::min(std::max(streak - 1, 0), 4)); }

std::vector<int> Hunter::tick(const std::vector<HuntSample>& paths, std::vector<HuntState>& states, double dt,
                              Clock::time_point now) const {
  std::vector<int> out;
  if (!enabled_) return out;
  for (size_t i = 0; i < paths.size(); ++i) {
    HuntState& st = states[i];
    const HuntSample& me = paths[i];
    // Only busy time counts: an idle path's throughput is stale, and a
    // path between operations is neither slow nor fine.
    if (!me.busy || !me.usable || me.throughput <= 0) continue;
    // Its siblings: the other busy, usable paths with a sample. One sibling
    // is enough to compare with (two paths: the slower of the pair).
    std::vector<double> others;
    for (size_t j = 0; j < paths.size(); ++j)
      if (j != i && paths[j].busy && paths[j].usable && paths[j].throughput > 0) others.push_back(paths[j].throughput);
    if (others.empty()) continue;
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    const double median = others[others.size() / 2];
    // Slow time counts up, fine time counts it back down: a loaded path's
    // rate swings around the threshold from one look to the next (on the
    // lab, 0.3-0.7 of its siblings' under a 150 Mbit/s UDP flow), so a
    // path slow most of the time is hunted, one slow as often as fine never.
    if (me.throughput < ratio_ * median) {
      st.slow_for += dt;
      st.fine_for = 0;
    } else {
      st.fine_for += dt;
      st.slow_for = std::max(0.0, st.slow_for - dt);
      if (st.fine_for >= interval_) st.streak = 0;
    }
    const bool rested = st.streak == 0 || std::chrono::duration<double>(now - st.last).count() >= interval(st.streak);
    if (st.slow_for >= after_ && rested) {
      st.slow_for = 0;
      st.last = now;
      st.streak++;
      out.push_back(static_cast<int>(i));
    }
  }
  return out;
}

int pickRoute(const std::vector<std::string>& hops, const std::vector<std::string>& avoid) {
  for (size_t i = 0; i < hops.size(); ++i)
    if (!hops[i].empty() && std::find(avoid.begin(), avoid.end(), hops[i]) == avoid.end()) return static_cast<int>(i);
  return -1;
}

}  // namespace multipath
}  // namespace maestro
