#include "multipath/discovery.h"

#include <set>

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

}  // namespace multipath
}  // namespace maestro
