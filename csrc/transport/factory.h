// Creating a transport by kind, what a kind offers before one exists, and the
// "auto" choice between the kinds.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace maestro {
namespace transport {

// The kind every build and host can run: what "auto", and a group whose
// ranks chose differently, fall back to.
inline constexpr char kPortableKind[] = "tcp";

// kind: "tcp" or "verbs".
std::unique_ptr<Transport> makeTransport(const std::string& kind, const TransportOptions& options);

// What a transport of `kind` will answer to capabilities(), for the choices
// the layers above make before one exists (discovery, the descriptor limit).
// Read from the kind's own declaration (tcp::kCapabilities,
// verbs::kCapabilities), which its transport objects return.
Capabilities capabilities(const std::string& kind);

// MAESTRO_TRANSPORT=auto: "verbs" when this build has the verbs transport and
// an RDMA device has a RoCE GID for every given vNIC address, else "tcp".
// `why` says how the choice was made (printed at MAESTRO_DEBUG=INFO).
std::string chooseTransport(const std::string& requested, const std::vector<std::string>& vnics,
                            std::string* why);

}  // namespace transport
}  // namespace maestro
