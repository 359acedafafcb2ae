// Route control, an optional capability of a transport (transport.h:
// Transport::routeControl()): choosing a path's route through an ECMP fabric
// by its source port, and learning the route of a 5-tuple before a
// connection takes it. Discovery and path hunting (multipath/) run on it.
//
// A transport offers it only where it chooses its connections' source ports
// (tcp). Verbs does not: RoCEv2 packets leave with a UDP source port the NIC
// chooses (rxe hashes the QP number), which no user-space socket can reuse
// for a probe, and a new QP has a new number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"

namespace maestro {
namespace transport {

// One route probe: the 5-tuple (local endpoint -> remote endpoint) to probe.
struct RouteProbe {
  std::string local_endpoint;   // "ip:port" (a reserved port, or a listener's)
  std::string remote_endpoint;  // "ip:port"
};

class RouteControl {
 public:
  virtual ~RouteControl() = default;
  // Reserve a source port on a local address for a later connect()
  // (PathSpec::local_port) or reopen(), so that a probe and the connection
  // share their 5-tuple. Never 0.
  virtual uint16_t reservePort(const std::string& local_addr) = 0;
  virtual void releasePort(const std::string& local_addr, uint16_t port) = 0;
  // For each probe: the address of the router `ttl` hops out on the route of
  // that exact 5-tuple, from the ICMP time-exceeded answer to a TTL-limited
  // SYN (Paris traceroute, no privileges needed; the SYN dies before the
  // peer); "" where nothing answered before the deadline, or the peer was
  // reached first (no router that far). `why` says why none could be sent.
  virtual std::vector<std::string> probeRoutes(const std::vector<RouteProbe>& probes, int ttl, Deadline deadline,
                                               std::string* why) = 0;
  // Re-open a live path this side initiated from another source port
  // (`local_port` from reservePort(), or 0 for any new one), so that ECMP
  // hashes it onto another route (path hunting). The new connection
  // replaces the old one as a reconnect does: onPathError for the old, then
  // onPathUp. False if the peer was not reached in time: the old connection
  // goes on.
  virtual bool reopen(int peer, int path, uint16_t local_port, Deadline deadline) = 0;
};

}  // namespace transport
}  // namespace maestro
