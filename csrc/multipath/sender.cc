// The sender (paper §4.2-4.3): write() cuts a message into chunks
// (decomposer.h), the load balancer (scheduler.h) gives each to a path's
// window or to the peer's shared queue, and a completion retires its chunk
// or hands it to another path (failover.cc). cancelSends() takes back what a
// failed operation still has queued or in flight.
#include "multipath/engine_core.h"
#include "multipath/engine_state.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "multipath/decomposer.h"

namespace maestro {
namespace multipath {
using namespace detail;

// ---------------------------------------------------------------- sending

std::vector<PathView> EngineCore::views(const Peer& peer, const SendOp* placing) const {
  std::vector<PathView> v(peer.paths.size());
  const auto now = Clock::now();
  for (size_t i = 0; i < peer.paths.size(); ++i) {
    const PathSlot& s = peer.paths[i];
    v[i].up = peer.usable(i);
    v[i].inflight = s.inflight + static_cast<int>(s.queue.size());
    v[i].window = config_.window;
    v[i].weight = i < config_.weights.size() ? config_.weights[i] : 1.0;
    v[i].throughput = s.rate.value();
    v[i].rate_stale = s.rate.stale(now);
    v[i].rtt = s.rtt;
    v[i].stalled = s.inflight > 0 ? seconds(now - s.last_progress) : 0.0;
    if (placing && i < placing->taken_.size()) v[i].message_chunks = static_cast<int>(placing->taken_[i]);
  }
  return v;
}

void EngineCore::enqueue(Peer& peer, ChunkDesc* chunk) {
  if (peer.link != Peer::Link::kUp) {  // connecting: install() assigns it
    peer.shared.push_back(chunk);
    return;
  }
  int p = peer.scheduler->assign(views(peer), chunk->op->length_);
  if (p == kAnyPath) {
    peer.shared.push_back(chunk);
  } else if (p >= 0) {
    peer.paths[p].queue.push_back(chunk);
  } else {
    markUnreachable(peer, strcat("no path to rank ", chunk->op->peer_, " is up"));
  }
}

void EngineCore::pump(Peer& peer, int path, bool pull) {
  PathSlot& slot = peer.paths[path];
  while (peer.usable(path) && slot.inflight < config_.window) {
    ChunkDesc* c = nullptr;
    if (!slot.queue.empty()) {
      c = slot.queue.front();
      slot.queue.pop_front();
    } else if (pull && peer.scheduler->pulls() && !peer.shared.empty() &&
               peer.scheduler->pull(views(peer, peer.shared.front()->op), path, peer.shared.size(),
                                 peer.shared.front()->length) == path) {
      c = peer.shared.front();
      peer.shared.pop_front();
    } else {
      break;
    }
    post(peer, path, c);
  }
}

void EngineCore::pumpAll(Peer& peer) {
  if (peer.link != Peer::Link::kUp) return;
  const size_t n = peer.paths.size();
  for (size_t i = 0; i < n; ++i) pump(peer, static_cast<int>(i), /*pull=*/false);
  // Shared chunks (adaptive, latency): one at a time, to the path the
  // scheduler picks (none: the chunk waits for a path that will finish it
  // sooner). After this, each completion lets its own path pull first.
  while (!peer.shared.empty()) {
    const int best = peer.scheduler->pull(views(peer, peer.shared.front()->op), kAnyPath, peer.shared.size(),
                                          peer.shared.front()->length);
    if (best < 0 || !peer.usable(best) || peer.paths[best].inflight >= config_.window) break;
    ChunkDesc* c = peer.shared.front();
    peer.shared.pop_front();
    post(peer, best, c);
  }
}

void EngineCore::post(Peer& peer, int path, ChunkDesc* c) {
  PathSlot& slot = peer.paths[path];
  SendOp* op = c->op;
  c->path = path;
  c->generation = slot.generation;
  c->attempts++;
  c->posted = Clock::now();
  if (slot.inflight == 0) {
    slot.last_progress = c->posted;
    slot.rate.busy(c->posted);
  }
  slot.inflight++;
  op->outstanding_++;
  if (op->taken_.size() < peer.paths.size()) op->taken_.resize(peer.paths.size(), 0);  // once per message
  op->taken_[static_cast<size_t>(path)]++;
  transport::WriteRequest req;
  req.local = op->src_;
  req.src = op->src_addr_ + c->offset;
  req.length = c->length;
  req.remote = op->dst_;
  req.remote_offset = op->dst_offset_ + c->offset;
  req.with_imm = true;
  req.imm = encodeImm(op->tag_, c->index);
  req.wr_id = reinterpret_cast<uint64_t>(c);  // the paper's wr_id trick
  mesh_.transport->postWrite(op->peer_, slot.id, req);
}

std::shared_ptr<SendOp> EngineCore::write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                      uint64_t dst_offset, uint64_t length, uint32_t tag) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  MAESTRO_CHECK(tag < kUsedTags, "message tag ", tag, " out of range");
  MAESTRO_CHECK(src_offset <= src.length && length <= src.length - src_offset, "write source [", src_offset, ", +",
                length, ") outside its region of ", src.length, " bytes");
  auto op = std::make_shared<SendOp>();
  op->peer_ = peer;
  op->tag_ = tag;
  op->length_ = length;
  op->src_ = src;
  op->src_addr_ = static_cast<const uint8_t*>(src.addr) + src_offset;
  op->dst_ = dst;
  op->dst_offset_ = dst_offset;
  for (const ChunkSpan& s : decompose(length, peers_[peer]->reassembler.chunking())) {
    ChunkDesc c;
    c.op = op.get();
    c.index = s.index;
    c.offset = s.offset;
    c.length = s.length;
    op->chunks_.push_back(c);
  }
  op->remaining_ = static_cast<uint32_t>(op->chunks_.size());
  if (op->remaining_ == 0) {
    op->done_ = true;
    return op;
  }
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.unreachable) throw Error(p.error);
  connectLocked(p);
  p.sending[op.get()] = op;
  for (auto& c : op->chunks_) enqueue(p, &c);
  pumpAll(p);
  return op;
}

