// Path hunting, the engine's side: a path that stays much slower than its
// siblings (multipath/hunter.h decides which) is re-opened from a source
// port whose route avoids the other paths' core hops, learnt with
// TTL-limited probes on the candidate ports' own 5-tuples; the opener picks,
// the acceptor offers ports, what waits on the old connection moves to the
// siblings and the new one replaces it.
#include "multipath/engine_core.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/engine_state.h"

namespace maestro {
namespace multipath {
using namespace detail;

void EngineCore::queueHunt(HuntJob job) {
  std::lock_guard<std::mutex> lock(reconnect_mu_);
  if (hunt_jobs_.size() >= 4 * static_cast<size_t>(size_) * mesh_.paths) return;  // a peer flooding asks
  hunt_jobs_.push_back(std::move(job));
  reconnect_cv_.notify_all();
}

std::vector<std::string> EngineCore::otherRoutes(int peer, int id, bool own_too) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<std::string> hops;
  std::string own;
  for (const auto& s : p.paths) {
    if (s.id == id) own = s.route;
    else if (!s.route.empty()) hops.push_back(s.route);
  }
  if (own_too && !own.empty()) hops.push_back(own);  // the hot one
  return hops;
}

transport::RouteControl& EngineCore::routes() {
  transport::RouteControl* routes = mesh_.transport->routeControl();
  MAESTRO_CHECK(routes != nullptr, "path hunting: the transport cannot choose a path's route");
  return *routes;
}

std::vector<uint16_t> EngineCore::reservePorts(int peer, int id) {
  std::vector<uint16_t> ports;
  const std::string& addr = mesh_.vnics.addresses[id % mesh_.vnics.addresses.size()];
  for (int c = 0; c < config_.candidates; ++c) ports.push_back(routes().reservePort(addr));
  return ports;
}

void EngineCore::releasePorts(int peer, int id, const std::vector<uint16_t>& ports, const std::vector<uint16_t>& keep) {
  const std::string& addr = mesh_.vnics.addresses[id % mesh_.vnics.addresses.size()];
  for (uint16_t port : ports)
    if (std::find(keep.begin(), keep.end(), port) == keep.end()) routes().releasePort(addr, port);
}

std::vector<std::string> EngineCore::probeCandidates(int peer, int id, const std::vector<uint16_t>& ports, bool opener) {
  std::vector<transport::RouteProbe> probes;
  const std::vector<std::string>& listeners = mesh_.endpoints[opener ? peer : rank_];
  const std::string& listener = listeners[id % listeners.size()];
  const std::string& opener_addr =
      opener ? mesh_.vnics.addresses[id % mesh_.vnics.addresses.size()]
             : mesh_.peer_vnics[peer][id % mesh_.peer_vnics[peer].size()];
  for (uint16_t port : ports) {
    const std::string from = strcat(opener_addr, ":", port);
    probes.push_back(opener ? transport::RouteProbe{from, listener} : transport::RouteProbe{listener, from});
  }
  std::string why;
  auto hops = routes().probeRoutes(probes, config_.probe_ttl, Clock::now() + std::chrono::milliseconds(1500), &why);
  if (!why.empty()) MAESTRO_INFO("path hunting, path ", id, " to rank ", peer, ": ", why);
  return hops;
}

bool EngineCore::movedLately(int peer, int id) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  const int slot = slotOf(p, id);
  if (slot < 0) return false;
  const HuntState& h = p.paths[slot].hunt;
  return h.active || (h.hunts > 0 && seconds(Clock::now() - h.reopened) < config_.hunt_interval);
}

