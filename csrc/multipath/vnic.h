// Where the paths start: the local "virtual NIC" addresses (paper §4.1).
#pragma once

#include <string>
#include <vector>

#include "common/config.h"

namespace maestro {
namespace multipath {

struct VnicChoice {
  std::vector<std::string> addresses;
  std::string source;  // how they were chosen, for the INFO log
  std::string warning;  // non-empty when the user should know (e.g. single path)
};

// MAESTRO_VNICS, else MAESTRO_IFNAME's addresses, else 127.0.0.1-4 when
// every rank runs on this host (same network namespace), else the address
// this host uses to reach `rendezvous_host` (one path, with a warning).
VnicChoice chooseVnics(const Config& config, bool all_ranks_on_this_host, const std::string& rendezvous_host);

// Loopback aliases used when all ranks share one host.
constexpr int kLoopbackPaths = 4;

}  // namespace multipath
}  // namespace maestro
