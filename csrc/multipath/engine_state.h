// The engine's per-peer and per-path state -- health, connection, control
// and receive side -- shared by the files that implement EngineCore
// (engine_core.h): engine.cc, sender.cc, receiver.cc, control.cc,
// failover.cc, monitor.cc, hunting.cc, connections.cc, shared_paths.cc and
// path_stats.cc. The send side (queues, chunks in flight, the messages
// being sent, what each path carried) is the sender's (sender.h), indexed
// by the same peer and path, and guarded by the same Peer::mu. Internal: no
// other file includes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "multipath/engine_core.h"
#include "multipath/path_health.h"
#include "multipath/reassembler.h"

namespace maestro {
namespace multipath {
namespace detail {

// Control message header; the payload follows.
struct ControlHeader {
  uint8_t type;
  uint8_t reserved[3];
  uint32_t sub;
  uint64_t seq;
};
static_assert(sizeof(ControlHeader) == 16, "ControlHeader is a wire format");

// Exponentially weighted moving average with a fixed gain.
inline double ewma(double current, double sample, double gain = 0.2) {
  return current <= 0 ? sample : current + gain * (sample - current);
}

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace detail

struct EngineCore::SentControl {
  Clock::time_point at;
  std::vector<uint8_t> msg;
};

namespace detail {
constexpr double kMinDoubtWindow = 0.5;  // seconds: a floor for scheduling noise on a loaded host, and for TCP's own recovery
constexpr double kBusyTick = 0.025;       // seconds between the monitor's looks while chunks are in flight
// A path with this many control messages unconfirmed is probed: the pong
// confirms them all (the path is ordered). None is ever dropped: until a
// probe answers or the path is closed (then they are re-sent elsewhere),
// they are kept.
constexpr size_t kConfirmAfter = 4096;
// A peer's control messages waiting to be taken: at most this many
// operations ahead of the last one this rank finished, and this many in all.
// Beyond either, the peer is not following the protocol.
constexpr uint64_t kMaxOpsAhead = 1u << 16;
constexpr size_t kMaxInbox = 1u << 16;
}  // namespace detail

struct EngineCore::PathSlot {
  int id = -1;             // the transport's path id
  bool initiated = false;  // this rank opened it, and reopens it after a failure
  bool up = false;
  // The peer reported this path dead (kPathDown). The notice may be about a
  // connection that has since been replaced, so unless our own chunks on it
  // are stuck too, the path is not closed on the peer's word: it is set
  // aside (no new chunks or control messages) and probed, cleared by any
  // answer, and closed if none comes within doubtWindow() (a few RTTs, at
  // most path_timeout).
  bool doubted = false;
  Clock::time_point doubted_since{};
  // Set aside while it held chunks, on a transport that fences (TCP): its
  // chunks were withdrawn and sent again elsewhere, and the peer told to
  // drop them up to `fence_mark`. It still counts `fenced` chunks held for
  // the monitor, which judges it by its own traffic as before (closed once
  // the network shows its bytes are lost); its probe's answer clears it.
  int fenced = 0;
  uint64_t fence_mark = 0;
  // Its connection failed (transport: onPathFenced): the peer drops what of
  // it still arrives, up to `closed_mark`, which it hears on every path
  // before any copy of a flushed chunk -- on the paths up then, and on one
  // that comes up later before its first chunk. Cleared when the path is up
  // again (its new connection replaced the old one on both sides).
  uint64_t closed_mark = 0;
  std::string description;
  std::string last_error;
  std::string route;
  uint64_t reconnects = 0;
  HuntState hunt;
  uint64_t tick_bytes = 0;  // the sender's bytes_sent at the hunter's last look
  uint64_t bytes_received = 0, chunks_received = 0, errors = 0;
  // Monitor.
  double rtt = 0;            // EWMA probe RTT
  Clock::time_point ping_sent{};
  bool ping_outstanding = false;
  Clock::time_point last_arrival{};  // the peer's last write that landed through this path
  // Control messages posted here and not yet known to have arrived. The path
  // is ordered, so a completion of a write posted later, or the pong of a
  // ping posted later, proves delivery; if the path dies first they are
  // re-sent on a live one (every control message is idempotent by its key).
  std::deque<SentControl> unconfirmed;
  // Everything posted here up to `t` has arrived.
  void confirmUpTo(Clock::time_point t) {
    while (!unconfirmed.empty() && unconfirmed.front().at <= t) unconfirmed.pop_front();
  }
};

struct EngineCore::Peer {
  Peer(int rank, const Config& config, const Chunking& chunking)
      : rank(rank), lately(heardLately(config.probe_interval)), reassembler(chunking) {}
  const int rank;
  const double lately;  // heardLately(): silence past this is a silence of the peer (or of this process)
  std::mutex mu;  // everything of this peer's, and its send side in the sender (engine_core.h: Locking)
  std::vector<PathSlot> paths;
  // Up, and not in doubt -- unless every up path is in doubt: then the
  // doubted ones still carry traffic rather than none.
  // A path being re-opened by hunting is set aside the same way.
  bool usable(size_t i) const {
    if (!paths[i].up) return false;
    if (inUse(paths[i])) return true;
    for (const auto& s : paths)
      if (inUse(s)) return false;
    return true;
  }
  // Up, not in doubt, not being re-opened.
  static bool inUse(const PathSlot& s) { return s.up && !s.doubted && !s.hunt.active; }
  std::vector<int> slot_of;       // transport path id -> index in paths (-1: not ours)
  Reassembler reassembler;
  std::map<ControlKey, std::vector<uint8_t>> inbox;
  std::unordered_map<uint32_t, std::shared_ptr<RecvOp>> receiving;  // by tag
  int awaited = 0;  // operations waiting on the peer's word (Engine::awaiting)
  // Not yet asked for, being connected (on first use), or connected (its
  // paths are set: `paths` is empty until then).
  enum class Link : uint8_t { kNone, kConnecting, kUp };
  Link link = Link::kNone;
  // Control messages sent while it was connecting, posted once it is up.
  std::vector<std::pair<std::vector<uint8_t>, bool>> waiting_control;
  // Connections that failed before the paths were installed (transport path
  // id, error): a peer that exits while its pair connects closes them
  // before this side knows its paths. They are down from the install on.
  std::vector<std::pair<int, std::string>> early_errors;
  bool unreachable = false;
  bool left = false;  // the peer said goodbye (its group was destroyed)
  // The failure its goodbye named (of operation left_after_seq), if any:
  // named to this rank's operations that had not finished that one.
  std::string left_after;
  uint64_t left_after_seq = 0;
  std::string error;
  Clock::time_point last_heard{};  // any completion, arrival or message from this peer
  // When it was heard again after a silence longer than `lately`: the peer,
  // or this process, was stopped. A stall counts from then at the earliest,
  // or every path stalled across the silence would be closed as blackholed
  // the moment the first one is heard again. (p.mu held.)
  Clock::time_point back_at{};
  void heard(Clock::time_point now) {
    if (detail::seconds(now - last_heard) > lately) back_at = now;
    last_heard = now;
  }
  Clock::time_point hunt_tick{};   // the hunter's last look at its paths
};

}  // namespace multipath
}  // namespace maestro
