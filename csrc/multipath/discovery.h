// Disjoint path selection (paper §4.1) for ECMP-hashed networks.
//
// With ECMP the routers hash each connection's 5-tuple, so two vNIC pairs
// may land on the same core link. Discovery opens more candidate connections
// than wanted (each with its own source port), learns the core hop each one
// takes in each direction (TTL-limited probes on the candidate's own 5-tuple:
// the router where the probe expires answers "time exceeded", Paris-
// traceroute style), and keeps a subset whose hops are as distinct as
// possible. Both ranks of a pair run the same deterministic selection on the
// same probe results (exchanged through the store), so they agree without a
// protocol of their own.
#pragma once

#include <string>
#include <vector>

namespace maestro {
namespace multipath {

struct Candidate {
  std::string forward;   // core hop from the lower rank to the higher ("" = unknown)
  std::string backward;  // core hop from the higher rank to the lower
};

struct Selection {
  std::vector<int> chosen;   // candidate indices, the paths in order
  int distinct_forward = 0;  // distinct known hops among the chosen
  int distinct_backward = 0;
};

// Choose `wanted` candidates, greedily maximising new distinct hops; the
// directions that carry data weigh most (the ring sends from rank r to r+1).
// Ties go to the lower index, so both ranks compute the same selection.
Selection selectDisjoint(const std::vector<Candidate>& candidates, int wanted, bool forward_carries_data,
                         bool backward_carries_data);

// Whether `selection` is as good as it can get: every chosen path on its
// own hop in the data-carrying directions.
bool fullyDisjoint(const Selection& selection, int wanted, bool forward_carries_data, bool backward_carries_data);

// MAESTRO_PATHS=auto. `vnic_paths`: one path per vNIC (the fewest any rank
// has); `core_hops`: how many distinct core hops each rank's route survey
// saw towards its ring neighbour (0 where no router answered). Where the
// routers hash flows over more spines than there are vNICs, one path per
// spine (several flows per vNIC, each on its own source port), so that
// discovery can place a path on every spine; at most kAutoPathsMax, since
// every path costs descriptors and buffers per peer. The rule is the same
// on every rank, from the same numbers.
constexpr int kAutoPathsMax = 16;
struct PathCount {
  int paths = 0;
  std::string why;  // for describe() and the INFO log
};
PathCount autoPathCount(int vnic_paths, const std::vector<int>& core_hops);

// The route survey's stopping rule: probes go out in rounds (one per vNIC,
// then twice as many each round), and the survey ends after a round in
// which no router answered at all (`seen` still 0: nothing to count), after
// a round that found no new core hop, or once `sent` reaches kSurveyProbes.
constexpr int kSurveyProbes = 64;
bool surveyDone(int sent, int seen, int new_in_round);

}  // namespace multipath
}  // namespace maestro
