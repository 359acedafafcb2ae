// The sender (sender.h), and the engine's side of it: the links it asks,
// write(), the completions, cancelSends(), and the sender's verbs for the
// engine's files that need no more of it (pumpAll, requeue, inflight).
#include "multipath/sender.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "multipath/engine_core.h"
#include "multipath/engine_state.h"

namespace maestro {
namespace multipath {
using namespace detail;
namespace {

// Whether a message's tag is of operation `epoch` (seq mod 4).
bool ofEpoch(uint32_t tag, uint32_t epoch) { return (tag >> kEpochShift) == epoch; }

}  // namespace

Sender::Sender(const Config& config, std::vector<Chunking> chunking, std::unique_ptr<SenderLinks> links,
               size_t samples)
    : window_(config.window), weights_(config.weights), links_(std::move(links)), samples_(samples) {
  peers_.resize(chunking.size());
  for (size_t i = 0; i < chunking.size(); ++i) {
    peers_[i].chunking = chunking[i];
    peers_[i].scheduler = makeScheduler(config);  // one per peer: schedulers keep a cursor
  }
}

Sender::~Sender() = default;

// ---------------------------------------------------------------- placing

std::vector<PathView> Sender::views(int peer, const SendOp* placing, int window) const {
  const PeerSend& ps = peers_[peer];
  std::vector<PathView> v(ps.paths.size());
  const auto now = Clock::now();
  for (size_t i = 0; i < ps.paths.size(); ++i) {
    const Path& s = ps.paths[i];
    v[i].up = links_->usable(peer, static_cast<int>(i));
    v[i].inflight = s.inflight + static_cast<int>(s.queue.size());
    v[i].window = window;
    v[i].weight = i < weights_.size() ? weights_[i] : 1.0;
    v[i].throughput = s.rate.value();
    v[i].rate_stale = s.rate.stale(now);
    v[i].rtt = links_->rtt(peer, static_cast<int>(i));
    v[i].stalled = s.inflight > 0 ? seconds(now - s.last_progress) : 0.0;
    if (placing && i < placing->taken_.size()) v[i].message_chunks = static_cast<int>(placing->taken_[i]);
  }
  return v;
}

void Sender::enqueue(int peer, ChunkDesc* chunk) {
  PeerSend& ps = peers_[peer];
  if (!links_->linked(peer)) {  // connecting: placeWaiting() assigns it
    ps.shared.push_back(chunk);
    return;
  }
  int p = ps.scheduler->assign(views(peer, nullptr, windowFor(chunk->op)), chunk->op->length_);
  if (p == kAnyPath) {
    ps.shared.push_back(chunk);
  } else if (p >= 0) {
    ps.paths[p].queue.push_back(chunk);
  } else {
    links_->noPath(peer, strcat("no path to rank ", chunk->op->peer_, " is up"));
  }
}

void Sender::pump(int peer, int path, bool pull) {
  PeerSend& ps = peers_[peer];
  Path& slot = ps.paths[path];
  while (links_->usable(peer, path) && slot.inflight < window_) {
    ChunkDesc* c = nullptr;
    if (!slot.queue.empty()) {
      if (slot.inflight >= windowFor(slot.queue.front()->op)) break;
      c = slot.queue.front();
      slot.queue.pop_front();
    } else if (pull && ps.scheduler->pulls() && !ps.shared.empty() &&
               slot.inflight < windowFor(ps.shared.front()->op) &&
               ps.scheduler->pull(views(peer, ps.shared.front()->op, windowFor(ps.shared.front()->op)), path,
                                  ps.shared.size(), ps.shared.front()->length) == path) {
      c = ps.shared.front();
      ps.shared.pop_front();
    } else {
      break;
    }
    post(peer, path, c);
  }
}

void Sender::pumpAll(int peer) {
  if (!links_->linked(peer)) return;
  PeerSend& ps = peers_[peer];
  const size_t n = ps.paths.size();
  for (size_t i = 0; i < n; ++i) pump(peer, static_cast<int>(i), /*pull=*/false);
  // Shared chunks (adaptive, latency): one at a time, to the path the
  // scheduler picks (none: the chunk waits for a path that will finish it
  // sooner). After this, each completion lets its own path pull first.
  while (!ps.shared.empty()) {
    const int window = windowFor(ps.shared.front()->op);
    const int best = ps.scheduler->pull(views(peer, ps.shared.front()->op, window), kAnyPath, ps.shared.size(),
                                        ps.shared.front()->length);
    if (best < 0 || !links_->usable(peer, best) || ps.paths[best].inflight >= window) break;
    ChunkDesc* c = ps.shared.front();
    ps.shared.pop_front();
    post(peer, best, c);
  }
}

void Sender::post(int peer, int path, ChunkDesc* c) {
  PeerSend& ps = peers_[peer];
  Path& slot = ps.paths[path];
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
  if (op->taken_.size() < ps.paths.size()) op->taken_.resize(ps.paths.size(), 0);  // once per message
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
  links_->postWrite(op->peer_, path, req);
}

// ---------------------------------------------------------------- messages

std::shared_ptr<SendOp> Sender::message(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                        uint64_t dst_offset, uint64_t length, uint32_t tag, int window,
                                        Cut cut) const {
  auto op = std::make_shared<SendOp>();
  op->peer_ = peer;
  op->tag_ = tag;
  op->window_ = window;
  op->length_ = length;
  op->src_ = src;
  op->src_addr_ = static_cast<const uint8_t*>(src.addr) + src_offset;
  op->dst_ = dst;
  op->dst_offset_ = dst_offset;
  for (const ChunkSpan& s : decompose(length, cutWith(peers_[peer].chunking, cut))) {
    ChunkDesc c;
    c.op = op.get();
    c.index = s.index;
    c.offset = s.offset;
    c.length = s.length;
    op->chunks_.push_back(c);
  }
  op->remaining_ = static_cast<uint32_t>(op->chunks_.size());
  if (op->remaining_ == 0) op->done_ = true;
  return op;
}

void Sender::send(const std::shared_ptr<SendOp>& op) {
  const int peer = op->peer_;
  peers_[peer].sending[op.get()] = op;
  for (auto& c : op->chunks_) enqueue(peer, &c);
  pumpAll(peer);
}

// ---------------------------------------------------------------- paths

void Sender::install(int peer, size_t paths, Clock::time_point now) {
  PeerSend& ps = peers_[peer];
  ps.paths.resize(paths);
  for (Path& s : ps.paths) s.last_progress = now;
}

void Sender::placeWaiting(int peer) {
  std::deque<ChunkDesc*> waiting;
  waiting.swap(peers_[peer].shared);
  for (ChunkDesc* c : waiting) enqueue(peer, c);
  pumpAll(peer);
}

void Sender::pathUp(int peer, int path, bool new_route, Clock::time_point now) {
  Path& s = peers_[peer].paths[path];
  s.generation++;
  if (new_route) s.rate.reset();
  s.inflight = 0;  // the old connection flushed everything it held
  s.last_progress = now;
}

void Sender::requeue(int peer, int path) {
  std::deque<ChunkDesc*> queued;
  queued.swap(peers_[peer].paths[path].queue);
  for (ChunkDesc* c : queued) enqueue(peer, c);
  pumpAll(peer);
}

// ---------------------------------------------------------------- completions

Sender::Completed Sender::completed(int peer, ChunkDesc* c, bool ok) {
  SendOp* op = c->op;
  Path& slot = peers_[peer].paths[c->path];
  // False for a completion from a connection that has since been replaced
  // (pathUp() started the new one's count at zero).
  const auto held = peers_[peer].sending.find(op);
  const Completed done{c->path, c->generation == slot.generation, c->posted, Clock::now(),
                       held == peers_[peer].sending.end() ? nullptr : held->second};
  if (done.current) slot.inflight--;
  op->outstanding_--;
  if (!ok) return done;
  slot.bytes_sent += c->length;
  slot.chunks_sent++;
  if (done.current) {
    slot.last_progress = done.at;
    slot.rate.completed(c->length, done.at, slot.inflight + static_cast<int>(slot.queue.size()));
  }
  slot.completion = ewma(slot.completion, seconds(done.at - c->posted));
  sample(seconds(done.at - c->posted));
  if (--op->remaining_ == 0) op->done_.store(true, std::memory_order_release);
  return done;
}

bool Sender::settle(int peer, ChunkDesc* c, int path, bool ok) {
  PeerSend& ps = peers_[peer];
  SendOp* op = c->op;
  if (!ok && !op->failed()) {
    // Move it to a live path. Writes are idempotent (same bytes, same
    // place) and the receiver counts each chunk once, so a copy that did
    // land does no harm.
    ps.paths[path].resent++;
    enqueue(peer, c);
  }
  const bool finished = op->done() || (op->failed() && op->outstanding_ == 0);
  if (finished) ps.sending.erase(op);  // the caller's Completed holds op (and c) to the end
  if (ok) pump(peer, path);  // the completion frees room here: this path pulls first
  pumpAll(peer);
  return finished;
}

bool Sender::withdrawn(int peer, ChunkDesc* c) {
  PeerSend& ps = peers_[peer];
  SendOp* op = c->op;
  // Kept alive to the end: placing the chunk again may give the peer up
  // (fail()), which forgets a message with no chunk left posted.
  const auto held = ps.sending.find(op);
  const std::shared_ptr<SendOp> keep = held == ps.sending.end() ? nullptr : held->second;
  Path& slot = ps.paths[c->path];
  if (c->generation == slot.generation) slot.inflight--;
  op->outstanding_--;
  if (!op->failed()) {
    slot.resent++;
    enqueue(peer, c);
  }
  const bool finished = op->failed() && op->outstanding_ == 0;
  if (finished) ps.sending.erase(op);  // `keep` holds op (and c) to the end
  pumpAll(peer);
  return finished;
}

// ---------------------------------------------------------------- failures

void Sender::fail(int peer, const std::string& why) {
  PeerSend& ps = peers_[peer];
  for (auto& s : ps.paths) s.queue.clear();
  ps.shared.clear();
  for (auto it = ps.sending.begin(); it != ps.sending.end();) {
    SendOp* op = it->first;
    if (!op->failed()) {
      op->error_ = why;
      op->failed_.store(true, std::memory_order_release);
    }
    // Keep ops with chunks still posted: their flush completions point at them.
    it = op->outstanding_ == 0 ? ps.sending.erase(it) : std::next(it);
  }
}

bool Sender::cancel(int peer, uint32_t epoch, const std::string& why) {
  PeerSend& ps = peers_[peer];
  auto ofThisOp = [&](const SendOp* op) { return ofEpoch(op->tag_, epoch); };
  bool any = false;
  for (auto& kv : ps.sending) {
    SendOp* op = kv.first;
    if (!ofThisOp(op) || op->done()) continue;
    any = true;
    if (!op->failed()) {  // a flushed chunk of it is not sent again
      op->error_ = why;
      op->failed_.store(true, std::memory_order_release);
    }
  }
  if (!any) return false;
  // Its queued chunks go first: they point into the op, which the erase
  // below frees once none of its chunks is posted.
  auto drop = [&](std::deque<ChunkDesc*>& q) {
    q.erase(std::remove_if(q.begin(), q.end(), [&](ChunkDesc* c) { return ofThisOp(c->op) && c->op->failed(); }),
            q.end());
  };
  for (auto& slot : ps.paths) drop(slot.queue);
  drop(ps.shared);
  for (auto it = ps.sending.begin(); it != ps.sending.end();) {
    SendOp* op = it->first;
    it = ofThisOp(op) && op->failed() && !op->done() && op->outstanding_ == 0 ? ps.sending.erase(it) : std::next(it);
  }
  return true;
}

size_t Sender::posted(int peer, uint32_t epoch) const {
  size_t n = 0;
  for (auto& kv : peers_[peer].sending)
    if (ofEpoch(kv.first->tag_, epoch) && kv.first->outstanding_ > 0) ++n;
  return n;
}

std::vector<int> Sender::holding(int peer, uint32_t epoch) const {
  const PeerSend& ps = peers_[peer];
  std::vector<int> paths;
  for (auto& kv : ps.sending) {
    if (!ofEpoch(kv.first->tag_, epoch) || kv.first->outstanding_ == 0) continue;
    for (size_t i = 0; i < ps.paths.size(); ++i)
      if (ps.paths[i].inflight > 0) paths.push_back(static_cast<int>(i));
    break;
  }
  return paths;
}

// ---------------------------------------------------------------- what is read

int Sender::inflight(int peer, int path) const { return peers_[peer].paths[path].inflight; }
Clock::time_point Sender::lastProgress(int peer, int path) const { return peers_[peer].paths[path].last_progress; }
double Sender::throughput(int peer, int path) const { return peers_[peer].paths[path].rate.value(); }
uint64_t Sender::bytesSent(int peer, int path) const { return peers_[peer].paths[path].bytes_sent; }
double Sender::busyRateSinceLastLook(int peer, int path, Clock::time_point now) {
  return peers_[peer].paths[path].rate.busyRateSinceLastLook(now);
}
bool Sender::sending(int peer) const { return !peers_[peer].sending.empty(); }
bool Sender::waiting(int peer) const { return !peers_[peer].shared.empty(); }

void Sender::stats(int peer, int path, PathStats* out) const {
  const Path& s = peers_[peer].paths[path];
  out->bytes_sent = s.bytes_sent;
  out->chunks_sent = s.chunks_sent;
  out->resent = s.resent;
  out->throughput = s.rate.value();
  out->completion_time = s.completion;
}

void Sender::sample(double seconds) {
  std::lock_guard<std::mutex> lock(samples_mu_);
  if (chunk_samples_.size() < samples_) chunk_samples_.push_back(seconds);
  else chunk_samples_[chunk_sample_next_++ % samples_] = seconds;
}

std::vector<double> Sender::chunkTimes(bool clear) {
  std::lock_guard<std::mutex> lock(samples_mu_);
  std::vector<double> out = chunk_samples_;
  if (clear) {
    chunk_samples_.clear();
    chunk_sample_next_ = 0;
  }
  return out;
}

// ---------------------------------------------------------------- the engine's side

// What the sender asks of the engine: each peer's paths (peer.mu held).
class EngineCore::SendLinks final : public SenderLinks {
 public:
  explicit SendLinks(EngineCore& core) : core_(core) {}
  bool linked(int peer) const override { return core_.peers_[peer]->link == Peer::Link::kUp; }
  bool usable(int peer, int path) const override { return core_.peers_[peer]->usable(static_cast<size_t>(path)); }
  double rtt(int peer, int path) const override { return core_.peers_[peer]->paths[path].rtt; }
  void postWrite(int peer, int path, const transport::WriteRequest& req) override {
    const PathSlot& slot = core_.peers_[peer]->paths[path];
    core_.mesh_.transport->postWrite(peer, slot.id, req);
  }
  void noPath(int peer, const std::string& why) override { core_.markUnreachable(*core_.peers_[peer], why); }

