// The NIC's congestion and loss counters (paper §4.4: the path monitor reads
// DCQCN's CNP counters). RDMA devices publish them in sysfs under
// /sys/class/infiniband/<device>/ports/<port>/hw_counters/, one file per
// counter; which ones exist depends on the driver (mlx5 has the CNP/ECN
// counters, Soft-RoCE only retransmission and sequence-error counts).
//
// They are device-wide: every path on the device (every vNIC alias of one
// physical NIC) sees the same values, so they describe the NIC, not a path.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace maestro {
namespace transport {

// The congestion (ECN marks, CNPs) and loss (retransmissions, sequence
// errors) counters present under `port_dir`/hw_counters; empty if the
// directory does not exist or holds none of them.
std::map<std::string, uint64_t> readNicCounters(const std::string& port_dir);

// /sys/class/infiniband/<device>/ports/<port>
std::string nicPortDir(const std::string& device, int port);

}  // namespace transport
}  // namespace maestro
