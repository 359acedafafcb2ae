// Path failure and failover (paper §4.4): a path's error or a peer's
// report closes it or sets it aside (doubt) until a probe answers; what it
// held moves to its siblings (requeue, fence), and a peer with no path left
// is unreachable, which fails the operations waiting on it.
#include "multipath/engine_core.h"
#include "multipath/engine_state.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "multipath/path_health.h"
#include "multipath/sender.h"

namespace maestro {
namespace multipath {
using namespace detail;

void EngineCore::markUnreachable(Peer& peer, const std::string& why) {
  if (!peer.unreachable) {
    peer.unreachable = true;
    peer.error = why;
    if (peer.left || stopping_) MAESTRO_INFO(why);
    else MAESTRO_WARN(why);
  }
  sender_->fail(peer.rank, peer.error);
  notify();  // waiters see the failed operations (and checkPeer() the unreachable peer)
}

void EngineCore::onPathError(int peer, int transport_path, const std::string& what) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int path = slotOf(p, transport_path);
    if (path < 0) {
      // Connected but not yet installed: down once it is (installLocked).
      // Otherwise a discovery candidate we do not use.
      if (p.link != Peer::Link::kUp) p.early_errors.emplace_back(transport_path, what);
      return;
    }
    pathDown(p, path, what);
  }
  notify();
}

void EngineCore::onPathFenced(int peer, int transport_path, uint64_t mark) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  const int path = slotOf(p, transport_path);
  if (path < 0) return;  // a discovery candidate we do not use
  // Before its flushed chunks move (onPathError, then their completions):
  // an original still on the way is dropped, never landed after its copy.
  PathSlot& slot = p.paths[path];
  slot.closed_mark = mark;
  sendFenceElsewhere(p, slot, mark);
}

void EngineCore::onPathUp(int peer, int transport_path) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int path = slotOf(p, transport_path);
    if (path < 0) {  // not yet installed: a connection that replaced a failed one is up
      auto& early = p.early_errors;
      early.erase(std::remove_if(early.begin(), early.end(), [&](const auto& e) { return e.first == transport_path; }),
                  early.end());
    }
    if (path < 0 || p.unreachable) return;  // start-up, or a group already failed
    PathSlot& slot = p.paths[path];
    if (slot.up) return;
    const bool hunted = slot.hunt.active;
    slot.up = true;
    slot.doubted = false;
    if (hunted) {
      // Re-opened by hunting (either side): a fresh connection on another
      // route; its throughput is measured anew (pathUp() below).
      slot.hunt.active = false;
      slot.hunt.hunts++;
      slot.hunt.reopened = Clock::now();
      slot.hunt.slow_for = 0;
      slot.route = std::move(slot.hunt.next_route);
      slot.hunt.next_route.clear();
    } else {
      slot.reconnects++;
    }
    // The old connection flushed everything it held.
    sender_->pathUp(peer, path, hunted, Clock::now());
    slot.fenced = 0;
    slot.ping_outstanding = false;
    // Chunks withdrawn from a path still set aside, or flushed from one
    // whose connection failed, may come here: the peer hears of that fence
    // on this path first.
    slot.closed_mark = 0;
    for (const PathSlot& s : p.paths) {
      if (s.fenced > 0 && s.up) sendFence(p, slot, s.id, s.fence_mark);
      if (s.closed_mark != 0) sendFence(p, slot, s.id, s.closed_mark);
    }
    if (hunted) MAESTRO_INFO("path ", path, " to rank ", peer, " re-opened on another route",
                             slot.route.empty() ? std::string() : strcat(" (via ", slot.route, ")"));
    else MAESTRO_INFO("path ", path, " to rank ", peer, " is up again");
    pumpAll(p);
  }
  notify();
}

