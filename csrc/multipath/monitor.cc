// The path monitor (Maestro's monitor): every tick it looks at each peer's
// paths -- a path that holds chunks and completes none, or whose probe goes
// unanswered while the peer answers elsewhere, is closed; idle paths are
// probed for their RTT; hunting is fed its samples -- and a thread of its
// own reconnects the paths that are down, all of them in parallel.
#include "multipath/engine.h"

#include <algorithm>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/engine_state.h"

namespace maestro {
namespace multipath {
using namespace detail;

void Engine::monitorLoop() {
  setLogRank(rank_);
  const auto tick = std::chrono::duration<double>(std::min(config_.probe_interval, config_.path_timeout / 4));
  while (!stopping_) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, tick, [&] { return stopping_.load() || !down_notices_.empty(); });
    }
    if (stopping_) break;
    monitorTick();
    // The groups on these paths, on the same thread and tick.
    std::lock_guard<std::mutex> lock(channels_mu_);
    for (Engine* channel : channels_) channel->monitorTick();
  }
}

void Engine::monitorTick() {
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
  for (int peer : activePeers()) {
    try {
      monitorPeer(peer, now, probe);
    } catch (const std::exception& e) {
      // The monitor must outlive any surprise: log it and go on.
      MAESTRO_WARN("path monitor, rank ", peer, ": ", e.what());
    }
  }
}

void Engine::monitorPeer(int peer, Clock::time_point now, bool probe) {
  Peer& p = *peers_[peer];
  std::vector<std::pair<int, std::string>> to_close;  // transport ids
  std::vector<int> to_ping, to_reconnect, to_hunt;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    const double dt = p.last_tick == Clock::time_point{} ? 0 : seconds(now - p.last_tick);
    p.last_tick = now;
    // Path hunting: which paths stay slow against their siblings.
    if (hunter_.enabled() && !p.unreachable && !p.left) {
      std::vector<HuntSample> samples(p.paths.size());
      std::vector<HuntState> states(p.paths.size());
      for (size_t i = 0; i < p.paths.size(); ++i) {
        PathSlot& s = p.paths[i];
        samples[i].busy = s.inflight > 0 || s.bytes_sent != s.tick_bytes;
        samples[i].usable = s.up && !s.doubted && !s.hunt.active;
        samples[i].throughput = s.throughput;
        s.tick_bytes = s.bytes_sent;
        states[i] = s.hunt;
        // A re-opening the opener announced but never made (it failed):
        // the path carries chunks again.
        if (s.hunt.active && !s.initiated && seconds(now - s.hunt.since) > 2 * config_.connect_timeout) {
          s.hunt.active = false;
          pumpAll(p);
        }
      }
      for (int i : hunter_.tick(samples, states, dt, now)) to_hunt.push_back(p.paths[i].id);
      for (size_t i = 0; i < p.paths.size(); ++i) {
        const bool active = p.paths[i].hunt.active;
        p.paths[i].hunt = states[i];
        p.paths[i].hunt.active = active;
      }
    }
    for (size_t i = 0; i < p.paths.size(); ++i) {
      PathSlot& s = p.paths[i];
      if (!s.up) {
        // Re-probe a dead path in the background (its opener reconnects);
        // it is used again as soon as it answers.
        if (probe && s.initiated && !p.unreachable && !p.left) to_reconnect.push_back(s.id);
        continue;
      }
      // A path that holds chunks and completes none for path_timeout,
      // while the peer has been heard from (elsewhere) since it stalled, is
      // blackholed: close it, its chunks move. (A peer silent on every path
      // is slow or gone; the operation's timeout covers that.)
      if (s.inflight > 0 && seconds(now - s.last_progress) > config_.path_timeout && p.last_heard > s.last_progress)
        to_close.emplace_back(s.id, strcat("no progress for ", config_.path_timeout, " s with ", s.inflight,
                                           " chunks in flight (blackholed path?)"));
      else if (s.doubted && seconds(now - s.doubted_since) > doubtWindow(s))
        to_close.emplace_back(s.id, strcat("rank ", peer, " found it dead, and it has not answered a probe for ",
                                           doubtWindow(s), " s"));
      // An idle path has no chunks to stall, so only its probe tells: one
      // unanswered for twice path_timeout, while nothing else came through
      // it (a pong may queue behind the peer's data on a busy path) and the
      // peer was heard elsewhere since, is dead. Left up, it would keep the
      // control messages that went on it before it died unconfirmed, and
      // so never re-sent, and the scheduler would count on it.
      else if (s.ping_outstanding && seconds(now - s.ping_sent) > 2 * config_.path_timeout &&
               s.last_progress < s.ping_sent && s.last_arrival < s.ping_sent && p.last_heard > s.ping_sent)
        to_close.emplace_back(s.id, strcat("its probe has had no answer for ", 2 * config_.path_timeout,
                                           " s while rank ", peer, " answers on other paths"));
      if (probe && !s.ping_outstanding) {
        s.ping_outstanding = true;
        s.ping_sent = now;
        to_ping.push_back(s.id);
      }
    }
    // Shared chunks wait only for completions and path events, which a
    // stalled path no longer brings: a chunk the tail rule left queued for a
    // path that has since stalled would wait for that path's timeout. Offer
    // it again every tick; the scheduler stops counting on a stalled path
    // after max(50 ms, 4 x its drain time).
    if (!p.shared.empty() && !p.unreachable) pumpAll(p);
  }
  for (auto& c : to_close) mesh_.transport->closePath(peer, c.first, c.second);
  for (int id : to_ping) sendPing(peer, id);
  for (int id : to_hunt) {
    if (owner_) owner_->queueHunt({HuntJob::kSlow, ranks_[peer], id, {}});  // shared paths: the owner moves it
    else queueHunt({HuntJob::kSlow, peer, id, {}});
  }
  if (!to_reconnect.empty()) {
    std::lock_guard<std::mutex> lock(reconnect_mu_);
    for (int id : to_reconnect) reconnect_wanted_.insert({peer, id});
    reconnect_cv_.notify_all();
  }
}

void Engine::reconnectLoop() {
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

void Engine::reconnectPath(int peer, int id, Clock::time_point until) {
  setLogRank(rank_);
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

}  // namespace multipath
}  // namespace maestro
