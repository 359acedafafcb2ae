// The transport contract: a small, RDMA-shaped interface that every transport
// (tcp/, verbs/) implements. The multipath layer above it knows nothing else.
//
// A transport object is a device with paths, in parts of one concept each:
//   * memory.h           Memory: register, expose and conceal regions;
//   * acceptor.h         Acceptor: listen, expect the peers, accept their paths;
//   * paths.h            Paths: connect, reconnect, post writes and sends, close;
//   * diagnostics.h      Diagnostics: where a path runs, its counters;
//   * completion_sink.h  what comes back: completions, on transport threads;
// and two optional capabilities, reached through accessors that return
// nullptr where the transport has none (so nothing above calls a method that
// could only say "unsupported"):
//   * route_control.h    RouteControl: reserve ports, probe routes, re-open a
//                        path on another route (tcp);
//   * fencing.h          Fencing: take a path's writes back while it stays
//                        open (tcp).
// capabilities() says the same of the object, and transport::capabilities(kind)
// (factory.h) of a kind, from the same declaration (each transport's
// kCapabilities), for the choices made before a transport exists.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "transport/acceptor.h"
#include "transport/completion_sink.h"
#include "transport/diagnostics.h"
#include "transport/fencing.h"
#include "transport/memory.h"
#include "transport/paths.h"
#include "transport/route_control.h"

namespace maestro {
namespace transport {

// What a transport offers the layers above, so that they ask for a
// capability and never compare transport names.
struct Capabilities {
  bool route_control = false;       // routeControl() is there: routes are probed and chosen by source port
  bool fencing = false;             // fencing() is there: a path's writes can be withdrawn while it stays open
  bool descriptor_per_path = false; // each path holds a file descriptor (RLIMIT_NOFILE must allow them)
  bool congestion_control = false;  // each path runs a congestion control the group chooses
  bool operator==(const Capabilities&) const = default;
};

// How a transport is made (factory.h: makeTransport).
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

class Transport : public Memory, public Acceptor, public Paths, public Diagnostics {
 public:
  ~Transport() override = default;
  virtual Capabilities capabilities() const = 0;
  // The optional capabilities: nullptr where the transport has none
  // (capabilities().route_control / .fencing say the same).
  virtual RouteControl* routeControl() = 0;
  virtual Fencing* fencing() = 0;
  // Stop all threads and close every path. Idempotent.
  virtual void shutdown() = 0;
};

// For an implementation's static_assert: its declared capabilities name
// exactly the optional interfaces the class implements.
template <class Impl>
constexpr bool declaresWhatItImplements(const Capabilities& c) {
  return c.route_control == std::is_base_of_v<RouteControl, Impl> && c.fencing == std::is_base_of_v<Fencing, Impl>;
}

}  // namespace transport
}  // namespace maestro
