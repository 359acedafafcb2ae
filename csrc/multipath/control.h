// The control channel's message types: small two-sided messages between
// the engines of a pair (control.cc), for the collectives, point to point,
// path health and hunting.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

namespace maestro {
namespace multipath {

enum class ControlType : uint8_t {
  kDesc = 1, kCredit = 2, kAbort = 3, kBarrier = 4, kPing = 5, kPong = 6, kBye = 7,
  kPathDown = 8,  // "your path <sub> to me is dead": verified by a probe, then closed (its opener reconnects)
  // Point to point (collectives/p2p.h); seq is the sender's message number
  // towards this receiver, not an operation.
  kP2PReady = 9,   // sender -> receiver: message <seq> with user tag <sub> and its size is waiting
  kP2PGrant = 10,  // receiver -> sender: write message <seq> here, on these engine tags (or: refused)
  kP2PDone = 11,   // sender -> receiver: message <seq>'s writes are over (or: it was cancelled)
  // Path hunting (multipath/hunter.h); sub is the transport path id.
  kHunt = 12,       // opener -> acceptor: path <sub> is being re-opened on another route (drain it)
  kHuntAsk = 13,    // acceptor -> opener: path <sub> is slow towards you: offer me source ports
  kHuntOffer = 14,  // opener -> acceptor: candidate source ports (uint16 each), reserved for a while
  kHuntPick = 15,   // acceptor -> opener: re-open from this port (uint16; 0: none goes elsewhere)
  // "I took back my writes on path <sub> up to mark <seq> and send them again
  // elsewhere: drop the rest of them" (Fencing::withdrawWrites(): only where
  // the transport fences).
  kFence = 16,
};

// A point-to-point control message as it arrived.
struct P2PMessage {
  int peer = -1;
  ControlType type = ControlType::kP2PReady;
  uint64_t seq = 0;
  uint32_t sub = 0;
  std::vector<uint8_t> body;
};

struct ControlKey {
  ControlType type;
  uint64_t seq;
  uint32_t sub;
  bool operator<(const ControlKey& o) const {
    return std::tie(type, seq, sub) < std::tie(o.type, o.seq, o.sub);
  }
};

}  // namespace multipath
}  // namespace maestro
