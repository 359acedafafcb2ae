// The path monitor's verdict on a path with chunks in flight (path_health.h),
// against reference observations, without a network: a blackholed path is
// dead within a few of its chunk times, a congested or merely slow one never.
#include <gtest/gtest.h>

#include "multipath/path_health.h"

namespace maestro {
namespace multipath {
namespace {

// A path of the lab: 256 KiB chunks at 25 MB/s (about 10 ms each), 8 in
// flight, 1 ms RTT, its peer heard elsewhere.
BusyPath labPath(double stalled) {
  BusyPath p;
  p.inflight = 8;
  p.stalled = stalled;
  p.chunk_bytes = 256 << 10;
  p.throughput = 25e6;
  p.rtt = 0.001;
  p.heard_since = true;
  p.path_timeout = 2.0;
  return p;
}

// What TCP_INFO says: `unacked` segments out, the last ACK `since_ack` ago;
// `resent_ago` >= 0: `timeouts` retransmission timeouts in a row fired, the
// last resend left that long ago, unanswered.
transport::PathDelivery tcp(uint32_t unacked, double since_ack, double rtt = 0.001, double resent_ago = -1,
                            uint32_t timeouts = 2) {
  transport::PathDelivery d;
  d.known = true;
  d.unacked = unacked;
  d.since_ack = since_ack;
  d.rtt = rtt;
  d.timeouts = resent_ago >= 0 ? timeouts : 0;
  d.since_send = resent_ago >= 0 ? resent_ago : 0.001;
  return d;
}

TEST(PathHealth, SuspicionFollowsThePathsOwnChunkTimeAboveAFloor) {
  BusyPath p = labPath(0);
  EXPECT_DOUBLE_EQ(suspectAfter(p), kStallFloor);  // 8 chunk times = 84 ms < the floor
  p.throughput = 2.5e6;                               // a tenth of the rate: 8 x 105 ms
  EXPECT_NEAR(suspectAfter(p), 8 * (256 << 10) / 2.5e6, 1e-9);
  p = labPath(0);
  p.rtt = 0.2;  // a long round trip
  EXPECT_DOUBLE_EQ(suspectAfter(p), 0.4);
  p = labPath(0);
  p.throughput = 0;  // not measured yet
  p.rtt = 0;
  EXPECT_DOUBLE_EQ(suspectAfter(p), kStallFloor);
}

TEST(PathHealth, ABlackholedTcpPathIsDeadOnceTCPsOwnResendGoesUnanswered) {
  // Its bytes have had no ACK for 150 ms with 40 segments out: suspect --
  // set aside, with the evidence named.
  BusyPath p = labPath(0.16);
  p.delivery = tcp(40, 0.15);
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kSuspect);
  EXPECT_NE(v.why.find("acknowledged none of its bytes for 150 ms"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("40 segments"), std::string::npos) << v.why;
  // TCP's second retransmission timeout resent 30 ms ago: not yet; 60 ms:
  // dead, long before path_timeout.
  p.delivery = tcp(40, 0.15, 0.001, 0.03);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  p.delivery = tcp(40, 0.15, 0.001, 0.06);
  v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kDead);
  EXPECT_NE(v.why.find("2 resends unanswered"), std::string::npos) << v.why;
  // One timeout's resend lost: a congested link does that now and then.
  p.delivery = tcp(40, 0.15, 0.001, 0.06, 1);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  // Not judged: a stall below the floor, a silence below the limit.
  p.stalled = 0.09;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p = labPath(0.16);
  p.delivery = tcp(40, 0.11, 0.001, 0.06);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  // The network's word does not wait for the path's own chunk time: a slow
  // path (8 chunk times = 0.84 s) is dead as soon.
  p = labPath(0.16);
  p.throughput = 2.5e6;
  EXPECT_TRUE(worthAsking(p));
  p.delivery = tcp(40, 0.15, 0.001, 0.06);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
}

TEST(PathHealth, ACongestedPathIsNeverClosedWhileTCPsResendsGetThrough) {
  // Stalled for 1.5 s (a peer process that does not run), but its kernel
  // ACKs: only slow.
  BusyPath p = labPath(1.5);
  p.delivery = tcp(30, 0.002);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  // Everything it sent was acknowledged and the peer's segments still come
  // on the path (its own data, a window update): it has not taken ours yet.
  p.delivery = tcp(0, 0.05);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  // A whole flight and its tail-loss probe lost on a congested link, 200 ms
  // without an ACK and no timeout's resend yet: set aside, not closed.
  p = labPath(0.2);
  p.delivery = tcp(30, 0.2);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  // A deep queue (RTT 80 ms under load): four RTTs of silence are allowed,
  // and four for the resend.
  p = labPath(0.5);
  p.delivery = tcp(60, 0.3, 0.08);
  EXPECT_DOUBLE_EQ(noAckLimit(p.delivery), 0.32);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p.delivery.since_ack = 0.33;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  p.delivery = tcp(60, 0.33, 0.08, 0.3);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  p.delivery = tcp(60, 0.34, 0.08, 0.33);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
  p.stalled = 0.3;  // but not before it has held its chunks that long
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
}

// The false alarm of the background-traffic run: a path on a link with
// 150 Mbit/s of UDP and a saturating TCP flow resent 2.8 % of its segments,
// and TCP lost two timeouts' resends in a row twice in ten minutes. Where a
// path loses that much, more are required; a clean path dies after two.
TEST(PathHealth, APathThatLosesManySegmentsNeedsMoreResendsLostToBeDead) {
  transport::PathDelivery d = tcp(56, 0.26, 0.0059, 0.06);
  EXPECT_EQ(kDeadTimeouts, deadTimeouts(d));  // clean, or too few segments to tell
  d.loss = 0.005;  // the lab's blackholed paths: their own congestion control's losses
  EXPECT_EQ(2u, deadTimeouts(d));
  d.loss = 0.028;
  EXPECT_EQ(3u, deadTimeouts(d));
  d.loss = 0.05;
  EXPECT_EQ(4u, deadTimeouts(d));
  d.loss = 0.5;
  EXPECT_EQ(kMaxDeadTimeouts, deadTimeouts(d));

  BusyPath p = labPath(0.26);
  p.delivery = tcp(56, 0.26, 0.0059, 0.06);
  p.delivery.loss = 0.028;
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kSuspect) << v.why;  // two lost: set aside, not closed
  EXPECT_NE(v.why.find("2.8 % of its segments resent before"), std::string::npos) << v.why;
  p.doubted = true;  // set aside and probed
  p.delivery.timeouts = 3;  // the third resend lost too: dead
  v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kDead) << v.why;
  EXPECT_NE(v.why.find("3 resends unanswered"), std::string::npos) << v.why;
  // Silent past kNoAckDead: dead however lossy the path was.
  p.delivery.timeouts = 2;
  p.stalled = 1.1;
  p.delivery.since_ack = 1.05;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
}

