#include "multipath/path_health.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace maestro {
namespace multipath {

double suspectAfter(const BusyPath& p) {
  // A live path completes its oldest chunk within about one chunk's time at
  // its own rate once the ones before it are done; eight of those, two
  // round trips, or the floor, whichever is longest.
  const double gap = p.throughput > 0 ? p.chunk_bytes / p.throughput : 0;
  return std::max({kStallFloor, 8 * gap, 2 * p.rtt});
}

double noAckLimit(const transport::PathDelivery& d) { return std::max(kNoAckFloor, 4 * d.rtt); }

double resendLimit(const transport::PathDelivery& d) { return std::max(kResendFloor, 4 * d.rtt); }

uint32_t deadTimeouts(const transport::PathDelivery& d) {
  if (d.loss <= 0) return kDeadTimeouts;
  if (d.loss >= 1) return kMaxDeadTimeouts;
  const double k = std::ceil(std::log(kFalseDeath) / std::log(d.loss));
  return static_cast<uint32_t>(std::clamp(k, double{kDeadTimeouts}, double{kMaxDeadTimeouts}));
}

namespace {
std::string held(const BusyPath& p) {
  return p.inflight > 0 ? strcat(p.inflight, " chunks") : strcat(p.control, " control messages");
}
std::string silence(const BusyPath& p, double silent) {
  const transport::PathDelivery& d = p.delivery;
  return strcat("the network has acknowledged none of its bytes for ", static_cast<int>(silent * 1000), " ms (",
                d.unacked, " segments waiting, RTT ", static_cast<int>(d.rtt * 1e6) / 1000.0, " ms",
                d.loss > 0 ? strcat(", ", static_cast<int>(d.loss * 1000) / 10.0, " % of its segments resent before") : "",
                ") while it held ", held(p));
}
}  // namespace

bool worthAsking(const BusyPath& p) {
  return (p.inflight > 0 || p.control > 0) && p.heard_since && p.stalled > kStallFloor;
}

Verdict judgeBusyPath(const BusyPath& p) {
  if ((p.inflight <= 0 && p.control <= 0) || !p.heard_since) return {};
  if (p.inflight > 0 && p.stalled > p.path_timeout)
    return {Health::kDead, strcat("no progress for ", p.path_timeout, " s with ", held(p),
                                  " in flight (blackholed path?)")};
  const transport::PathDelivery& d = p.delivery;
  if (!d.known) {
    if (p.inflight == 0 || p.stalled <= suspectAfter(p) || p.doubted) return {};
    return {Health::kSuspect, strcat("it has completed none of its ", held(p), " for ",
                                     static_cast<int>(p.stalled * 1000), " ms while its peer answers elsewhere")};
  }
  // Silent for the limit while it held something: the acknowledgement it
  // last had may be older than what it holds (an idle path's).
  const double silent = std::min(p.stalled, d.since_ack);
  if (p.stalled <= kStallFloor || silent <= noAckLimit(d)) return {};
  if (d.unacked == 0) {
    // The network acknowledged every byte, yet nothing completes and nothing
    // at all comes from the peer on the path: the completions it sends back
    // are lost on the way (a blackhole that began after its kernel acknowledged
    // our bytes drops them, and the close would wait for the peer's side to
    // find its own bytes unacknowledged). Set aside, not closed -- the peer
    // may only be slow to answer: its chunks go again elsewhere now, and it
    // is closed only on more evidence (its probe unanswered, its own resends).
    // Chunks only: a control message is confirmed by later traffic on its
    // path, which an idle path has none of until its next probe.
    if (p.inflight <= 0 || p.doubted || p.stalled <= suspectAfter(p)) return {};
    return {Health::kSuspect, strcat("the network acknowledged all of its bytes, but none of its ", held(p),
                                     " has completed for ", static_cast<int>(p.stalled * 1000),
                                     " ms and nothing has come from the peer on the path for ",
                                     static_cast<int>(d.since_ack * 1000), " ms (its answers lost on the way back?)")};
  }
  // TCP's own recovery -- a tail-loss probe, then retransmission timeouts
  // -- has resent deadTimeouts() times in a row, and the last resend too has
  // had no answer for a few round trips, nor anything else since: dead. (A
  // live path on a congested link loses a whole flight, its tail-loss probe
  // and now and then a timeout's resend; several in a row, backed off, only
  // where it loses many segments anyway, and there more are required. Its
  // peer's segments -- a duplicate ACK, its own data, a probe's answer --
  // still arrive between them; on a blackholed path nothing does.) Silent
  // past kNoAckDead: dead whatever TCP did.
  const bool resends_lost =
      d.timeouts >= deadTimeouts(d) && d.since_send > resendLimit(d) && d.since_ack > d.since_send;
  if (resends_lost || silent > kNoAckDead)
    return {Health::kDead,
            silence(p, silent) +
                (resends_lost ? strcat(", ", d.timeouts, " resends unanswered (the last one ",
                                       static_cast<int>(d.since_send * 1000), " ms ago, nothing heard on the path for ",
                                       static_cast<int>(d.since_ack * 1000), " ms)")
                              : "") +
                " (blackholed path?)"};
  // Not yet proven: set aside, so that nothing new waits on it and its
  // control messages go elsewhere now.
  if (p.doubted) return {};
  return {Health::kSuspect, silence(p, silent)};
}

Verdict judgePeer(const PeerSilence& p) {
  if (!p.waited_on || p.peer_timeout <= 0 || p.asked <= p.peer_timeout) return {};
  return {Health::kDead,
          strcat("has answered nothing on any of its ", p.paths, " paths for ", static_cast<int>(p.asked * 10) / 10.0,
                 " s while an operation waits on it -- no data, no completion, no answer to a probe (is its process "
                 "stopped, by SIGSTOP or a debugger, or its host hung or cut off?); MAESTRO_PEER_TIMEOUT=",
                 p.peer_timeout, " s sets this wait, 0 leaves it to the operation's timeout")};
}

}  // namespace multipath
}  // namespace maestro
