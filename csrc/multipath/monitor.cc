// The path monitor (Maestro's monitor): every tick it looks at each peer's
// paths -- a path that holds chunks and completes none, or whose probe goes
// unanswered while the peer answers elsewhere, is closed; idle paths are
// probed for their RTT; hunting is fed its samples -- and a thread of its
// own reconnects the paths that are down, all of them in parallel.
#include "multipath/engine_core.h"

#include <algorithm>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/engine_state.h"
#include "multipath/sender.h"
#include "multipath/path_health.h"

namespace maestro {
namespace multipath {
using namespace detail;

void EngineCore::monitorLoop() {
  setLogRank(rank_);
  // While chunks are in flight the monitor looks often enough to close a
  // dead path within a few of its chunk times (path_health.h); idle, at
  // the probe's cadence.
  const double idle_tick = std::min(config_.probe_interval, config_.path_timeout / 4);
  const double busy_tick = std::min(idle_tick, kBusyTick);
  bool busy = false;
  while (!stopping_) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, std::chrono::duration<double>(busy ? busy_tick : idle_tick),
                           [&] { return stopping_.load() || !down_notices_.empty(); });
    }
    if (stopping_) break;
    busy = monitorTick();
    // The groups on these paths, on the same thread and tick.
    std::lock_guard<std::mutex> lock(channels_mu_);
    for (EngineCore* channel : channels_) busy = channel->monitorTick() || busy;
  }
}

bool EngineCore::monitorTick() {
  std::vector<std::pair<int, int>> notices;
  {
    std::lock_guard<std::mutex> lock(monitor_mu_);
    notices.swap(down_notices_);
  }
  for (const auto& n : notices) {
    try {
      sendControl(n.first, ControlType::kPathDown, 0, static_cast<uint32_t>(n.second));
    } catch (const Error&) {
      // No live path to that peer: nothing to tell it over.
    }
  }
  auto now = Clock::now();
  if (!config_.metrics.empty()) {
    if (!metrics_) metrics_ = std::make_unique<MetricsFile>(config_.metrics, config_.metrics_interval, rank_, channel_);
    if (metrics_->due(now)) metrics_->write(pathStats(), now);
  }
  bool probe = seconds(now - last_probe_) >= config_.probe_interval;
  if (probe) last_probe_ = now;
  // A gap between two looks far beyond the tick: this process was stopped
  // (SIGSTOP, swapped out). What it did not hear meanwhile was its own
  // silence, not its peers': their stalls and waits count from now.
  const bool resumed = last_look_ != Clock::time_point{} && seconds(now - last_look_) > heardLately(config_.probe_interval);
  last_look_ = now;
  bool busy = false;
  for (int peer : activePeers()) {
    try {
      busy = monitorPeer(peer, now, probe, resumed) || busy;
    } catch (const std::exception& e) {
      // The monitor must outlive any surprise: log it and go on.
      MAESTRO_WARN("path monitor, rank ", peer, ": ", e.what());
    }
  }
  return busy;
}

// What one look at a peer's paths decided: acted on once peer.mu is
// released (closes, probes and hunts take other locks or block).
struct EngineCore::Look {
  Clock::time_point now;
  std::vector<std::pair<int, std::string>> to_close;  // transport ids
  std::vector<int> to_ping, to_reconnect, to_hunt;
  struct Judged {
    int slot, id;
    BusyPath path;
  };
  std::vector<Judged> to_judge;  // stalled: asked about outside the lock
  bool hear = false;             // a path stalled while the peer has not been heard since
  bool busy_paths = false;

  void ping(PathSlot& s) {  // peer.mu held; sent once the lock is released
    s.ping_outstanding = true;
    s.ping_sent = now;
    to_ping.push_back(s.id);
  }
};

