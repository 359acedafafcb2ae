// Creating a transport by name, and the "auto" choice between them.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace maestro {
namespace transport {

struct TransportOptions {
  int rank = 0;
  int world_size = 1;
  std::array<uint8_t, Hello::kSecretBytes> secret{};  // accepted connections must present it
  CompletionSink* sink = nullptr;                     // receives every completion
  int max_inflight_per_path = 8;   // writes outstanding per path (verbs: send queue depth)
  bool busy_poll = false;          // spin: verbs on its CQ, tcp in the process's event loop
  std::string tcp_congestion;      // tcp: congestion control of every path ("" = the kernel's default)
  bool share_listen_ports = false; // tcp: SO_REUSEPORT on listeners (route discovery probes from them)
  uint16_t port_lo = 0, port_hi = 0;  // tcp: the listeners' ports (0, 0: the kernel picks)
  bool single_copy = false;        // tcp: payloads between processes of one host by cross-memory attach
};

// kind: "tcp" or "verbs".
std::unique_ptr<Transport> makeTransport(const std::string& kind, const TransportOptions& options);

// What a kind of transport offers the layers above, so that they ask for a
// capability and never compare transport names.
struct Capabilities {
  bool route_probes = false;        // its paths' routes can be probed and chosen by source port (discovery)
  bool descriptor_per_path = false; // each path holds a file descriptor (RLIMIT_NOFILE must allow them)
  bool congestion_control = false;  // each path runs a congestion control the group chooses
};
Capabilities capabilities(const std::string& kind);

// MAESTRO_TRANSPORT=auto: "verbs" when this build has the verbs transport and
// an RDMA device has a RoCE GID for every given vNIC address, else "tcp".
// `why` says how the choice was made (printed at MAESTRO_DEBUG=INFO).
std::string chooseTransport(const std::string& requested, const std::vector<std::string>& vnics,
                            std::string* why);

}  // namespace transport
}  // namespace maestro
