// QP manager (paper §4.1, §5.1): the control plane that turns a group of
// ranks into a full mesh of paths.
//
// Through the rendezvous store the ranks agree on: whether they share one
// host, the group-wide knobs (identical on every rank, else a clear error on
// every rank), a random per-group secret that every connecting path must
// present, each rank's vNIC addresses and listening endpoints, the number of
// paths, and the transport. Then the lower rank of every pair opens path i
// from its vNIC i to the peer's vNIC i (bind before connect), so the network
// sees one distinct flow per path.
//
// Every step publishes "ok:<value>" or "error:<message>" under the rank's key
// for that step, so a rank that fails (a bad knob, an address that is not
// local) makes every other rank fail at once with that message instead of
// waiting for the timeout.
#pragma once

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
  std::vector<std::vector<std::string>> endpoints;   // every rank's listening endpoints (ip:port)
  int paths = 0;
  // Per peer, per path: the transport's path id (a candidate index under
  // discovery, else the path index), whether it connected at start-up (a
  // path that did not starts down and is retried), whether this rank opened
  // it (and so reconnects it), and the core hop it was found to take.
  std::vector<std::vector<int>> ids;
  std::vector<std::vector<bool>> up;
  std::vector<std::vector<std::string>> routes;
  std::vector<bool> initiator;
  std::string discovery;         // off | ttl: MAESTRO_DISCOVERY resolved (auto decided at set-up)
  std::string discovery_why;     // how auto decided
  std::string discovery_report;  // for the INFO log
};

class QpManager {
 public:
  QpManager(Rendezvous& store, int rank, int size, Deadline deadline);

  // Resolves the config (Options overrides + environment) as the first step,
  // so a bad knob on one rank fails every rank.
  Config agreeOnConfig(const std::map<std::string, std::string>& overrides);
  // Agree on vNICs, paths per peer, the group secret, the transport, and
  // (discovery=auto) whether the ranks are routed apart: then discovery runs.
  Mesh plan(const Config& config, const std::string& rendezvous_host);
  // Create the transport, listen, exchange endpoints and connect every path
  // (under discovery: candidates in rounds, probed, the disjoint ones kept).
  // Completions may reach `sink` as soon as the first path is up.
  void open(const Config& config, Mesh& mesh, transport::CompletionSink* sink);

 private:
  // Connect every (peer, path, local port) in parallel; returns which
  // connected (per peer), and why the others did not.
  struct Planned {
    int peer, path;
    uint16_t local_port;
  };
  void connectAll(const Config& config, Mesh& mesh, const std::vector<std::vector<std::string>>& endpoints,
                  const std::vector<Planned>& planned, std::vector<std::vector<int>>* connected,
                  std::vector<std::string>* errors);
  // Discovery: which candidate of each pair becomes which path.
  std::map<int, std::vector<int>> discover(const Config& config, Mesh& mesh,
                                           const std::vector<std::vector<std::string>>& endpoints,
                                           std::map<int, std::vector<uint16_t>>* ports);
  // Publish our value for `step` and collect every rank's. Throws with the
  // message of the first rank that published an error.
  std::vector<std::string> allGather(const std::string& step, const std::string& value);
  // discovery=auto: is a router MAESTRO_PROBE_TTL hops out towards our ring
  // neighbour (a probe from each vNIC)? Every rank's answer decides.
  bool routedApart(const Config& config, const Mesh& mesh, std::string* why);
  void publishError(const std::string& message);

  Rendezvous& store_;
  const int rank_;
  const int size_;
  const Deadline deadline_;
  std::vector<std::string> published_;  // steps this rank has published
  size_t accepted_ = 0;                  // paths the peers opened to us so far
};

}  // namespace multipath
}  // namespace maestro