void EngineCore::runHunt(const HuntJob& job) {
  const int peer = job.peer, id = job.id;
  const bool predict = config_.discovery == "ttl";
  // A path moves only from a source port of its opener's choosing (a blind
  // re-hash too): where the transport cannot choose one, it stays.
  if (!mesh_.transport->routeControl()) {
    MAESTRO_INFO("path hunting: path ", id, " to rank ", peer, " stays on its route: the transport cannot choose one");
    return;
  }
  // Each hunter keeps its own pace (hunter.h), and the two ends of a path,
  // and every group on shared paths, each have one: a path that is slow both
  // ways is judged on both sides at once. The first verdict moves it; the
  // others, within hunt_interval, would move the new connection before
  // anyone has measured it.
  if ((job.kind == HuntJob::kSlow || job.kind == HuntJob::kAsked) && movedLately(peer, id)) {
    MAESTRO_INFO("path hunting: path ", id, " to rank ", peer, " was re-opened less than ", config_.hunt_interval,
                 " s ago; it stays");
    return;
  }
  switch (job.kind) {
    case HuntJob::kSlow: {
      bool opener;
      {
        Peer& p = *peers_[peer];
        std::lock_guard<std::mutex> lock(p.mu);
        int slot = slotOf(p, id);
        if (slot < 0 || !p.paths[slot].up || p.unreachable) return;
        opener = p.paths[slot].initiated;
      }
      MAESTRO_INFO("path hunting: path ", id, " to rank ", peer, " stays slower than its siblings",
                   opener ? "" : strcat(" (towards rank ", peer, ", which opened it)"));
      if (!opener) {
        // Only the opener can move the connection; only we can probe our
        // direction of it: ask for candidate ports.
        sendControl(peer, ControlType::kHuntAsk, 0, static_cast<uint32_t>(id));
        return;
      }
      if (!predict) {
        reopenPath(peer, id, 0, "");  // a blind re-hash
        return;
      }
      std::vector<uint16_t> ports = reservePorts(peer, id);
      std::vector<std::string> hops = probeCandidates(peer, id, ports, true);
      int pick = pickRoute(hops, otherRoutes(peer, id));
      releasePorts(peer, id, ports, pick >= 0 ? std::vector<uint16_t>{ports[pick]} : std::vector<uint16_t>{});
      if (pick < 0) {
        MAESTRO_INFO("path hunting: none of ", ports.size(), " candidate ports of path ", id, " to rank ", peer,
                     " avoids the other paths' core hops; it stays");
        return;
      }
      reopenPath(peer, id, ports[pick], hops[pick]);
      return;
    }
    case HuntJob::kAsked: {
      if (!predict) {
        reopenPath(peer, id, 0, "");
        return;
      }
      auto key = std::make_pair(peer, id);
      if (offers_.count(key)) return;  // one offer at a time
      std::vector<uint16_t> ports = reservePorts(peer, id);
      if (ports.empty()) return;
      // Offer the ports whose route in our direction avoids the other
      // paths' hops (all of them if none does): the acceptor then picks
      // among those for its direction, so one re-opening serves both.
      std::vector<std::string> hops = probeCandidates(peer, id, ports, true);
      // (Our direction of this path is not the slow one: its hop may stay.)
      std::vector<std::string> avoid = otherRoutes(peer, id, false);
      std::vector<uint16_t> good;
      std::map<uint16_t, std::string> route;
      for (size_t i = 0; i < ports.size(); ++i) {
        route[ports[i]] = hops[i];
        if (pickRoute({hops[i]}, avoid) == 0) good.push_back(ports[i]);
      }
      if (good.empty()) good = ports;
      releasePorts(peer, id, ports, good);
      offers_[key] = {good, route, Clock::now()};
      sendControl(peer, ControlType::kHuntOffer, 0, static_cast<uint32_t>(id), good.data(), 2 * good.size());
      return;
    }
    case HuntJob::kOffered: {
      std::vector<std::string> hops = probeCandidates(peer, id, job.ports, false);
      int pick = pickRoute(hops, otherRoutes(peer, id));
      uint16_t port = pick >= 0 ? job.ports[pick] : 0;
      if (pick < 0) {
        MAESTRO_INFO("path hunting: none of ", job.ports.size(), " candidate ports of path ", id, " from rank ",
                     peer, " avoids the other paths' core hops; it stays");
      } else {
        Peer& p = *peers_[peer];
        std::lock_guard<std::mutex> lock(p.mu);
        int slot = slotOf(p, id);
        if (slot >= 0) p.paths[slot].hunt.next_route = hops[pick];
      }
      sendControl(peer, ControlType::kHuntPick, 0, static_cast<uint32_t>(id), &port, sizeof port);
      return;
    }
    case HuntJob::kPicked: {
      auto it = offers_.find({peer, id});
      if (it == offers_.end()) return;
      Offer offer = std::move(it->second);
      offers_.erase(it);
      const uint16_t port = job.ports.empty() ? 0 : job.ports[0];
      const bool ours = port != 0 && std::find(offer.ports.begin(), offer.ports.end(), port) != offer.ports.end();
      releasePorts(peer, id, offer.ports, ours ? std::vector<uint16_t>{port} : std::vector<uint16_t>{});
      if (!ours) return;  // nothing better (or not a port we offered)
      reopenPath(peer, id, port, offer.route[port]);
      return;
    }
  }
}

