// The control channel: small two-sided messages (operation descriptors,
// credits, barrier tokens, aborts, point-to-point handshakes, health and
// hunting notices), sent on the path the policy gives them (the lowest
// probed RTT under adaptive and latency: scheduler.h) and re-sent
// elsewhere if that path closes before a probe confirms them. onMessage()
// checks the header and hands each type to the handler its protocol
// registered (registerControl()).
#include "multipath/engine_core.h"
#include "multipath/engine_state.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "multipath/scheduler.h"

namespace maestro {
namespace multipath {
using namespace detail;

// ---------------------------------------------------------------- control

int EngineCore::controlPath(const Peer& peer) const {
  std::vector<PathView> views(peer.paths.size());
  for (size_t i = 0; i < peer.paths.size(); ++i) {
    views[i].up = peer.usable(i);
    views[i].rtt = peer.paths[i].rtt;
  }
  const int p = multipath::controlPath(config_.policy, views);
  return p == kNoPath ? -1 : p;
}

void EngineCore::sendControl(int peer, ControlType type, uint64_t seq, uint32_t sub, const void* payload,
                         size_t length) {
  MAESTRO_CHECK(sizeof(ControlHeader) + length <= transport::kMaxControlBytes, "control message too large");
  std::vector<uint8_t> msg(sizeof(ControlHeader) + length);
  ControlHeader h{};
  h.type = static_cast<uint8_t>(type);
  h.sub = sub;
  h.seq = seq;
  std::memcpy(msg.data(), &h, sizeof h);
  if (length) std::memcpy(msg.data() + sizeof h, payload, length);
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.unreachable) throw Error(p.error);
  if (p.link != Peer::Link::kUp) {
    connectLocked(p);
    p.waiting_control.emplace_back(std::move(msg), type != ControlType::kPathDown);
    return;
  }
  postControl(p, std::move(msg), /*reliable=*/type != ControlType::kPathDown);
}

void EngineCore::postControl(Peer& p, std::vector<uint8_t> msg, bool reliable) {
  int slot = controlPath(p);
  if (slot < 0) {
    markUnreachable(p, strcat("no path to rank ", p.rank, " is up"));
    throw Error(p.error);
  }
  PathSlot& s = p.paths[slot];
  // Posted under the peer's lock, like writes in pump(): the transport only
  // queues, and the order against writes and pings on this path is exact.
  mesh_.transport->postSend(p.rank, s.id, msg.data(), msg.size());
  if (!reliable) return;
  s.unconfirmed.push_back({Clock::now(), std::move(msg)});
  if (s.unconfirmed.size() >= kConfirmAfter && !s.ping_outstanding) {
    s.ping_outstanding = true;
    s.ping_sent = Clock::now();
    sendPing(p.rank, s.id);
  }
}

bool EngineCore::takeControl(int peer, ControlKey key, std::vector<uint8_t>* payload) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.inbox.find(key);
  if (it == p.inbox.end()) return false;
  if (payload) *payload = std::move(it->second);
  p.inbox.erase(it);
  return true;
}

void EngineCore::broadcastAbort(uint64_t seq, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    aborts_.emplace(seq, reason);
  }
  noteFailure(seq, reason);
  relayAbort(seq, static_cast<uint32_t>(rank_), reason, -1);
}

void EngineCore::relayAbort(uint64_t seq, uint32_t origin, const std::string& reason, int from) {
  // To every peer this rank is connected to (or connecting to), not to every
  // rank: each passes it on once (onMessage), so it floods the connected
  // graph -- the ring at least, which reaches every rank.
  std::string text = reason.substr(0, transport::kMaxControlBytes - sizeof(ControlHeader));
  for (int peer : activePeers()) {
    if (peer == from) continue;
    try {
      sendControl(peer, ControlType::kAbort, seq, origin, text.data(), text.size());
    } catch (const Error&) {
      // That peer is unreachable; it will fail on its own.
    }
  }
}

bool EngineCore::abortFor(uint64_t seq, std::string* reason) const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  auto it = aborts_.find(seq);
  if (it == aborts_.end()) return false;
  *reason = it->second;
  return true;
}

void EngineCore::interrupt(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (interrupted_.empty()) interrupted_ = why.empty() ? std::string("interrupted") : why;
  }
  notify();
}

void EngineCore::noteFailure(uint64_t seq, const std::string& why) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (seq <= failure_seq_ && !failure_.empty()) return;
  failure_seq_ = seq;
  failure_ = why;
}

bool EngineCore::interrupted(std::string* why) const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (interrupted_.empty()) return false;
  *why = interrupted_;
  return true;
}

void EngineCore::retire(uint64_t seq) {
  retired_.store(std::max(retired_.load(), seq));
  trimBuffers();  // the operation is over: none of its buffers is in use
  {
    // Aborts of finished operations: nobody asks for them again.
    std::lock_guard<std::mutex> lock(abort_mu_);
    aborts_.erase(aborts_.begin(), aborts_.upper_bound(seq));
  }
  for (int peer : activePeers()) {
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    for (auto it = p.inbox.begin(); it != p.inbox.end();)
      it = it->first.seq <= seq ? p.inbox.erase(it) : std::next(it);
  }
}