// The false alarm of a ten-minute background-traffic run: on a path that
// resent 2.7 % of its segments, TCP counted three timeouts in a row, yet its
// peer's segments kept arriving (the acknowledgement point stayed put: a
// full queue dropped the resends, not the route). Something heard on the
// path after its last resend is a live route: set aside, never closed.
TEST(PathHealth, APathWhosePeerAnsweredAfterItsLastResendIsNotDead) {
  BusyPath p = labPath(0.14);
  p.doubted = true;
  p.delivery = tcp(56, 0.132, 0.0059, 0.06, 3);
  p.delivery.loss = 0.027;
  p.delivery.since_ack = 0.03;  // a duplicate ACK or the peer's own data, 30 ms ago
  p.stalled = 0.132;
  // Silent 30 ms: below the limit, not even suspect.
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  // The peer's last segment arrived 10 ms after the last resend left.
  p.delivery.since_send = 0.14;
  p.delivery.since_ack = 0.13;
  p.stalled = 0.2;
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kFine) << v.why;  // already set aside: nothing more to do
  p.doubted = false;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  // Nothing at all since the resend left: dead, with each silence named.
  p.delivery.since_ack = 0.15;
  v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kDead) << v.why;
  EXPECT_NE(v.why.find("3 resends unanswered (the last one 140 ms ago, nothing heard on the path for 150 ms)"),
            std::string::npos)
      << v.why;
  // Silent past kNoAckDead: dead whatever came between the resends.
  p.stalled = 1.2;
  p.delivery.since_ack = 1.1;
  p.delivery.since_send = 1.15;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
}

TEST(PathHealth, AnAcknowledgementOlderThanWhatThePathHoldsIsNotSilence) {
  // An idle path's last ACK is seconds old; a chunk posted 50 ms ago has
  // not been acknowledged yet: not judged. Held 130 ms without an ACK: suspect.
  BusyPath p = labPath(0.05);
  p.delivery = tcp(40, 10.0);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p.stalled = 0.13;
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kSuspect);
  EXPECT_NE(v.why.find("for 130 ms"), std::string::npos) << v.why;
}

TEST(PathHealth, ALoneSegmentUnacknowledgedIsSetAsideFirstAndDeadLater) {
  // No chunk, a READY not known to have arrived, its segment unacknowledged
  // for 200 ms: its ACK delayed, lost on a congested link, or a blackhole.
  // Set aside: what waits on it moves now.
  BusyPath p = labPath(0.2);
  p.inflight = 0;
  p.control = 1;
  EXPECT_TRUE(worthAsking(p));
  p.delivery = tcp(1, 0.2);
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kSuspect);
  EXPECT_NE(v.why.find("1 control messages"), std::string::npos) << v.why;
  p.doubted = true;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  // Its resend unanswered, or silent past kNoAckDead: dead.
  p.delivery = tcp(1, 0.2, 0.001, 0.06);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
  p.stalled = 1.1;
  p.delivery = tcp(1, 1.01);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
  // Acknowledged (the pong that confirms it has not come yet): fine.
  p.delivery = tcp(0, 1.01);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  // Neither the backstop nor a probe for control messages alone where the
  // transport cannot tell: the idle path's probe rule covers those.
  p = labPath(5);
  p.inflight = 0;
  p.control = 3;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
}

