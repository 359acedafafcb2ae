// Shared paths, the engine's side (the routing itself is channel_mux.h): a
// subgroup's engine agrees with its ranks to send on its parent group's
// paths, on a channel free on all of them, taking the parent's path knobs
// where it sets none; its pairs are connected by the engine that owns the
// paths, which tells the channels when each is up.
#include "multipath/engine_core.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/engine_state.h"

namespace maestro {
namespace multipath {
using namespace detail;

namespace {

// Why a group configured `mine` cannot send on paths opened with `theirs`
// ("" if it can). The knobs that shape the paths must be the same where the
// group sets them (options or environment); those it leaves at their
// defaults it takes from the paths' group.
std::string adoptPathKnobs(const Config& theirs, const Mesh& their_mesh, Config* mine) {
  if (!mine->share_paths) return "MAESTRO_SHARE_PATHS=0";
  static const std::set<std::string> kPathKnobs(Engine::pathKnobs().begin(), Engine::pathKnobs().end());
  std::string differ;
  for (const Knob& k : knobs()) {
    if (!kPathKnobs.count(k.name)) continue;
    const std::string name = k.name;
    auto source = mine->provenance.find(name);
    const bool set = source != mine->provenance.end() && source->second.second != "default";
    std::string there = k.show(theirs);
    if (name == "transport") there = their_mesh.transport_kind;  // auto, decided
    const std::string here = k.show(*mine);
    const bool decided_here = (name == "transport" || name == "discovery") && here == "auto";
    if (set && here != there && !decided_here) {
      differ += strcat(differ.empty() ? "" : ", ", name, " (", here, " here, ", there, " there)");
    } else if (!set && name != "transport") {
      k.apply(*mine, there);
    }
  }
  return differ.empty() ? std::string() : "its path knobs differ from its parent group's: " + differ;
}

}  // namespace

const std::vector<std::string>& Engine::pathKnobs() {
  // Hunting too: the paths' owner re-opens a path that a group finds slow.
  static const std::vector<std::string> kNames = {
      "transport", "vnics",      "ifname",   "paths",     "window",     "busy_poll",  "tcp_congestion",
      "tcp_single_copy", "discovery", "probe_ttl", "candidates", "connect_timeout", "hunt", "hunt_ratio",
      "hunt_after", "hunt_interval"};
  return kNames;
}

bool EngineCore::shareWith(Parent parent, Deadline setup_deadline) {
  // The default group itself (every rank of it has no parent).
  if (parent.ranks.empty() || !config_.share_paths) return false;
  // The engine that owns the paths, and each rank's rank there.
  // (Held as the owner's Engine, as the caller holds it: the owning group's
  // Engine stays alive, so a later subgroup of the same process finds it,
  // for as long as a group on its paths does.)
  std::shared_ptr<Engine> owner_engine = parent.engine;
  std::vector<int> ranks = parent.ranks;
  if (owner_engine && owner_engine->core_->owner_) {
    const EngineCore& group = *owner_engine->core_;
    for (int& r : ranks) r = (r >= 0 && r < group.size_) ? group.ranks_[r] : -1;
    owner_engine = group.owner_engine_;
  }
  const std::shared_ptr<EngineCore> root = owner_engine ? owner_engine->core_ : nullptr;
  std::string why;
  uint32_t free = 0;
  Config adopted = config_;  // taken only if every rank shares
  if (!root) {
    why = "no default group in this process";
  } else if (static_cast<int>(ranks.size()) != size_ || ranks[rank_] != root->rank_ ||
             std::set<int>(ranks.begin(), ranks.end()).size() != ranks.size() ||
             *std::min_element(ranks.begin(), ranks.end()) < 0 ||
             *std::max_element(ranks.begin(), ranks.end()) >= root->size_) {
    why = "the group's ranks are not its parent group's";
  } else {
    why = adoptPathKnobs(root->config_, root->mesh_, &adopted);
    if (why.empty()) free = root->mux_->freeChannels();
    if (why.empty() && free == 0) why = strcat("all ", kMaxChannels - 1, " channels are taken by other groups");
  }
  // Every rank must share, on one channel free on all of them.
  uint32_t common = ~0u;
  std::string first_why;
  for (const std::string& answer : qp_->allGather("share", strcat(free, " ", why))) {
    std::istringstream in(answer);
    uint32_t mask = 0;
    in >> mask;
    common &= mask;
    std::string reason;
    std::getline(in, reason);
    if (first_why.empty() && !mask && reason.size() > 1) first_why = reason.substr(1);
  }
  if (common == 0) {
    MAESTRO_INFO("this group opens paths of its own: ", first_why.empty() ? "no channel is free on every rank" : first_why);
    return false;
  }
  uint32_t channel = 1;
  while (!(common & (1u << channel))) ++channel;
  config_ = adopted;
  owner_ = root;
  owner_engine_ = owner_engine;
  mux_ = root->mux_;
  channel_ = channel;
  ranks_ = ranks;
  mesh_.transport = mux_->channelTransport(channel_, ranks_);
  mesh_.options = root->mesh_.options;
  mesh_.transport_kind = root->mesh_.transport_kind;
  mesh_.transport_why = root->mesh_.transport_why;
  mesh_.congestion_why = root->mesh_.congestion_why;
  mesh_.vnics = root->mesh_.vnics;
  mesh_.paths = root->mesh_.paths;
  mesh_.paths_why = root->mesh_.paths_why;
  for (int r : ranks_) mesh_.hosts.push_back(r < static_cast<int>(root->mesh_.hosts.size()) ? root->mesh_.hosts[r] : "");
  mesh_.discovery = root->mesh_.discovery;
  mesh_.discovery_why = root->mesh_.discovery_why;
  settle();
  MAESTRO_CHECK(mux_->attach(channel_, this, ranks_), "channel ", channel_,
                " of the shared paths was taken while this group was set up (groups made concurrently?)");
  try {
    joinChannel(setup_deadline);
  } catch (...) {
    stopping_ = true;
    mux_->detach(channel_);  // no completion may reach an engine that was never made
    throw;
  }
  return true;
}

void EngineCore::joinChannel(Deadline setup_deadline) {
  // Nobody sends on the channel before every rank listens on it.
  qp_->allGather("share.attached", "1");
  for (const RankPair& pair : QpManager::startUpPairs(size_, config_.connect == "eager")) {
    if (pair.first == rank_) connect(pair.second);
    if (pair.second == rank_) connect(pair.first);
  }
  // Its start-up pairs are up when the group is, as on paths of its own.
  auto settled = [&] {
    for (int peer : activePeers()) {
      Peer& p = *peers_[peer];
      std::lock_guard<std::mutex> lock(p.mu);
      if (p.link != Peer::Link::kUp && !p.unreachable) return false;
    }
    return true;
  };
  // Otherwise left to finish in the background, as a pair connected on first use.
  if (!waitUntil(settled, setup_deadline))
    MAESTRO_WARN("some start-up pairs of this group are not connected by its deadline");
}

bool EngineCore::pairPaths(int peer, PeerPaths* out) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.link != Peer::Link::kUp) return false;
  *out = PeerPaths();
  for (const PathSlot& slot : p.paths) {
    out->ids.push_back(slot.id);
    out->up.push_back(slot.up);
    out->routes.push_back(slot.route);
  }
  out->initiator = false;  // a channel never re-opens a path
  return true;
}

