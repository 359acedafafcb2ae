// What the engine tells about each of its paths (path_stats.cc):
// maestro_torch's path_stats(), the MAESTRO_DEBUG=INFO table, MAESTRO_METRICS.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace maestro {
namespace multipath {

struct PathStats {
  int peer = -1;
  int path = -1;
  std::string state;        // up | suspect | down
  std::string description;  // local -> remote addresses
  std::string last_error;
  std::string route;        // core hop found by discovery ("" if not probed)
  uint64_t reconnects = 0;
  uint64_t hunts = 0;       // re-opened on another route by path hunting
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t chunks_sent = 0, chunks_received = 0;
  uint64_t errors = 0, resent = 0;
  double throughput = 0;       // bytes/s while busy (EWMA)
  double completion_time = 0;  // seconds per chunk, post to ACK (EWMA)
  double rtt = 0;              // probe round trip, seconds (EWMA)
  // The NIC's congestion and loss counters (verbs: CNPs, ECN marks,
  // retransmissions), device-wide; empty where the device exposes none.
  std::map<std::string, uint64_t> nic_counters;
  // The path's own connection (TCP: TCP_INFO's bytes sent and retransmitted,
  // since the current connection opened) and its congestion control.
  std::string congestion;
  std::map<std::string, uint64_t> path_counters;
  // Share of the bytes sent that the transport retransmitted; -1 if unknown.
  double retransmitted() const;
};

}  // namespace multipath
}  // namespace maestro