TEST(PathHealth, APeerSilentEverywhereIsLeftToTheOperationsTimeout) {
  BusyPath p = labPath(5.0);
  p.heard_since = false;
  p.delivery = tcp(40, 5.0);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  EXPECT_FALSE(worthAsking(p));
  p.inflight = 0;  // and an idle path is not judged here at all
  p.heard_since = true;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
}

TEST(PathHealth, WithoutAcknowledgementsASuspectIsProbedOnceAndTheBackstopStays) {
  BusyPath p = labPath(0.2);  // verbs: the transport cannot tell
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  p.throughput = 2.5e6;  // a slow path is suspect only after 8 of its chunk times
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p.stalled = 0.85;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  p = labPath(0.2);
  p.doubted = true;  // already set aside and probed: the doubt window decides
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p.stalled = 2.01;  // path_timeout, whatever else is known
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kDead);
  EXPECT_NE(v.why.find("no progress for 2 s with 8 chunks"), std::string::npos) << v.why;
  p.delivery = tcp(30, 0.001);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kDead);
}

TEST(PathHealth, APeerSilentOnEveryPathFailsOnlyWhileWaitedOnAndPastItsTimeout) {
  PeerSilence q;
  q.paths = 4;
  q.peer_timeout = 10;
  q.asked = 10.5;  // probes unanswered past the timeout...
  EXPECT_EQ(judgePeer(q).health, Health::kFine);  // ...but nothing waits on it: an idle group is left alone
  q.waited_on = true;
  Verdict v = judgePeer(q);
  EXPECT_EQ(v.health, Health::kDead);
  EXPECT_NE(v.why.find("answered nothing on any of its 4 paths for 10.5 s"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("MAESTRO_PEER_TIMEOUT=10"), std::string::npos) << v.why;
  q.asked = 9.9;  // not yet
  EXPECT_EQ(judgePeer(q).health, Health::kFine);
  q.asked = 0;  // every probe answered (or none sent since it was last heard)
  EXPECT_EQ(judgePeer(q).health, Health::kFine);
  q.asked = 1e6;
  q.peer_timeout = 0;  // off: the operation's timeout decides
  EXPECT_EQ(judgePeer(q).health, Health::kFine);
}

// A blackhole that began after the peer's kernel acknowledged our bytes but
// before the peer sent their completions: nothing is unacknowledged on our
// side, nothing completes, and nothing comes on the path. Set aside (its
// chunks go again elsewhere) once the silence passes the no-ACK limit and
// the stall suspectAfter(); never closed on this alone. Before that, while
// the peer's segments still arrive on the path, once set aside, or for
// control messages alone (later traffic confirms them, not a completion):
// fine.
TEST(PathHealth, CompletionsLostAfterTheBytesWereAcknowledgedSetThePathAside) {
  BusyPath p = labPath(0.13);
  p.inflight = 2;
  p.delivery = tcp(0, 0.13, 0.005);
  Verdict v = judgeBusyPath(p);
  EXPECT_EQ(v.health, Health::kSuspect) << v.why;
  EXPECT_NE(v.why.find("acknowledged all of its bytes, but none of its 2 chunks has completed for 130 ms"),
            std::string::npos)
      << v.why;
  EXPECT_NE(v.why.find("nothing has come from the peer on the path for 130 ms"), std::string::npos) << v.why;
  p.delivery.since_ack = 1.5;  // no timeouts of ours to count: never dead on this alone
  p.stalled = 1.5;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kSuspect);
  p.doubted = true;
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p = labPath(0.11);  // within the no-ACK limit (120 ms)
  p.delivery = tcp(0, 0.11, 0.005);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p = labPath(0.3);  // the peer's segments arrive on the path
  p.delivery = tcp(0, 0.02, 0.005);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p = labPath(0.3);  // control messages only: confirmed by later traffic, not completed
  p.inflight = 0;
  p.control = 2;
  p.delivery = tcp(0, 0.3, 0.005);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
  p = labPath(0.3);  // stalled, but not past suspectAfter(): 8 chunk times at its rate
  p.throughput = 2.5e6;
  p.delivery = tcp(0, 0.3, 0.005);
  EXPECT_DOUBLE_EQ(suspectAfter(p), 8 * (256 << 10) / 2.5e6);
  EXPECT_EQ(judgeBusyPath(p).health, Health::kFine);
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
