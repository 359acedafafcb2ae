// What a transport tells of its paths (transport.h): where each runs, its
// counters, and what the network acknowledged of its bytes. Every transport
// answers all three; a field it has nothing for stays empty.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace maestro {
namespace transport {

struct PathCounters {
  std::string congestion;                    // congestion control ("" if none or unknown)
  std::map<std::string, uint64_t> counters;  // name -> count since the connection opened
  // The sysfs directory of the NIC port the path runs on, whose congestion
  // and loss counters readNicCounters() reads (nic_counters.h; device-wide:
  // every path on the port shares them). "" where the path has no NIC port
  // of its own (tcp).
  std::string nic_port;
};

// What the network has acknowledged of a path's bytes, below the writes the
// transport completes (TCP: the kernel's ACKs, from TCP_INFO). A path whose
// bytes have had no acknowledgement for many round trips is dead, whatever
// the peer's process is doing; one whose bytes are being acknowledged is at
// most slow.
struct PathDelivery {
  bool known = false;          // false: the transport cannot tell (verbs: the adapter retries on its own)
  uint32_t unacked = 0;        // segments sent and not yet acknowledged
  double since_ack = 0;        // seconds since the last acknowledgement arrived
  double rtt = 0;              // smoothed round-trip time, seconds
  uint32_t timeouts = 0;       // retransmission timeouts in a row whose resends are not acknowledged yet
  double since_send = 0;       // seconds since the last bytes (new or resent) went out
  double loss = 0;             // share of the connection's segments it had to resend (0: none, or too few sent to tell)
};

class Diagnostics {
 public:
  virtual ~Diagnostics() = default;
  // Addresses a path uses, for the path table ("ip:port").
  virtual std::string describePath(int peer, int path) const = 0;
  // The path's current connection: its own congestion and loss counters
  // (TCP: the kernel's TCP_INFO -- bytes sent and retransmitted -- and the
  // congestion control it runs) and the NIC port it runs on (verbs).
  virtual PathCounters pathCounters(int peer, int path) const = 0;
  // What the network acknowledged of the path's current connection (the
  // path monitor asks it of a stalled path only).
  virtual PathDelivery delivery(int peer, int path) const = 0;
};

}  // namespace transport
}  // namespace maestro