void EngineCore::pathDown(Peer& p, int path, const std::string& what) {
  const int peer = p.rank;
  {
    PathSlot& slot = p.paths[path];
    if (slot.up) {
      slot.up = false;
      slot.errors++;
      slot.last_error = what;
      if (p.left) {
        MAESTRO_INFO("path ", path, " to rank ", peer, " closed: the rank left the group");
      } else if (slot.hunt.active) {
        // Replaced by its re-opening (hunting): both sides know.
        slot.errors--;
        MAESTRO_INFO("path ", path, " to rank ", peer, ": the connection on the old route is retired");
      } else {
        // On shared paths the group that owns them warns; the others inform.
        // A group being destroyed informs: its peers leave as it does, and
        // one whose goodbye a reset overtook is no news to anyone.
        const LogLevel level = owner_ || stopping_ ? LogLevel::kInfo : LogLevel::kWarn;
        if (logLevel() >= level)
          logLine(level, strcat("path ", path, " to rank ", peer, " (", slot.description, ") is down: ", what));
        // The peer may not notice (a blackhole swallows our close) and only
        // the path's opener reconnects: tell it over a live path.
        std::lock_guard<std::mutex> lock(monitor_mu_);
        down_notices_.emplace_back(peer, slot.id);
        monitor_cv_.notify_all();
      }
    }
    // Chunks queued on it move to the live paths (those of a peer now
    // unreachable are dropped); the ones in flight come back as flushed
    // completions and move then.
    bool any_up = false;
    for (const auto& s : p.paths) any_up = any_up || s.up;
    if (!any_up && p.left) {
      markUnreachable(p, strcat("rank ", peer, " has shut down its process group (destroy_process_group)",
                                p.left_after.empty() || p.left_after_seq <= retired_.load()
                                    ? std::string()
                                    : strcat(" after a failure there: ", p.left_after)));
    } else if (!any_up) {
      std::string errors;
      bool all_closed = true;
      for (size_t i = 0; i < p.paths.size(); ++i) {
        errors += strcat("\n  path ", i, " (", p.paths[i].description, "): ", p.paths[i].last_error);
        // A peer that died closes or resets every socket it had: "closed by the
        // peer" when the close is seen first, ECONNRESET/EPIPE when a send is.
        const std::string& e = p.paths[i].last_error;
        all_closed = all_closed && (e.find("by the peer") != std::string::npos ||
                                    e.find("reset by peer") != std::string::npos ||
                                    e.find("Broken pipe") != std::string::npos);
      }
      markUnreachable(p, strcat("all ", p.paths.size(), " paths to rank ", peer, " are down",
                                all_closed ? strcat(": rank ", peer, " closed them (did the process exit or crash?)")
                                           : std::string(),
                                errors));
    } else {
      requeue(p, path);
      resendUnconfirmed(p, slot);
    }
  }
}

void EngineCore::resendUnconfirmed(Peer& p, PathSlot& slot) {
  // Control messages the path may have swallowed (credits, op descriptors,
  // barrier tokens) go again on a live path; a receiver that already has
  // one keeps one.
  std::deque<SentControl> lost;
  lost.swap(slot.unconfirmed);
  if (!lost.empty() && !p.left) MAESTRO_INFO("re-sending ", lost.size(), " control message(s) to rank ", p.rank);
  for (auto& m : lost) {
    if (p.left) break;
    try {
      postControl(p, std::move(m.msg), true);
    } catch (const Error&) {
      break;  // no path left: the peer is unreachable and every waiter learns it
    }
  }
}

double EngineCore::doubtWindow(const PathSlot& slot) const {
  // A live path answers a probe within a few of its round trips (the probe
  // overtakes queued data, and a doubted path gets no new chunks). Waiting
  // longer only holds the chunks already in flight on a path that is, most
  // often, really dead: they move only once it is closed.
  if (slot.rtt <= 0) return config_.path_timeout;
  return std::min(config_.path_timeout, std::max(kMinDoubtWindow, 4 * slot.rtt));
}

void EngineCore::sendPing(int peer, int id) {
  ControlHeader h{};
  h.type = static_cast<uint8_t>(ControlType::kPing);
  try {
    mesh_.transport->postSend(peer, id, &h, sizeof h);
  } catch (const Error&) {
    // A dead path: the missing pong is the answer, and its error is reported on its own.
  }
}

void EngineCore::doubt(Peer& p, int path, const std::string& why) {
  PathSlot& slot = p.paths[path];
  slot.doubted = true;
  slot.doubted_since = Clock::now();
  MAESTRO_INFO(why, ": set aside and probed before it is closed");
  if (!slot.ping_outstanding) {
    slot.ping_outstanding = true;
    slot.ping_sent = slot.doubted_since;
    sendPing(p.rank, slot.id);
  }
  // What waits on it moves now, as if it were down; if it answers, the
  // duplicates are harmless (control messages are idempotent by key).
  requeue(p, path);
  resendUnconfirmed(p, slot);
  fence(p, path);
}

void EngineCore::fence(Peer& p, int path) {
  PathSlot& slot = p.paths[path];
  const int inflight = sender_->inflight(p.rank, path);
  if (inflight == 0) return;
  // Only where they can go: with no other path in use they stay (and the
  // path keeps carrying traffic, see Peer::usable()).
  bool elsewhere = false;
  for (const PathSlot& s : p.paths) elsewhere = elsewhere || (&s != &slot && Peer::inUse(s));
  if (!elsewhere) return;
  // The chunks in flight come back as withdrawn (onWriteWithdrawn) and are
  // sent again on the other paths, after the notice to drop the originals,
  // which goes first on each of them: the peer reads it before any copy, so
  // an original that still arrives (the path was only slow) lands before the
  // copy -- same bytes, same place, counted once -- or is dropped, never
  // after the copy, when the place may hold the next message's bytes.
  transport::Fencing* fences = mesh_.transport->fencing();
  if (fences == nullptr) return;  // the transport cannot fence: they move once the path is closed
  const uint64_t mark = fences->withdrawWrites(p.rank, slot.id);
  if (mark == 0) return;  // the path is down (they are flushed), or fenced too often: they move once it closes
  slot.fenced = inflight;
  slot.fence_mark = mark;
  MAESTRO_INFO("path ", path, " to rank ", p.rank, ": its ", inflight,
               " chunks in flight are sent again on the other paths");
  sendFenceElsewhere(p, slot, mark);
}