void EngineCore::registerControl(ControlType type, ControlHandler handler) {
  ControlHandler& slot = control_handlers_[static_cast<uint8_t>(type)];
  MAESTRO_CHECK(slot == nullptr, "control message type ", int(type), " has two handlers");
  slot = handler;
}

void EngineCore::onMessage(int peer, int path, const uint8_t* data, size_t length) {
  Peer& p = *peers_[peer];
  ControlHeader h{};
  if (length >= sizeof h) std::memcpy(&h, data, sizeof h);
  const ControlHandler handler = length >= sizeof h ? control_handlers_[h.type] : nullptr;
  if (handler == nullptr) {
    std::lock_guard<std::mutex> lock(p.mu);
    markUnreachable(p, length < sizeof h ? strcat("protocol error from rank ", peer, ": short control message")
                                         : strcat("protocol error from rank ", peer, ": unknown control message ",
                                                  int(h.type)));
  } else if (!(this->*handler)(p, ControlIn{peer, path, static_cast<ControlType>(h.type), h.seq, h.sub,
                                            data + sizeof h, length - sizeof h})) {
    return;
  }
  notify();
}

// ---------------------------------------------------------------- the operations' messages

void EngineCore::registerOperationControl() {
  registerControl(ControlType::kDesc, &EngineCore::onOperationMessage);
  registerControl(ControlType::kCredit, &EngineCore::onOperationMessage);
  registerControl(ControlType::kBarrier, &EngineCore::onOperationMessage);
  registerControl(ControlType::kAbort, &EngineCore::onAbort);
  registerControl(ControlType::kP2PReady, &EngineCore::onP2PMessage);
  registerControl(ControlType::kP2PGrant, &EngineCore::onP2PMessage);
  registerControl(ControlType::kP2PDone, &EngineCore::onP2PMessage);
}

// A collective's message (descriptor, credit, barrier token): kept, by
// operation, until the collective takes it (takeControl()).
bool EngineCore::onOperationMessage(Peer& p, const ControlIn& m) {
  std::lock_guard<std::mutex> lock(p.mu);
  p.heard(Clock::now());
  const uint64_t retired = retired_.load();
  if (m.seq <= retired) return true;  // a duplicate for a finished operation
  if (m.seq > retired + kMaxOpsAhead || (p.inbox.size() >= kMaxInbox && !p.inbox.count({m.type, m.seq, m.sub}))) {
    markUnreachable(p, strcat("protocol error from rank ", m.peer, ": control message for operation #", m.seq,
                              " while #", retired, " is the last finished here (", p.inbox.size(),
                              " waiting; at most ", kMaxInbox, ", at most ", kMaxOpsAhead, " operations ahead)"));
    return true;
  }
  p.inbox[{m.type, m.seq, m.sub}].assign(m.body, m.body + m.length);
  return true;
}

bool EngineCore::onAbort(Peer& p, const ControlIn& m) {
  if (m.seq <= retired_.load()) return false;  // about an operation this rank finished
  if (m.seq > retired_.load() + kMaxOpsAhead) {
    std::lock_guard<std::mutex> lock(p.mu);
    markUnreachable(p, strcat("protocol error from rank ", m.peer, ": abort of operation #", m.seq, ", more than ",
                              kMaxOpsAhead, " ahead of #", retired_.load()));
    return true;
  }
  std::string reason(reinterpret_cast<const char*>(m.body), m.length);
  bool first;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    first = aborts_.emplace(m.seq, reason).second;
  }
  // Ranks this one is connected to and the origin is not may wait on this
  // operation too: pass it on (once).
  if (first) relayAbort(m.seq, m.sub, reason, m.peer);
  return true;
}

// A point-to-point handshake: queued in arrival order for the
// point-to-point layer (takeP2P()).
bool EngineCore::onP2PMessage(Peer& p, const ControlIn& m) {
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.heard(Clock::now());
  }
  bool overflow = false;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    if (p2p_waiting_[m.peer] >= kMaxInbox) {
      overflow = true;
    } else {
      ++p2p_waiting_[m.peer];
      p2p_inbox_.push_back(P2PMessage{m.peer, m.type, m.seq, m.sub, std::vector<uint8_t>(m.body, m.body + m.length)});
    }
  }
  if (overflow) {
    std::lock_guard<std::mutex> lock(p.mu);
    markUnreachable(p, strcat("protocol error from rank ", m.peer, ": more than ", kMaxInbox,
                              " point-to-point control messages waiting"));
  }
  return true;
}

bool EngineCore::takeP2P(std::vector<P2PMessage>* out) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  if (p2p_inbox_.empty()) return false;
  for (auto& m : p2p_inbox_) {
    --p2p_waiting_[m.peer];
    out->push_back(std::move(m));
  }
  p2p_inbox_.clear();
  return true;
}

}  // namespace multipath
}  // namespace maestro