bool EngineCore::monitorPeer(int peer, Clock::time_point now, bool probe, bool resumed) {
  Peer& p = *peers_[peer];
  Look look;
  look.now = now;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (resumed) p.back_at = now;
    huntLook(p, look);
    pathsLook(p, peer, probe, look);
    silenceLook(p, peer, look);
    // A stalled path is judged only once the peer is heard elsewhere: ask
    // the other paths now, not at the next probe.
    if (look.hear)
      for (size_t i = 0; i < p.paths.size(); ++i) {
        PathSlot& s = p.paths[i];
        if (s.up && sender_->inflight(peer, static_cast<int>(i)) == 0 && !s.ping_outstanding) look.ping(s);
      }
    // Shared chunks wait only for completions and path events, which a
    // stalled path no longer brings: a chunk the tail rule left queued for a
    // path that has since stalled would wait for that path's timeout. Offer
    // it again every tick; the scheduler stops counting on a stalled path
    // after max(50 ms, 4 x its drain time).
    if (sender_->waiting(peer) && !p.unreachable) pumpAll(p);
  }
  judgeStalled(p, peer, look);
  act(peer, look);
  return look.busy_paths;
}

// Path hunting: which paths stay slow against their siblings (at the
// hunter's own cadence, kHuntTick).
void EngineCore::huntLook(Peer& p, Look& look) {
  const Clock::time_point now = look.now;
  const bool first = p.hunt_tick == Clock::time_point{};
  if (!hunter_.enabled() || p.unreachable || p.left || (!first && seconds(now - p.hunt_tick) < kHuntTick)) return;
  const double dt = first ? 0 : seconds(now - p.hunt_tick);
  p.hunt_tick = now;
  std::vector<HuntSample> samples(p.paths.size());
  std::vector<HuntState> states(p.paths.size());
  for (size_t i = 0; i < p.paths.size(); ++i) {
    PathSlot& s = p.paths[i];
    const int path = static_cast<int>(i);
    const uint64_t sent = sender_->bytesSent(p.rank, path);
    samples[i].busy = sender_->inflight(p.rank, path) > 0 || sent != s.tick_bytes;
    samples[i].usable = s.up && !s.doubted && !s.hunt.active;
    samples[i].throughput = sender_->busyRateSinceLastLook(p.rank, path, now);
    s.tick_bytes = sent;
    states[i] = s.hunt;
    // A re-opening the opener announced but never made (it failed): the
    // path carries chunks again.
    if (s.hunt.active && !s.initiated && seconds(now - s.hunt.since) > 2 * config_.connect_timeout) {
      s.hunt.active = false;
      pumpAll(p);
    }
  }
  for (int i : hunter_.tick(samples, states, dt, now)) look.to_hunt.push_back(p.paths[i].id);
  for (size_t i = 0; i < p.paths.size(); ++i) {
    const bool active = p.paths[i].hunt.active;
    p.paths[i].hunt = states[i];
    p.paths[i].hunt.active = active;
  }
}

// Each path: re-opened if down, judged if it holds work without progress,
// closed if set aside or probed without an answer for too long, probed.
void EngineCore::pathsLook(Peer& p, int peer, bool probe, Look& look) {
  const Clock::time_point now = look.now;
  for (size_t i = 0; i < p.paths.size(); ++i) {
    PathSlot& s = p.paths[i];
    if (!s.up) {
      // Re-probe a dead path in the background (its opener reconnects);
      // it is used again as soon as it answers.
      // (Not one that hunting is re-opening: its new connection is coming.)
      if (probe && s.initiated && !s.hunt.active && !p.unreachable && !p.left) look.to_reconnect.push_back(s.id);
      continue;
    }
    // A path that holds chunks or control messages without progress,
    // while the peer has been heard from (elsewhere) since and lately, is judged by
    // path_health.h: closed once the network below shows its bytes are
    // not acknowledged (asked outside this lock), or, where it cannot
    // tell, set aside and probed; and at path_timeout whatever else.
    Verdict busy;
    if (sender_->inflight(peer, static_cast<int>(i)) > 0 || s.fenced > 0 || !s.unconfirmed.empty()) {
      look.busy_paths = true;
      const BusyPath b = busyPath(p, static_cast<int>(i), now);
      busy = judgeBusyPath(b);
      if (busy.health != Health::kDead && worthAsking(b)) look.to_judge.push_back({static_cast<int>(i), s.id, b});
      else if (b.stalled > kStallFloor && !b.heard_since) look.hear = true;
    }
    if (busy.health == Health::kDead)
      look.to_close.emplace_back(s.id, busy.why);
    // (Its probe counts as unanswered only while the peer answers
    // elsewhere: a peer silent everywhere is judgePeer()'s.)
    else if (s.doubted && s.fenced == 0 && seconds(now - std::max(s.doubted_since, p.back_at)) > doubtWindow(s) &&
             p.last_heard > s.doubted_since)
      look.to_close.emplace_back(s.id, strcat("it was set aside as dead and has not answered a probe for ",
                                              doubtWindow(s), " s"));
    // An idle path has no chunks to stall, so only its probe tells: one
    // unanswered for twice path_timeout, while nothing else came through
    // it (a pong may queue behind the peer's data on a busy path) and the
    // peer was heard elsewhere since, is dead. Left up, it would keep the
    // control messages that went on it before it died unconfirmed, and
    // so never re-sent, and the scheduler would count on it.
    else if (s.ping_outstanding && seconds(now - std::max(s.ping_sent, p.back_at)) > 2 * config_.path_timeout &&
             sender_->lastProgress(peer, static_cast<int>(i)) < s.ping_sent && s.last_arrival < s.ping_sent &&
             p.last_heard > s.ping_sent)
      look.to_close.emplace_back(s.id, strcat("its probe has had no answer for ", 2 * config_.path_timeout,
                                              " s while rank ", peer, " answers on other paths"));
    if (probe && !s.ping_outstanding) look.ping(s);
  }
}