void EngineCore::requestPair(int peer) {
  std::lock_guard<std::mutex> lock(reconnect_mu_);
  pair_requests_.insert(peer);
  reconnect_cv_.notify_all();
}

void EngineCore::servePairRequests() {
  std::set<int> asked;
  {
    std::lock_guard<std::mutex> lock(reconnect_mu_);
    asked.swap(pair_requests_);
  }
  for (int peer : asked) {
    connect(peer);
    Peer& p = *peers_[peer];
    bool up, failed;
    std::string error;
    {
      std::lock_guard<std::mutex> lock(p.mu);
      up = p.link == Peer::Link::kUp;
      failed = p.unreachable;
      error = p.error;
    }
    // Otherwise install() or the connecting thread tells the channels.
    if (up) mux_->pairUp(peer);
    else if (failed) mux_->pairFailed(peer, error);
  }
}

void EngineCore::onPairUp(int peer) {
  PeerPaths paths;
  if (!owner_ || !owner_->pairPaths(ranks_[peer], &paths)) return;
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.link != Peer::Link::kConnecting || p.unreachable) return;  // not asked for, or installed
    installLocked(p, paths);
  }
  notify();
  // A path that failed or came back while this group joined it: its event
  // found no path here to change.
  PeerPaths now;
  if (!owner_->pairPaths(ranks_[peer], &now)) return;
  for (size_t i = 0; i < now.ids.size() && i < paths.ids.size(); ++i) {
    if (now.up[i] == paths.up[i]) continue;
    if (now.up[i]) onPathUp(peer, now.ids[i]);
    else onPathError(peer, now.ids[i], "it failed while this group joined it");
  }
}

void EngineCore::onPathMoving(int peer, int transport_path, bool moving, const std::string& route) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, transport_path);
    if (slot_index < 0) return;
    PathSlot& slot = p.paths[slot_index];
    if (moving && slot.up) {
      // As the owner does: no new chunks on it; its return is a hunt, not a reconnect.
      slot.hunt.active = true;
      slot.hunt.since = Clock::now();
      slot.hunt.next_route = route;
      requeue(p, slot_index);
    } else if (!moving && slot.hunt.active) {
      slot.hunt.active = false;  // the re-opening was given up: the old connection goes on
      pumpAll(p);
    }
  }
  notify();
}

void EngineCore::onPairFailed(int peer, const std::string& why) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.link != Peer::Link::kConnecting) return;
    markUnreachable(p, why);
  }
  notify();
}

}  // namespace multipath
}  // namespace maestro
