// Connections: which peers a group's engine has paths to, and how a pair
// connects on first use -- on a thread of its own, or through the engine
// that owns shared paths -- with what was sent meanwhile posted in order
// once its paths are installed.
#include "multipath/engine_core.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/engine_state.h"
#include "multipath/sender.h"

namespace maestro {
namespace multipath {
using namespace detail;

void EngineCore::install(int peer, const PeerPaths& paths) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    installLocked(p, paths);
  }
  notify();
  mux_->pairUp(peer);  // groups on channels that asked for it
}

void EngineCore::installLocked(Peer& p, const PeerPaths& paths) {
  const int peer = p.rank;
  {
    const auto now = Clock::now();
    p.paths.resize(paths.ids.size());
    sender_->install(peer, paths.ids.size(), now);  // their progress counts from now
    p.last_heard = now;  // connected: heard, and no silence to come back from
    for (size_t i = 0; i < paths.ids.size(); ++i) {
      PathSlot& slot = p.paths[i];
      slot.id = paths.ids[i];
      slot.initiated = paths.initiator;
      slot.up = paths.up[i];
      slot.route = paths.routes[i];
      slot.description = mesh_.transport->describePath(peer, slot.id);
      if (!slot.up) slot.last_error = "did not connect (retried in the background)";
      if (static_cast<int>(p.slot_of.size()) <= slot.id) p.slot_of.resize(slot.id + 1, -1);
      p.slot_of[slot.id] = static_cast<int>(i);
    }
    activate(p);  // connected at start-up: never asked for
    p.link = Peer::Link::kUp;
    // Connections that failed before this: down now, as if they had failed
    // after (the peer may have exited while the pair connected).
    std::vector<std::pair<int, std::string>> early;
    early.swap(p.early_errors);
    for (const auto& [id, what] : early) {
      const int path = slotOf(p, id);
      if (path >= 0) pathDown(p, path, what);
    }
    if (!p.unreachable) {
      // What was sent while it connected goes now, in order; chunks that
      // waited for paths are assigned to them.
      std::vector<std::pair<std::vector<uint8_t>, bool>> waiting;
      waiting.swap(p.waiting_control);
      try {
        for (auto& [msg, reliable] : waiting) postControl(p, std::move(msg), reliable);
      } catch (const Error&) {
        // No path up: the peer is unreachable (postControl said why).
      }
      sender_->placeWaiting(peer);
    }
  }
}

void EngineCore::connect(int peer) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  connectLocked(p);
}

void EngineCore::activate(Peer& p) {
  if (p.link != Peer::Link::kNone) return;
  p.link = Peer::Link::kConnecting;
  std::lock_guard<std::mutex> lock(active_mu_);
  active_.push_back(p.rank);
}

void EngineCore::connectLocked(Peer& p) {
  if (p.link != Peer::Link::kNone || p.unreachable || stopping_) return;
  activate(p);
  if (owner_) {  // on shared paths: the owner connects the pair (onPairUp)
    owner_->requestPair(ranks_[p.rank]);
    return;
  }
  MAESTRO_TRACE("connecting to rank ", p.rank, " on first use");
  reapConnecting(false);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const int peer = p.rank;
  std::lock_guard<std::mutex> lock(connecting_mu_);
  connecting_.push_back({startNamedThread("maestro-connect",
                                           [this, peer, finished] {
                                             connectInBackground(peer);
                                             finished->store(true);
                                           }),
                         finished});
}

void EngineCore::connectInBackground(int peer) {
  setLogRank(rank_);
  const auto started = Clock::now();
  try {
    // A group without a timeout waits without one.
    const Deadline until =
        connect_wait_ >= Clock::time_point::max() - started ? Clock::time_point::max() : started + connect_wait_;
    PeerPaths paths = qp_->connectPair(config_, mesh_, peer, until, stopping_);
    install(peer, paths);
    MAESTRO_INFO("connected to rank ", peer, " on first use in ", seconds(Clock::now() - started) * 1000, " ms",
                 paths.report.empty() ? std::string() : "; discovery: " + paths.report);
  } catch (const std::exception& e) {
    Peer& p = *peers_[peer];
    std::string why;
    {
      std::lock_guard<std::mutex> lock(p.mu);
      markUnreachable(p, strcat("cannot connect to rank ", peer, ": ", e.what()));
      why = p.error;
    }
    notify();
    mux_->pairFailed(peer, why);
  }
}

void EngineCore::reapConnecting(bool all) {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(connecting_mu_);
    for (auto it = connecting_.begin(); it != connecting_.end();) {
      if (all || it->finished->load()) {
        done.push_back(std::move(it->thread));
        it = connecting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : done) t.join();
}

bool EngineCore::connected(int peer) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  return p.link == Peer::Link::kUp;
}

bool EngineCore::awaitQueued(uint64_t seq, Deadline deadline) {
  auto queued = [&] {
    for (int peer : activePeers()) {
      Peer& p = *peers_[peer];
      std::lock_guard<std::mutex> lock(p.mu);
      if (p.unreachable) continue;
      for (const auto& m : p.waiting_control) {
        ControlHeader h;
        std::memcpy(&h, m.first.data(), sizeof h);
        if (h.seq == seq && static_cast<ControlType>(h.type) != ControlType::kAbort) return true;
      }
    }
    return false;
  };
  return waitUntil([&] { return !queued(); }, deadline);
}

std::vector<int> EngineCore::activePeers() const {
  std::lock_guard<std::mutex> lock(active_mu_);
  return active_;
}

}  // namespace multipath
}  // namespace maestro