// A peer silent on every path has no path heard elsewhere to judge the
// others by: judgePeer() fails it once its probes have gone unanswered for
// peer_timeout while an operation waits on it, and every path to it is
// closed, so that the peer too learns, should it wake.
void EngineCore::silenceLook(Peer& p, int peer, Look& look) {
  PeerSilence quiet;
  quiet.waited_on = look.busy_paths || sender_->sending(peer) || !p.receiving.empty() || p.awaited > 0;
  quiet.peer_timeout = config_.peer_timeout;
  // Asked since: the oldest probe still unanswered, or the last word from
  // the peer if that came after it (a probe sent earlier may wait behind
  // the peer's data; no second one goes on a path while one is out).
  for (const PathSlot& s : p.paths) {
    if (!s.up) continue;
    quiet.paths++;
    if (s.ping_outstanding)
      quiet.asked = std::max(quiet.asked, seconds(look.now - std::max({s.ping_sent, p.last_heard, p.back_at})));
  }
  const Verdict silent = p.unreachable || p.left ? Verdict{} : judgePeer(quiet);
  if (silent.health != Health::kDead) return;
  const std::string why = strcat("rank ", peer, " ", silent.why);
  markUnreachable(p, why);
  look.to_close.clear();
  look.to_judge.clear();
  for (const PathSlot& s : p.paths)
    if (s.up) look.to_close.emplace_back(s.id, why);
}

// The stalled paths, with what the network acknowledged of their bytes.
void EngineCore::judgeStalled(Peer& p, int peer, Look& look) {
  for (Look::Judged& j : look.to_judge) {
    j.path.delivery = mesh_.transport->delivery(peer, j.id);
    Verdict v = judgeBusyPath(j.path);
    if (v.health == Health::kFine && j.path.doubted) {
      // Set aside before its chunks stalled (for control messages, or on
      // the peer's word): they move now all the same, as a suspect's do.
      BusyPath fresh = j.path;
      fresh.doubted = false;
      if (judgeBusyPath(fresh).health == Health::kSuspect) v.health = Health::kSuspect;
    }
    if (v.health == Health::kFine) continue;
    std::lock_guard<std::mutex> lock(p.mu);
    PathSlot& s = p.paths[j.slot];
    if (s.id != j.id || !s.up || busyPath(p, j.slot, look.now).stalled < j.path.stalled) continue;  // it moved on meanwhile
    if (v.health == Health::kDead) look.to_close.emplace_back(j.id, v.why);
    else if (!s.doubted) doubt(p, j.slot, strcat("path ", j.slot, " to rank ", peer, ": ", v.why));
    else if (s.fenced == 0) fence(p, j.slot);
  }
}