void EngineCore::reopenPath(int peer, int id, uint16_t port, const std::string& route) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, id);
    if (slot_index < 0 || !p.paths[slot_index].up || p.unreachable) return;
    PathSlot& slot = p.paths[slot_index];
    // Tell the acceptor on the path itself: ordered behind what the old
    // connection still carries, so it arrives before the new connection
    // does (a notice that came late would set the new one aside).
    ControlHeader h{};
    h.type = static_cast<uint8_t>(ControlType::kHunt);
    h.sub = static_cast<uint32_t>(id);
    try {
      mesh_.transport->postSend(peer, id, &h, sizeof h);
    } catch (const Error&) {
      return;  // the path just failed: the reconnect logic has it
    }
    // Drain: no new chunks; what is queued moves to the siblings now.
    slot.hunt.active = true;
    slot.hunt.since = Clock::now();
    slot.hunt.next_route = route;
    requeue(p, slot_index);
  }
  notify();
  mux_->pathMoving(peer, id, true, route);  // the groups on shared paths drain it too
  // What is in flight completes on the old route -- this group's and that
  // of every group on the shared paths: the notice above is queued behind
  // all of it, and a connection swapped before the notice arrives is a
  // failure to the acceptor (bounded: a write stuck there comes back
  // flushed when the connection is replaced, and moves).
  const auto drain_until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < drain_until && !stopping_) {
    bool ours_done;
    {
      std::lock_guard<std::mutex> lock(p.mu);
      int slot_index = slotOf(p, id);
      if (slot_index < 0 || !p.paths[slot_index].up) break;
      ours_done = inflight(p, slot_index) == 0;
    }
    if (ours_done && mux_->inflight(peer, id) == 0) break;  // (without our lock: the groups take theirs)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::min(2.0, config_.connect_timeout)));
  bool moved = false;
  try {
    moved = routes().reopen(peer, id, port, until);  // onPathError (old), then onPathUp (new)
  } catch (const std::exception& e) {
    MAESTRO_WARN("path hunting: cannot re-open path ", id, " to rank ", peer, ": ", e.what());
  }
  std::string desc = moved ? mesh_.transport->describePath(peer, id) : std::string();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, id);
    if (slot_index < 0) return;
    PathSlot& slot = p.paths[slot_index];
    if (moved) {
      slot.description = desc;
    } else if (slot.hunt.active) {
      // The old connection goes on (the acceptor's notice expires by itself).
      slot.hunt.active = false;
      MAESTRO_INFO("path hunting: path ", id, " to rank ", peer, " could not be re-opened; it stays on its route");
      pumpAll(p);
    }
  }
  if (!moved) mux_->pathMoving(peer, id, false, "");
}

// ---------------------------------------------------------------- hunting messages

void EngineCore::registerHuntingControl() {
  registerControl(ControlType::kHunt, &EngineCore::onHuntNotice);
  registerControl(ControlType::kHuntAsk, &EngineCore::onHuntMessage);
  registerControl(ControlType::kHuntOffer, &EngineCore::onHuntMessage);
  registerControl(ControlType::kHuntPick, &EngineCore::onHuntMessage);
}

// The opener re-opens this path on another route: what waits on it moves
// now, and its old connection's close is no failure. Only the paths' owners
// hunt (a group on shared paths hears of it through onPathMoving): on a
// channel this is out of place.
bool EngineCore::onHuntNotice(Peer& p, const ControlIn& m) {
  if (owner_) return false;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, static_cast<int>(m.sub));
    if (slot_index < 0 || p.paths[slot_index].initiated || !p.paths[slot_index].up) return false;
    PathSlot& slot = p.paths[slot_index];
    slot.hunt.active = true;
    slot.hunt.since = Clock::now();
    requeue(p, slot_index);
  }
  mux_->pathMoving(m.peer, static_cast<int>(m.sub), true, "");  // the groups on it drain it too
  return true;
}

// An ask, an offer or a pick: validated here, acted on by the reconnect
// thread (probes block). Anything out of place is ignored: hunting is an
// optimisation, run by the paths' owner (never on a channel of shared paths).
bool EngineCore::onHuntMessage(Peer& p, const ControlIn& m) {
  if (owner_) return false;
  HuntJob job{m.type == ControlType::kHuntAsk     ? HuntJob::kAsked
              : m.type == ControlType::kHuntOffer ? HuntJob::kOffered
                                                  : HuntJob::kPicked,
              m.peer, static_cast<int>(m.sub), {}};
  if (m.length % 2 != 0 || m.length > 2 * 64 || (m.type == ControlType::kHuntPick && m.length != 2)) return false;
  for (size_t i = 0; i < m.length; i += 2) {
    uint16_t port;
    std::memcpy(&port, m.body + i, 2);
    job.ports.push_back(port);
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, job.id);
    // Asks and picks go to the opener, offers to the acceptor.
    if (!hunter_.enabled() || slot_index < 0 || p.paths[slot_index].initiated != (m.type != ControlType::kHuntOffer))
      return false;
  }
  queueHunt(std::move(job));
  return false;
}

}  // namespace multipath
}  // namespace maestro
