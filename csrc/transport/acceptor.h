// The accepting side of the transport contract (transport.h): listening on
// the local vNIC addresses, learning who may connect, waiting for the paths
// peers open.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/clock.h"

namespace maestro {
namespace transport {

class Acceptor {
 public:
  virtual ~Acceptor() = default;
  // Start accepting paths on a local vNIC address; returns the endpoint
  // string peers connect to. Accepted connections must present the secret
  // of TransportOptions.
  virtual std::string listen(const std::string& local_addr) = 0;
  // The endpoints every rank published (endpoints[rank][i], "ip:port"): an
  // accepted path `path` from `rank` must come from the address of
  // endpoints[rank][path % size], the vNIC that rank opens it from. Until
  // this is called, hellos with the right secret wait; none is installed.
  virtual void expectPeers(const std::vector<std::vector<std::string>>& endpoints) = 0;
  // Wait until `count` paths were accepted from peers (or the deadline).
  virtual void awaitAccepted(size_t count, Deadline deadline) = 0;
  // Wait until every one of `paths` from `peer` was accepted, or the
  // deadline; returns those that were. Throws if fewer than `at_least` were
  // by then. A pair connected after start-up, while others may connect
  // beside it, waits for its own paths and no count of everyone's.
  virtual std::vector<int> awaitAcceptedFrom(int peer, const std::vector<int>& paths, size_t at_least,
                                             Deadline deadline) = 0;
};

}  // namespace transport
}  // namespace maestro