 private:
  EngineCore& core_;
};

void EngineCore::SenderDeleter::operator()(Sender* sender) const { delete sender; }

void EngineCore::startSender() {
  std::vector<Chunking> chunking;
  for (int i = 0; i < size_; ++i) chunking.push_back(chunkingFor(i));
  sender_.reset(new Sender(config_, std::move(chunking), std::make_unique<SendLinks>(*this), kChunkSamples));
}

void EngineCore::pumpAll(Peer& peer) { sender_->pumpAll(peer.rank); }
void EngineCore::requeue(Peer& peer, int slot) { sender_->requeue(peer.rank, slot); }
int EngineCore::inflight(const Peer& peer, int slot) const { return sender_->inflight(peer.rank, slot); }

int EngineCore::inflightOn(int peer, int transport_path) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  const int slot_index = slotOf(p, transport_path);
  return slot_index < 0 ? 0 : inflight(p, slot_index);
}

std::shared_ptr<SendOp> EngineCore::write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                          uint64_t dst_offset, uint64_t length, uint32_t tag, int window, Cut cut) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  MAESTRO_CHECK(tag < kUsedTags, "message tag ", tag, " out of range");
  MAESTRO_CHECK(src_offset <= src.length && length <= src.length - src_offset, "write source [", src_offset, ", +",
                length, ") outside its region of ", src.length, " bytes");
  std::shared_ptr<SendOp> op = sender_->message(peer, src, src_offset, dst, dst_offset, length, tag, window, cut);
  if (op->done()) return op;
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.unreachable) throw Error(p.error);
  connectLocked(p);
  sender_->send(op);
  return op;
}

