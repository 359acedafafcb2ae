#include "multipath/discovery.h"

#include <algorithm>
#include <set>

#include "common/error.h"

namespace maestro {
namespace multipath {

Selection selectDisjoint(const std::vector<Candidate>& candidates, int wanted, bool forward_carries_data,
                         bool backward_carries_data) {
  // A new hop in a data-carrying direction is worth 2, in the other 1.
  const int wf = forward_carries_data ? 2 : 1, wb = backward_carries_data ? 2 : 1;
  Selection s;
  std::set<std::string> fwd, bwd;
  std::vector<bool> taken(candidates.size(), false);
  while (static_cast<int>(s.chosen.size()) < wanted && s.chosen.size() < candidates.size()) {
    int best = -1, best_score = -1;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (taken[i]) continue;
      const Candidate& c = candidates[i];
      int score = (!c.forward.empty() && !fwd.count(c.forward) ? wf : 0) +
                  (!c.backward.empty() && !bwd.count(c.backward) ? wb : 0);
      if (score > best_score) {
        best = static_cast<int>(i);
        best_score = score;
      }
    }
    taken[best] = true;
    s.chosen.push_back(best);
    if (!candidates[best].forward.empty()) fwd.insert(candidates[best].forward);
    if (!candidates[best].backward.empty()) bwd.insert(candidates[best].backward);
  }
  s.distinct_forward = static_cast<int>(fwd.size());
  s.distinct_backward = static_cast<int>(bwd.size());
  return s;
}

bool fullyDisjoint(const Selection& s, int wanted, bool forward_carries_data, bool backward_carries_data) {
  return (!forward_carries_data || s.distinct_forward >= wanted) &&
         (!backward_carries_data || s.distinct_backward >= wanted);
}

PathCount autoPathCount(int vnic_paths, const std::vector<int>& core_hops) {
  int seen = 0;
  for (int h : core_hops) seen = std::max(seen, h);
  PathCount c;
  if (seen <= vnic_paths) {
    c.paths = vnic_paths;
    c.why = seen == 0 ? "auto: one per vNIC"
                      : strcat("auto: one per vNIC (route probes found ", seen, " core hop", seen == 1 ? "" : "s",
                               " towards the ring neighbours)");
    return c;
  }
  c.paths = std::max(vnic_paths, std::min(seen, kAutoPathsMax));
  c.why = strcat("auto: route probes found ", seen, " core hops towards the ring neighbours and this group has ",
                 vnic_paths, " vNIC", vnic_paths == 1 ? "" : "s", ", so ", c.paths, " paths",
                 seen > kAutoPathsMax ? strcat(" (at most ", kAutoPathsMax, ")") : std::string(),
                 ", up to ", (c.paths + vnic_paths - 1) / vnic_paths, " flows per vNIC on source ports of their own");
  return c;
}

bool surveyDone(int sent, int seen, int new_in_round) {
  return seen == 0 || new_in_round == 0 || sent >= kSurveyProbes;
}

}  // namespace multipath
}  // namespace maestro
