// Per-path statistics: pathStats() (what maestro_torch's path_stats()
// returns), the table MAESTRO_DEBUG=INFO prints, and the chunk completion
// times the benchmarks sample.
#include "multipath/engine_core.h"
#include "multipath/engine_state.h"
#include "multipath/sender.h"

#include <iomanip>
#include <sstream>

#include "common/error.h"
#include "transport/nic_counters.h"

namespace maestro {
namespace multipath {
using namespace detail;

// ---------------------------------------------------------------- stats

std::vector<PathStats> EngineCore::pathStats() const {
  std::vector<PathStats> out;
  std::vector<int> ids;  // transport path ids
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    for (size_t i = 0; i < p.paths.size(); ++i) {
      const PathSlot& s = p.paths[i];
      PathStats st;
      st.peer = peer;
      st.path = static_cast<int>(i);
      // Suspect: set aside, or holding chunks past the stall that raises suspicion.
      const bool stalled = sender_->inflight(peer, st.path) > 0 && [&] {
        const BusyPath b = busyPath(p, st.path, Clock::now());
        return b.stalled > suspectAfter(b);
      }();
      st.state = !s.up ? "down" : (s.doubted || stalled) ? "suspect" : "up";
      st.description = s.description;
      st.last_error = s.last_error;
      st.route = s.route;
      st.reconnects = s.reconnects;
      st.hunts = s.hunt.hunts;
      sender_->stats(peer, st.path, &st);  // bytes and chunks sent, resent, throughput, completion time
      st.bytes_received = s.bytes_received;
      st.chunks_received = s.chunks_received;
      st.errors = s.errors;
      st.rtt = s.rtt;
      out.push_back(st);
      ids.push_back(s.id);
    }
  }
  // Outside the peers' locks: the transport takes its own. The counters are
  // the port's, so each port is read once, however many paths run on it.
  std::map<std::string, std::map<std::string, uint64_t>> by_port;
  for (size_t i = 0; i < out.size(); ++i) {
    transport::PathCounters pc = mesh_.transport->pathCounters(out[i].peer, ids[i]);
    out[i].congestion = std::move(pc.congestion);
    out[i].path_counters = std::move(pc.counters);
    if (pc.nic_port.empty()) continue;
    auto it = by_port.find(pc.nic_port);
    if (it == by_port.end()) it = by_port.emplace(pc.nic_port, transport::readNicCounters(pc.nic_port)).first;
    out[i].nic_counters = it->second;
  }
  return out;
}

double PathStats::retransmitted() const {
  auto sent = path_counters.find("tcp_bytes_sent");
  auto again = path_counters.find("tcp_bytes_retrans");
  if (sent == path_counters.end() || again == path_counters.end() || sent->second == 0) return -1;
  return static_cast<double>(again->second) / static_cast<double>(sent->second);
}

std::vector<double> EngineCore::chunkTimes(bool clear) { return sender_->chunkTimes(clear); }

std::string EngineCore::pathTable() const {
  std::ostringstream os;
  os << "  peer path state   " << std::left << std::setw(44) << "local <-> remote" << std::right << std::setw(12)
     << "sent MB" << std::setw(12) << "recv MB" << std::setw(9) << "chunks" << std::setw(7) << "errors"
     << std::setw(7) << "resent" << std::setw(7) << "hunts" << std::setw(10) << "MB/s" << std::setw(10) << "rtt ms"
     << std::setw(8) << "retx %" << "  cc\n";
  const std::vector<PathStats> stats = pathStats();
  for (const auto& s : stats) {
    os << "  " << std::setw(4) << s.peer << std::setw(5) << s.path << " " << std::left << std::setw(8) << s.state
       << std::setw(44) << s.description << std::right << std::fixed << std::setprecision(2) << std::setw(12)
       << s.bytes_sent / 1e6 << std::setw(12) << s.bytes_received / 1e6 << std::setw(9) << s.chunks_sent
       << std::setw(7) << s.errors << std::setw(7) << s.resent << std::setw(7) << s.hunts << std::setw(10)
       << s.throughput / 1e6
       << std::setw(10) << s.rtt * 1e3;
    // Retransmitted share of the bytes the connection sent (TCP loss the
    // kernel recovered from; "-" where the transport keeps no such count).
    const double retx = s.retransmitted();
    if (retx < 0) os << std::setw(8) << "-";
    else os << std::setw(8) << retx * 100;
    os << "  " << (s.congestion.empty() ? "-" : s.congestion) << "\n";
  }
  // Device-wide, so once: the NIC of the first path that has any.
  for (const auto& s : stats) {
    if (s.nic_counters.empty()) continue;
    os << "  NIC congestion/loss counters (device-wide):";
    for (const auto& kv : s.nic_counters) os << " " << kv.first << "=" << kv.second;
    os << "\n";
    break;
  }
  return os.str();
}

}  // namespace multipath
}  // namespace maestro