void EngineCore::act(int peer, const Look& look) {
  for (auto& c : look.to_close) mesh_.transport->closePath(peer, c.first, c.second);
  for (int id : look.to_ping) sendPing(peer, id);
  for (int id : look.to_hunt) {
    if (owner_) owner_->queueHunt({HuntJob::kSlow, ranks_[peer], id, {}});  // shared paths: the owner moves it
    else queueHunt({HuntJob::kSlow, peer, id, {}});
  }
  if (!look.to_reconnect.empty()) {
    std::lock_guard<std::mutex> lock(reconnect_mu_);
    for (int id : look.to_reconnect) reconnect_wanted_.insert({peer, id});
    reconnect_cv_.notify_all();
  }
}

void EngineCore::reconnectLoop() {
  // Apart from the monitor: a connect towards a blackhole takes its whole
  // deadline, and the monitor must keep its cadence meanwhile. The paths
  // wanted at one time are tried in parallel, so six dead paths cost one
  // deadline, not six, and each comes back within about one probe interval
  // of its route returning.
  setLogRank(rank_);
  while (!stopping_) {
    std::set<std::pair<int, int>> batch;
    std::deque<HuntJob> hunts;
    {
      std::unique_lock<std::mutex> lock(reconnect_mu_);
      reconnect_cv_.wait(lock, [&] {
        return stopping_.load() || !reconnect_wanted_.empty() || !hunt_jobs_.empty() || !pair_requests_.empty();
      });
      if (stopping_) break;
      batch.swap(reconnect_wanted_);
      hunts.swap(hunt_jobs_);
    }
    servePairRequests();  // groups on shared paths wait for these
    for (const auto& job : hunts) {
      if (stopping_) break;
      try {
        runHunt(job);
      } catch (const std::exception& e) {
        MAESTRO_WARN("path hunting, path ", job.id, " to rank ", job.peer, ": ", e.what());
      }
    }
    // Offers an acceptor never picked from go back.
    for (auto it = offers_.begin(); it != offers_.end();) {
      if (seconds(Clock::now() - it->second.at) > 2 * config_.connect_timeout) {
        releasePorts(it->first.first, it->first.second, it->second.ports);
        it = offers_.erase(it);
      } else {
        ++it;
      }
    }
    if (batch.empty()) continue;
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(std::min(1.0, config_.probe_interval * 2)));
    std::vector<std::thread> tries;
    for (const auto& want : batch)
      tries.push_back(startNamedThread("maestro-connect", [this, want, until] { reconnectPath(want.first, want.second, until); }));
    for (auto& t : tries) t.join();
  }
}

void EngineCore::reconnectPath(int peer, int id, Clock::time_point until) {
  setLogRank(rank_);
  {
    // Asked for while it was down; up again since (a hunt re-opened it
    // meanwhile, on this thread): a reconnect now would replace a good
    // connection, and count as a failure of it.
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    const int slot = slotOf(p, id);
    if (slot < 0 || p.paths[slot].up) return;
  }
  bool back = false;
  try {
    back = mesh_.transport->reconnect(peer, id, until);  // success also arrives as onPathUp
  } catch (const std::exception& e) {
    MAESTRO_WARN("cannot reconnect path ", id, " to rank ", peer, ": ", e.what());
  }
  if (!back || stopping_) return;
  std::string desc = mesh_.transport->describePath(peer, id);
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  int slot = slotOf(p, id);
  if (slot >= 0) p.paths[slot].description = desc;
}

BusyPath EngineCore::busyPath(const Peer& p, int slot, Clock::time_point now) const {
  const PathSlot& s = p.paths[slot];
  BusyPath b;
  b.inflight = sender_->inflight(p.rank, slot) + s.fenced;
  b.control = static_cast<int>(s.unconfirmed.size());
  // Held since: the last completion (or the post that made it busy); with
  // no chunk, its oldest control message not known to have arrived.
  const Clock::time_point since = std::max(
      p.back_at,
      b.inflight > 0 ? sender_->lastProgress(p.rank, slot) : (s.unconfirmed.empty() ? now : s.unconfirmed.front().at));
  b.stalled = seconds(now - since);
  b.chunk_bytes = static_cast<double>(config_.chunk_size);
  b.throughput = sender_->throughput(p.rank, slot);
  b.rtt = s.rtt;
  b.heard_since = p.last_heard > since && seconds(now - p.last_heard) <= p.lately;
  b.doubted = s.doubted;
  b.path_timeout = config_.path_timeout;
  return b;
}

}  // namespace multipath
}  // namespace maestro