int EngineCore::slotOf(const Peer& peer, int transport_path) {
  return transport_path >= 0 && transport_path < static_cast<int>(peer.slot_of.size()) ? peer.slot_of[transport_path]
                                                                                       : -1;
}

void EngineCore::onWriteComplete(int peer, int transport_path, uint64_t wr_id, bool ok) {
  auto* c = reinterpret_cast<ChunkDesc*>(wr_id);
  SendOp* op = c->op;
  Peer& p = *peers_[peer];
  // The collective thread waits for operations, not chunks: wake it only
  // when this completion ends one (a context switch per chunk costs more
  // than the chunk on a small host).
  bool wake = !ok;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    const int path = c->path;  // the slot it was posted on (transport_path is its id)
    (void)transport_path;
    PathSlot& slot = p.paths[path];
    // False for a completion from a connection that has since been replaced
    // (onPathUp started the new one's count at zero).
    const bool current = c->generation == slot.generation;
    if (current) slot.inflight--;
    op->outstanding_--;
    auto now = Clock::now();
    if (ok) {
      p.heard(now);
      slot.bytes_sent += c->length;
      slot.chunks_sent++;
      if (current) {
        slot.last_progress = now;
        // A write that completes says the path works -- unless its chunks
        // were withdrawn since: then it was acknowledged before the silence
        // that set the path aside, and only the probe's answer tells.
        if (slot.fenced == 0) slot.doubted = false;
        slot.rate.completed(c->length, now, slot.inflight + static_cast<int>(slot.queue.size()));
      }
      slot.confirmUpTo(c->posted);
      slot.completion = ewma(slot.completion, seconds(now - c->posted));
      {
        std::lock_guard<std::mutex> samples(samples_mu_);
        if (chunk_samples_.size() < kChunkSamples) chunk_samples_.push_back(seconds(now - c->posted));
        else chunk_samples_[chunk_sample_next_++ % kChunkSamples] = seconds(now - c->posted);
      }
      if (--op->remaining_ == 0) {
        op->done_.store(true, std::memory_order_release);
        wake = true;
      }
    } else {
      // A flush means the path is dead, even if its error has not reached
      // us (e.g. it died before the engine was told about it).
      if (slot.up && current) pathDown(p, path, "a write on it was flushed");
      if (!op->failed()) {
        // Move it to a live path. Writes are idempotent (same bytes, same
        // place) and the receiver counts each chunk once, so a copy that did
        // land does no harm.
        slot.resent++;
        enqueue(p, c);
      }
    }
    bool finished = op->done() || (op->failed() && op->outstanding_ == 0);
    wake = wake || finished;
    if (finished) p.sending.erase(op);  // may free op (and c): not touched below
    if (ok) pump(p, path);  // the completion frees room here: this path pulls first
    pumpAll(p);
  }
  if (wake) notify();
}

