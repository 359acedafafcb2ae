// Path health for a path with something outstanding: is it slow, or dead?
//
// The monitor used to wait for path_timeout (2 s) without a completion
// before it closed a path; a blackholed link cost every job that long. Now
// it judges an outstanding path from the traffic itself, within a few of its
// round trips:
//
//   1. Only a path that holds something -- chunks in flight, or control
//      messages not yet known to have arrived -- for at least kStallFloor
//      without progress, and whose peer was heard from since (elsewhere) and
//      lately (heardLately()), is judged. A path whose peer is silent on
//      every path is not: the peer is stopped or cut off, and judgePeer()
//      covers that. (A frozen peer's paths stall one after another as their
//      buffers fill: each was "heard since" for a moment; "lately" keeps
//      them from being closed one by one as blackholed.)
//   2. From below. Where the transport sees what the network acknowledged
//      (TCP: the kernel's ACKs), a path whose bytes have waited for an
//      acknowledgement for noAckLimit() -- four RTTs, at least kNoAckFloor --
//      while it held them is suspect: set aside (no new chunks), its control
//      messages re-sent elsewhere at once (they are idempotent), its chunks
//      in flight withdrawn and sent again on the other paths (a fence,
//      where the transport has one: Fencing::withdrawWrites(); the peer
//      drops the originals that still arrive, so the path may stay open,
//      and the stall ends here), probed.
//      It is dead once TCP's own recovery has resent deadTimeouts() times in a
//      row (retransmission timeouts: their floor is 50 ms where the kernel
//      allows, net.h; two, more on a path that loses segments often) and
//      the last resend too has had no answer for resendLimit(), nor has
//      anything else come from the peer on the path since it left, or after
//      kNoAckDead of silence whatever TCP did:
//      closed, its chunks re-sent on the others. A congested link loses a
//      whole flight, its tail-loss probe, even a timeout's resend now and
//      then, and a delayed ACK holds a lone segment's answer back; two
//      resends in a row only where it loses many segments, and there the
//      rule asks for more.
//      One whose bytes are being acknowledged is at most slow (a busy peer
//      process does not stop its kernel) and is left alone. One whose bytes
//      were all acknowledged but whose chunks (not control messages: later
//      traffic confirms those) do not complete, while nothing
//      at all has come from the peer on the path for that limit (the
//      completions lost on the way back: a blackhole that began after the
//      ACKs), is suspect too, past suspectAfter().
//   3. By probe. Where the transport cannot tell, a path whose chunks have
//      stalled past suspectAfter() -- eight times the gap its own rate
//      predicts between two chunks, two RTTs, at least kStallFloor -- is
//      suspect: set aside (no new chunks) and probed; the monitor closes it
//      if neither a completion nor the probe's answer comes within the doubt
//      window.
//   4. The backstop: chunks without a completion for path_timeout.
//
// A peer silent on every path at once -- a stopped process, a hung host,
// every route to it lost -- leaves no path "heard elsewhere" to judge by.
// judgePeer() covers it: while an operation waits on the peer, probes to it
// that stay unanswered for peer_timeout (MAESTRO_PEER_TIMEOUT, 10 s) while
// nothing else came from it fail it. A live process answers probes from its
// own event loop whatever its Python code is doing, so only a process that
// cannot run at all stays silent that long.
//
// A pure function of what the monitor observed (no clock, no sockets),
// unit-tested in tests/cpp/test_path_health.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "transport/diagnostics.h"

namespace maestro {
namespace multipath {

// What the monitor knows of one path that holds something.
struct BusyPath {
  int inflight = 0;           // chunks posted and not completed
  int control = 0;            // control messages posted and not known to have arrived
  double stalled = 0;         // seconds it has held them without progress (since the last
                              // completion, the post that made it busy, or its oldest
                              // unconfirmed control message)
  double chunk_bytes = 0;     // the size of its chunks
  double throughput = 0;      // its rate while busy, bytes/s (0: not measured yet)
  double rtt = 0;             // its probe RTT, seconds (0: not measured yet)
  bool heard_since = false;   // the peer was heard from (on any path) after the stall began, and lately
  bool doubted = false;       // already set aside and probed
  double path_timeout = 2.0;  // the backstop (MAESTRO_PATH_TIMEOUT)
  transport::PathDelivery delivery;  // what the network acknowledged (transport-dependent)
};

enum class Health {
  kFine,     // nothing to do
  kSuspect,  // set it aside and probe it (transports that cannot see acknowledgements)
  kDead,     // close it: what it holds moves
};

struct Verdict {
  Health health = Health::kFine;
  std::string why;  // the evidence: what a closed path is closed with, what a suspect one is set aside for
};

// Shortest stall that is judged, seconds: above the scheduling noise of a
// loaded host.
constexpr double kStallFloor = 0.1;
// Shortest silence of the network that raises suspicion, seconds: above a
// delayed ACK (40 ms and more) and a tail-loss probe's round.
constexpr double kNoAckFloor = 0.12;
// Unanswered retransmission timeouts in a row that prove a path dead, and
// the shortest wait for the last one's answer, seconds. On a clean path two
// (kDeadTimeouts); on one that loses a share `loss` of its segments, more
// (deadTimeouts()): a live path loses k resends in a row with a chance of
// about loss^k, and that must stay below kFalseDeath -- under 150 Mbit/s of
// UDP and a saturating TCP flow on a 200 Mbit/s link (2.8 % of one path's
// segments resent), two in a row were lost twice in ten minutes, and the
// path was closed twice. Every resend asked for costs a blackholed path a
// backed-off timeout more (at 1e-6, the lab's blackholed paths, 0.5 % of
// their segments resent by their own congestion control, needed three, and
// the stall went from 365 to 607 ms), so kFalseDeath is 1e-4: two up to
// 1 % of segments resent, three up to 4.6 %. At most kMaxDeadTimeouts:
// with backed-off timeouts (50, 100, 200, 400 ms) a path that loses more
// is past kNoAckDead anyway.
constexpr uint32_t kDeadTimeouts = 2;
constexpr uint32_t kMaxDeadTimeouts = 4;
constexpr double kFalseDeath = 1e-4;
constexpr double kResendFloor = 0.05;
// Silence that proves a path dead whatever TCP did, seconds.
constexpr double kNoAckDead = 1.0;

// What the monitor knows of a peer: is it silent on every path?
struct PeerSilence {
  bool waited_on = false;    // an operation sends to it or receives from it, or a path holds something for it
  double asked = 0;          // seconds since the oldest probe still unanswered was sent, or since the
                             // peer was last heard from on any path if that is later (0: none out)
  int paths = 0;             // its paths that are up
  double peer_timeout = 10;  // MAESTRO_PEER_TIMEOUT (0: off)
};

// How recently the peer must have been heard for a stalled path to be
// judged, seconds: a live peer answers a probe every probe interval.
inline double heardLately(double probe_interval) { return std::max(1.0, 2 * probe_interval); }

double suspectAfter(const BusyPath& p);
double noAckLimit(const transport::PathDelivery& d);
double resendLimit(const transport::PathDelivery& d);
uint32_t deadTimeouts(const transport::PathDelivery& d);
// Whether the monitor should ask the transport about the path (step 2).
bool worthAsking(const BusyPath& p);
Verdict judgeBusyPath(const BusyPath& p);
// kDead (every path closed, its operations failed) or kFine.
Verdict judgePeer(const PeerSilence& p);

}  // namespace multipath
}  // namespace maestro
