// RoCE GID lookup by IP address, from sysfs.
//
// RoCE derives one GID per (IP address, RoCE version) of the netdev an RDMA
// port sits on: an IPv4 address a.b.c.d becomes ::ffff:a.b.c.d. GID *indexes*
// are not stable (they depend on the order addresses were added), so they are
// always looked up by address, never configured. The kernel publishes the
// table under /sys/class/infiniband/<dev>/ports/<port>/gids/<index>, with the
// kind of each entry in gid_attrs/types/<index> ("RoCE v2", "IB/RoCE v1").
#pragma once

#include <string>
#include <vector>

namespace maestro {
namespace transport {
namespace verbs {

struct GidEntry {
  std::string device;  // e.g. "rxe0", "mlx5_0"
  int port = 0;
  int index = -1;      // GID index, as ah_attr.grh.sgid_index uses it
};

// Names of the RDMA devices the kernel knows (empty: none, or no sysfs).
std::vector<std::string> rdmaDeviceNames();

// The RoCEv2 GID entry for an IP literal (IPv4 or IPv6), searching every
// device and port. Returns false when there is none.
bool findRoceV2Gid(const std::string& ip, GidEntry* out);

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
