// QP manager (paper §4.1, §5.1): the control plane that connects the ranks
// of a group by paths: ring neighbours at start-up, any other pair on first
// use.
//
// Through the rendezvous store the ranks agree on: whether they share one
// host, the group-wide knobs (identical on every rank, else a clear error on
// every rank), a random per-group secret that every connecting path must
// present, each rank's vNIC addresses and listening endpoints, the number of
// paths, and the transport. Then the lower rank of every pair to connect
// opens path i from its vNIC i to the peer's vNIC i (bind before connect), so
// the network sees one distinct flow per path.
//
// Every step publishes "ok:<value>" or "error:<message>" under the rank's key
// for that step, so a rank that fails (a bad knob, an address that is not
// local) makes every other rank fail at once with that message instead of
// waiting for the timeout.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/rendezvous.h"
#include "multipath/vnic.h"
#include "transport/factory.h"
#include "transport/transport.h"

namespace maestro {
namespace multipath {

struct Mesh {
  std::unique_ptr<transport::Transport> transport;
  transport::TransportOptions options;  // secret, rank, window, ...
  std::string transport_kind;
  std::string transport_why;
  std::string congestion_why;    // tcp: the paths' congestion control and why
  VnicChoice vnics;
  std::vector<std::vector<std::string>> peer_vnics;  // every rank's vNIC addresses
  std::vector<std::string> hosts;                    // every rank's host and network namespace (net::hostIdentity)
  std::vector<std::vector<std::string>> endpoints;   // every rank's listening endpoints (ip:port)
  int paths = 0;
  std::string paths_why;         // how MAESTRO_PATHS was settled
  std::string discovery;         // off | ttl: MAESTRO_DISCOVERY resolved (auto decided at set-up)
  std::string discovery_why;     // how auto decided
};

// The paths to one peer, once connected: the transport's path id of each (a
// candidate index under discovery, else the path index), whether it
// connected (a path that did not starts down and is retried), whether this
// rank opened them (and so reconnects them), and the core hop each was
// found to take.
struct PeerPaths {
  std::vector<int> ids;
  std::vector<bool> up;
  std::vector<std::string> routes;
  bool initiator = false;
  std::string report;  // discovery's findings, for the INFO log ("" without discovery)
  // Without discovery: path i is transport path i, its route unknown.
  void plain(int paths) {
    for (int p = 0; p < paths; ++p) ids.push_back(p);
    routes.assign(paths, "");
  }
  // Which of `ids` are up: those that connected.
  void markUp(const std::vector<int>& connected) {
    up.clear();
    for (int id : ids) up.push_back(std::find(connected.begin(), connected.end(), id) != connected.end());
  }
};

// A pair of ranks (lower first) to connect.
using RankPair = std::pair<int, int>;

class QpManager {
 public:
  QpManager(Rendezvous& store, int rank, int size, Deadline deadline);
  Rendezvous& store() const { return store_; }

  // The ranks a group connects to at start-up: its ring's pairs (every ring
  // collective's neighbours) and its barrier's (ranks 2^k apart, both ways:
  // log2(n) partners each way), or every pair (eager). The rest connect when
  // first used. The barrier's are connected at start-up because a barrier is
  // what a job ends with: its ranks leave as soon as they have heard from
  // everyone, the rank that hosts the store among them, and a pair that
  // connected then would have no store.
  static std::vector<RankPair> startUpPairs(int size, bool eager);

  // Resolves the config (Options overrides + environment) as the first step,
  // so a bad knob on one rank fails every rank.
  Config agreeOnConfig(const std::map<std::string, std::string>& overrides);
  // Agree on vNICs, paths per peer, the group secret, the transport, and
  // (discovery=auto) whether the ranks are routed apart: then discovery runs.
  Mesh plan(const Config& config, const std::string& rendezvous_host);
  // Create the transport, listen, and exchange every rank's endpoints. No
  // path is opened yet. Completions may reach `sink` as soon as one is.
  void open(Mesh& mesh, transport::CompletionSink* sink);
  // At start-up, every rank with the same `pairs`: connect those this rank
  // belongs to (under discovery: candidates in rounds, probed, the disjoint
  // ones kept). Returns the paths to each of its peers among them.
  std::map<int, PeerPaths> connectAtStart(const Config& config, Mesh& mesh, const std::vector<RankPair>& pairs);
  // Later, on first use: connect this rank and `peer`, the two of them
  // alone. Without discovery the lower rank opens the paths and the other
  // takes them as they come; under discovery, the start-up protocol through
  // the store under the pair's own keys. Both ranks call it; it returns
  // early with an error once `stop` is set.
  PeerPaths connectPair(const Config& config, Mesh& mesh, int peer, Deadline deadline,
                        const std::atomic<bool>& stop);
  // Publish our value for `step` and collect every rank's. Throws with the
  // message of the first rank that published an error.
  std::vector<std::string> allGather(const std::string& step, const std::string& value);

 private:
  // One exchange of records among the ranks of a scope: each publishes its
  // value for `step` and gets every rank's ("" from ranks outside it).
  using Exchange = std::function<std::vector<std::string>(const std::string& step, const std::string& value)>;
  // connectPair without discovery: no agreement, no store.
  PeerPaths connectPairDirectly(const Config& config, Mesh& mesh, int peer, Deadline deadline,
                                const std::atomic<bool>& stop);
  std::map<int, PeerPaths> connectPairs(const Config& config, Mesh& mesh, const std::vector<RankPair>& pairs,
                                        const Exchange& exchange, Deadline deadline);
  // Connect every (peer, path, local port) in parallel; returns which
  // connected (per peer), and why the others did not.
  struct Planned {
    int peer, path;
    uint16_t local_port;
  };
  void connectAll(const Config& config, Mesh& mesh, const std::vector<Planned>& planned, Deadline deadline,
                  std::map<int, std::vector<int>>* connected, std::map<int, std::string>* errors);
  // Discovery, on the transport's route control: which candidate of each
  // pair this rank belongs to becomes which path (and the core hop of each,
  // in `paths`).
  void discover(const Config& config, Mesh& mesh, const std::vector<RankPair>& pairs, const Exchange& exchange,
                transport::RouteControl& routes, std::map<int, PeerPaths>* paths,
                std::map<int, std::vector<uint16_t>>* ports);
  // Discovery's end, from every pair's candidates (their source ports, and
  // the core hop each direction's probe found): the chosen ones of each pair
  // this rank is in, with their routes and report; the opener gives back the
  // ports of the others.
  using Hops = std::map<int, std::vector<std::string>>;  // pair -> hop of each candidate
  void chooseCandidates(Mesh& mesh, transport::RouteControl& routes, std::map<int, std::vector<uint16_t>>& cand_port,
                        Hops& fwd, Hops& bwd, std::map<int, PeerPaths>* paths,
                        std::map<int, std::vector<uint16_t>>* ports);
  // Route probes MAESTRO_PROBE_TTL hops out towards our ring neighbour:
  // does a router answer (discovery=auto: every rank's answer decides), and
  // how many distinct ones (the core hops, for paths=auto)?
  struct RouteSurvey {
    int core_hops = 0;  // distinct routers that answered
    std::string why;    // when none did
    bool routed() const { return core_hops > 0; }
  };
  RouteSurvey surveyRoutes(const Config& config, const Mesh& mesh);
  void publishError(const std::string& message);

  Rendezvous& store_;
  const int rank_;
  const int size_;
  const Deadline deadline_;
  std::vector<std::string> published_;  // steps this rank has published
};

}  // namespace multipath
}  // namespace maestro
