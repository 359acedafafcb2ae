// The verbs transport: the transport contract (transport/transport.h) on
// RDMA RC queue pairs, one QP per path, set up through rdma_cm from the
// path's own vNIC address so that each QP carries its alias's RoCEv2 GID (the
// paper's "vNIC-based QP-path mapping", SOSR'21 §4.1).
//
// This header is deliberately free of rdma-core includes: factory.cc and the
// tests include it, and only the .cc files of this folder need <infiniband/*>.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

struct ibv_qp;  // rdma-core's queue pair (only handed out to tests)

namespace maestro {
namespace transport {
namespace verbs {

// What a verbs transport offers (its objects' capabilities(); here, free of
// rdma-core, for the choices made before one exists): neither optional
// capability. No route control: RoCEv2 packets leave with the NIC's UDP
// source port, which no user-space socket can send a TTL-limited probe from
// (route_control.h). No fences: what the adapter sent lands whatever the
// sender does later (fencing.h). Its paths hold no file descriptor, and the
// NIC runs its congestion control (DCQCN), not the group.
inline constexpr Capabilities kCapabilities{};

// Creates the transport; throws maestro::Error when the host has no RDMA
// device or no rdma_cm. The device whose PD/CQ it uses is picked by the
// first vNIC address used (listen/connect), or by registerMemory() when the
// host has a single device. The sink must not call shutdown().
std::unique_ptr<Transport> makeVerbsTransport(const TransportOptions& options);

// True when the verbs transport can carry every one of `vnic_addrs`: an RDMA
// device has a RoCEv2 GID for each address (all on the same device, as the
// transport shares one PD/CQ), and the rdma_cm character device exists.
// Otherwise false, with the reason in *why (may be null), e.g. "no RDMA
// device" or "192.168.50.9 has no RoCE v2 GID on any RDMA device". Reads sysfs
// only: cheap, opens nothing.
bool verbsUsableFor(const std::vector<std::string>& vnic_addrs, std::string* why);

// The queue pair behind (peer, path) of a transport made by
// makeVerbsTransport, or nullptr (other transport, no such path). For tests
// and diagnostics (ibv_query_qp); the transport keeps owning it.
ibv_qp* verbsPathQp(Transport& transport, int peer, int path);

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