void EngineCore::sendFenceElsewhere(Peer& p, const PathSlot& fenced, uint64_t mark) {
  for (const PathSlot& s : p.paths)
    if (&s != &fenced && s.up) sendFence(p, s, fenced.id, mark);
}

void EngineCore::sendFence(Peer& p, const PathSlot& via, int fenced, uint64_t mark) {
  ControlHeader h{};
  h.type = static_cast<uint8_t>(ControlType::kFence);
  h.sub = static_cast<uint32_t>(fenced);
  h.seq = mark;
  try {
    mesh_.transport->postSend(p.rank, via.id, &h, sizeof h);
  } catch (const Error&) {
    // A dead path: no copy goes there either.
  }
}

void EngineCore::onWriteWithdrawn(int peer, int transport_path, uint64_t wr_id) {
  (void)transport_path;
  Peer& p = *peers_[peer];
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    finished = sender_->withdrawn(peer, reinterpret_cast<ChunkDesc*>(wr_id));  // sent again elsewhere
  }
  if (finished) notify();
}

// ---------------------------------------------------------------- health messages

void EngineCore::registerHealthControl() {
  registerControl(ControlType::kPing, &EngineCore::onPing);
  registerControl(ControlType::kPong, &EngineCore::onPong);
  registerControl(ControlType::kPathDown, &EngineCore::onPathDownNotice);
  registerControl(ControlType::kFence, &EngineCore::onFence);
  registerControl(ControlType::kBye, &EngineCore::onBye);
}

bool EngineCore::onPing(Peer&, const ControlIn& m) {
  // Answer on the path it came on: the RTT is that path's.
  try {
    ControlHeader r{};
    r.type = static_cast<uint8_t>(ControlType::kPong);
    r.sub = m.sub;
    r.seq = m.seq;
    mesh_.transport->postSend(m.peer, m.path, &r, sizeof r);
  } catch (const Error&) {
  }
  return false;
}

bool EngineCore::onPong(Peer& p, const ControlIn& m) {
  std::lock_guard<std::mutex> lock(p.mu);
  p.heard(Clock::now());
  int slot_index = slotOf(p, m.path);
  if (slot_index < 0) return false;
  PathSlot& slot = p.paths[slot_index];
  if (slot.ping_outstanding) {
    slot.rtt = ewma(slot.rtt, seconds(Clock::now() - slot.ping_sent), 0.3);
    slot.ping_outstanding = false;
    slot.confirmUpTo(slot.ping_sent);
  }
  if (slot.doubted) {
    slot.doubted = false;  // it answers: a notice about an older connection, or a delayed ACK
    slot.fenced = 0;       // and what it held has arrived (or was dropped): the pong came after it
    MAESTRO_INFO("path ", slot_index, " to rank ", m.peer, " answers its probe: back in use");
    pumpAll(p);
  }
  return true;  // chunks may have moved
}

// "Your path <sub> to me is dead."
bool EngineCore::onPathDownNotice(Peer& p, const ControlIn& m) {
  bool close = false;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, static_cast<int>(m.sub));
    if (slot_index < 0 || !p.paths[slot_index].up || p.paths[slot_index].doubted) return false;
    // Our own chunks on it are stuck as well: the report is about this
    // connection, and they move only once it is closed. Otherwise nothing
    // waits on it: verify before believing.
    close = sender_->inflight(p.rank, slot_index) > 0 &&
            seconds(Clock::now() - sender_->lastProgress(p.rank, slot_index)) > kMinDoubtWindow;
    if (!close) doubt(p, slot_index, strcat("rank ", m.peer, " reports path ", slot_index, " dead"));
  }
  if (close) mesh_.transport->closePath(m.peer, static_cast<int>(m.sub), "the peer found this path dead");
  return false;
}

bool EngineCore::onFence(Peer&, const ControlIn& m) {
  // Our peer withdrew its writes on path <sub> up to mark <seq> and sends
  // them again on the path this came on (and others), after this.
  // (Only a peer whose transport fences sends it, and its transport is ours.)
  if (transport::Fencing* fences = mesh_.transport->fencing())
    fences->dropWritesUntil(m.peer, static_cast<int>(m.sub), m.seq);
  return false;
}

bool EngineCore::onBye(Peer& p, const ControlIn& m) {
  std::lock_guard<std::mutex> lock(p.mu);
  p.left = true;
  p.left_after.assign(reinterpret_cast<const char*>(m.body), m.length);
  p.left_after_seq = m.seq;
  return false;
}

}  // namespace multipath
}  // namespace maestro