void EngineCore::failSends(Peer& peer, const std::string& why) {
  for (auto& s : peer.paths) s.queue.clear();
  peer.shared.clear();
  for (auto it = peer.sending.begin(); it != peer.sending.end();) {
    SendOp* op = it->first;
    if (!op->failed()) {
      op->error_ = why;
      op->failed_.store(true, std::memory_order_release);
    }
    // Keep ops with chunks still posted: their flush completions point at them.
    it = op->outstanding_ == 0 ? peer.sending.erase(it) : std::next(it);
  }
  notify();  // waiters see the failed operations (and checkPeer() the unreachable peer)
}

void EngineCore::cancelSends(uint64_t seq, const std::string& why, std::chrono::milliseconds grace) {
  const uint32_t epoch = static_cast<uint32_t>(seq & 3);
  auto ofThisOp = [&](const SendOp* op) { return (op->tag_ >> kEpochShift) == epoch; };
  auto stillPosted = [&] {
    size_t n = 0;
    for (int peer : activePeers()) {
      Peer& p = *peers_[peer];
      std::lock_guard<std::mutex> lock(p.mu);
      for (auto& kv : p.sending)
        if (ofThisOp(kv.first) && kv.first->outstanding_ > 0) ++n;
    }
    return n;
  };
  for (int peer : activePeers()) {
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    bool any = false;
    for (auto& kv : p.sending) {
      SendOp* op = kv.first;
      if (!ofThisOp(op) || op->done()) continue;
      any = true;
      if (!op->failed()) {  // a flushed chunk of it is not sent again
        op->error_ = why;
        op->failed_.store(true, std::memory_order_release);
      }
    }
    if (!any) continue;
    // Its queued chunks go first: they point into the op, which the erase
    // below frees once none of its chunks is posted.
    auto drop = [&](std::deque<ChunkDesc*>& q) {
      q.erase(std::remove_if(q.begin(), q.end(), [&](ChunkDesc* c) { return ofThisOp(c->op) && c->op->failed(); }),
              q.end());
    };
    for (auto& slot : p.paths) drop(slot.queue);
    drop(p.shared);
    for (auto it = p.sending.begin(); it != p.sending.end();) {
      SendOp* op = it->first;
      it = ofThisOp(op) && op->failed() && !op->done() && op->outstanding_ == 0 ? p.sending.erase(it) : std::next(it);
    }
  }
  // Writes already posted read their source until they complete (verbs: the
  // NIC DMAs from it; TCP: until the socket took the bytes): wait for them.
  auto until = Clock::now() + grace;
  for (;;) {
    uint64_t seen = eventCount();
    if (stillPosted() == 0) return;
    if (Clock::now() >= until) break;
    waitEvent(seen, std::min(until, Clock::now() + std::chrono::milliseconds(50)));
  }
  // A peer that stopped reading holds them: close the paths they are on;
  // their flush completes them (and the path reconnects).
  std::vector<std::pair<int, int>> close;
  for (int peer : activePeers()) {
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    for (auto& kv : p.sending) {
      if (!ofThisOp(kv.first) || kv.first->outstanding_ == 0) continue;
      for (const auto& slot : p.paths)
        if (slot.up && slot.inflight > 0) close.emplace_back(peer, slot.id);
      break;
    }
  }
  for (auto& [peer, id] : close) {
    try {
      MAESTRO_WARN("closing path ", id, " to rank ", peer, ": writes of a failed operation are stuck on it");
      mesh_.transport->closePath(peer, id, "writes of a failed operation were stuck on it");
    } catch (const Error&) {
    }
  }
  until = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    uint64_t seen = eventCount();
    if (stillPosted() == 0) return;
    if (Clock::now() >= until) break;
    waitEvent(seen, std::min(until, Clock::now() + std::chrono::milliseconds(50)));
  }
  MAESTRO_WARN("operation #", seq, ": ", stillPosted(), " write(s) still posted after their paths were closed");
}

}  // namespace multipath
}  // namespace maestro