int EngineCore::slotOf(const Peer& peer, int transport_path) {
  return transport_path >= 0 && transport_path < static_cast<int>(peer.slot_of.size()) ? peer.slot_of[transport_path]
                                                                                       : -1;
}

void EngineCore::onWriteComplete(int peer, int transport_path, uint64_t wr_id, bool ok) {
  auto* c = reinterpret_cast<ChunkDesc*>(wr_id);
  Peer& p = *peers_[peer];
  // The collective thread waits for operations, not chunks: wake it only
  // when this completion ends one (a context switch per chunk costs more
  // than the chunk on a small host).
  bool wake = !ok;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    (void)transport_path;  // the chunk knows its slot (transport_path is its id)
    const Sender::Completed done = sender_->completed(peer, c, ok);
    PathSlot& slot = p.paths[done.path];
    if (ok) {
      p.heard(done.at);
      // A write that completes says the path works -- unless its chunks
      // were withdrawn since: then it was acknowledged before the silence
      // that set the path aside, and only the probe's answer tells.
      if (done.current && slot.fenced == 0) slot.doubted = false;
      slot.confirmUpTo(done.posted);
    } else if (slot.up && done.current) {
      // A flush means the path is dead, even if its error has not reached
      // us (e.g. it died before the engine was told about it).
      pathDown(p, done.path, "a write on it was flushed");
    }
    wake = sender_->settle(peer, c, done.path, ok) || wake;  // `done` holds c's message to the end
  }
  if (wake) notify();
}

void EngineCore::cancelSends(uint64_t seq, const std::string& why, std::chrono::milliseconds grace) {
  const uint32_t epoch = static_cast<uint32_t>(seq & 3);
  auto stillPosted = [&] {
    size_t n = 0;
    for (int peer : activePeers()) {
      Peer& p = *peers_[peer];
      std::lock_guard<std::mutex> lock(p.mu);
      n += sender_->posted(peer, epoch);
    }
    return n;
  };
  for (int peer : activePeers()) {
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    sender_->cancel(peer, epoch, why);
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
    for (int slot : sender_->holding(peer, epoch))
      if (p.paths[slot].up) close.emplace_back(peer, p.paths[slot].id);
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
