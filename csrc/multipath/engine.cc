#include "multipath/engine.h"
#include "multipath/engine_state.h"
#include "multipath/path_health.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "multipath/decomposer.h"
#include "transport/nic_counters.h"

namespace maestro {
namespace multipath {
using namespace detail;

Engine::Engine(const std::map<std::string, std::string>& overrides, Rendezvous& store, int rank, int size,
               Deadline setup_deadline, const std::string& rendezvous_host, Parent parent)
    : rank_(rank), size_(size) {
  setLogRank(rank);
  connect_wait_ = setup_deadline == Clock::time_point::max() ? Clock::duration::max() : setup_deadline - Clock::now();
  qp_ = std::make_unique<QpManager>(store, rank, size, setup_deadline);
  config_ = qp_->agreeOnConfig(overrides);
  if (shareWith(std::move(parent), setup_deadline)) {
    MAESTRO_INFO(describeSetup());
    std::lock_guard<std::mutex> lock(owner_->channels_mu_);
    owner_->channels_.push_back(this);  // its monitor ticks this engine's paths too
    return;
  }
  mesh_ = qp_->plan(config_, rendezvous_host);
  settle();
  // Every completion passes the mux: subgroups may share these paths.
  mux_ = std::make_shared<ChannelMux>(this);
  qp_->open(mesh_, mux_.get());
  mux_->setTransport(mesh_.transport.get());
  std::string discovery_report;
  const std::vector<RankPair> pairs = QpManager::startUpPairs(size_, config_.connect == "eager");
  for (auto& [peer, paths] : qp_->connectAtStart(config_, mesh_, pairs)) {
    if (!paths.report.empty()) discovery_report += "\n  " + paths.report;
    install(peer, paths);
  }
  if (!discovery_report.empty()) MAESTRO_INFO("discovery:", discovery_report);
  if (!mesh_.vnics.warning.empty() && rank_ == 0) MAESTRO_WARN(mesh_.vnics.warning);
  MAESTRO_INFO(describeSetup());
  monitor_ = startNamedThread("maestro-monitor", [this] { monitorLoop(); });
  reconnector_ = startNamedThread("maestro-reconn", [this] { reconnectLoop(); });
}

Engine::~Engine() {
  if (owner_) {  // no monitor tick of the owner's reaches this engine after this
    std::lock_guard<std::mutex> lock(owner_->channels_mu_);
    owner_->channels_.erase(std::find(owner_->channels_.begin(), owner_->channels_.end(), this));
  }
  stopping_ = true;
  monitor_cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(reconnect_mu_);
    reconnect_cv_.notify_all();
  }
  if (monitor_.joinable()) monitor_.join();
  if (reconnector_.joinable()) reconnector_.join();
  reapConnecting(true);  // each sees stopping_ within a poll (or ends its connects by connect_timeout)
  if (logLevel() >= LogLevel::kInfo && mesh_.transport) MAESTRO_INFO("path statistics at shutdown:\n", pathTable());
  if (metrics_ && mesh_.transport) {  // the last record
    try {
      metrics_->write(pathStats(), Clock::now());
    } catch (const std::exception& e) {
      MAESTRO_WARN("MAESTRO_METRICS: the last record failed: ", e.what());
    }
  }
  // Say goodbye on every path (each is ordered, so the goodbye arrives before
  // that path's close) so the peers do not mistake it for a crash. On the
  // transport's id of each path: where discovery chose among candidates
  // that is the chosen candidate's, not the path's index.
  ControlHeader header{};
  header.type = static_cast<uint8_t>(ControlType::kBye);
  std::vector<uint8_t> bye(sizeof header);
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    header.seq = failure_seq_;
    std::memcpy(bye.data(), &header, sizeof header);
    bye.insert(bye.end(), failure_.begin(),
               failure_.begin() + std::min(failure_.size(), transport::kMaxControlBytes - sizeof header));
  }
  for (int peer : mesh_.transport ? activePeers() : std::vector<int>()) {
    std::vector<int> ids;
    {
      std::lock_guard<std::mutex> lock(peers_[peer]->mu);
      for (const PathSlot& slot : peers_[peer]->paths) ids.push_back(slot.id);
    }
    for (int id : ids) {
      try {
        mesh_.transport->postSend(peer, id, bye.data(), bye.size());
      } catch (const Error&) {
      }
    }
  }
  // On shared paths, the channel is given back (no completion reaches this
  // engine after it) and the paths stay: the owner, kept alive until now,
  // shuts them down when its own group and the last channel are gone.
  if (owner_) mux_->detach(channel_);
  else if (mesh_.transport) mesh_.transport->shutdown();  // no completion arrives after this
  std::lock_guard<std::mutex> lock(buffers_mu_);
  for (auto& kv : buffers_) freeBuffer(kv.second);
}

void Engine::settle() {
  // Every rank agreed on the knobs and the transport, so on these too.
  if (config_.chunk_size == 0) config_.chunk_size = chunkSizeFor(mesh_.transport_kind);
  if (config_.min_chunk_size == 0) config_.min_chunk_size = minChunkFor(mesh_.transport_kind, config_.chunk_size);
  config_.discovery = mesh_.discovery;  // auto, decided
  // A group on shared paths judges its own traffic on them; a path it finds
  // slow is re-opened by the group that owns them (monitorPeer).
  hunter_ = Hunter(config_);
  // Every peer's state exists before the first path opens: completions may
  // arrive as soon as it does. Its paths are set when its pair connects.
  p2p_waiting_.assign(size_, 0);
  for (int i = 0; i < size_; ++i) peers_.push_back(std::make_unique<Peer>(i, config_, chunkingFor(i)));
}

Chunking Engine::chunkingFor(int peer) const {
  const bool here = peer < static_cast<int>(mesh_.hosts.size()) && rank_ < static_cast<int>(mesh_.hosts.size()) &&
                    !mesh_.hosts[peer].empty() && mesh_.hosts[peer] == mesh_.hosts[rank_];
  if (here) return Chunking(config_.chunk_size);
  return Chunking(config_.chunk_size, config_.min_chunk_size, static_cast<uint32_t>(std::max(1, mesh_.paths)));
}

std::string Engine::describeSetup() const {
  std::ostringstream os;
  os << "group of " << size_ << " ranks, ";
  if (owner_) os << "on the paths of its parent group (shared paths, channel " << channel_ << "), ";
  os << "transport " << mesh_.transport_kind << " (" << mesh_.transport_why << "), " << mesh_.paths
     << " paths per peer (" << mesh_.paths_why << "), vNICs ";
  for (size_t i = 0; i < mesh_.vnics.addresses.size(); ++i) os << (i ? "," : "") << mesh_.vnics.addresses[i];
  os << " from " << mesh_.vnics.source << ", chunks of " << config_.chunk_size << " bytes";
  if (config_.min_chunk_size < config_.chunk_size && mesh_.paths > 1)
    os << " (a message under " << mesh_.paths << " chunks to a rank on another host: one chunk per path, of at "
       << "least " << config_.min_chunk_size << " bytes)";
  os << ", discovery " << mesh_.discovery << (mesh_.discovery_why.empty() ? "" : " (" + mesh_.discovery_why + ")");
  os << ", path hunting " << (!hunter_.enabled() ? "off" : owner_ ? "on (the parent group re-opens)" : "on");
  if (mesh_.transport_kind == "tcp") os << ", congestion control " << mesh_.congestion_why;
  os << "\nknobs:\n" << config_.describe() << "paths:\n" << pathTable();
  return os.str();
}

// ---------------------------------------------------------------- memory

Region Engine::buffer(int slot, size_t bytes) {
  std::lock_guard<std::mutex> lock(buffers_mu_);
  auto it = buffers_.find(slot);
  if (it != buffers_.end() && it->second.region.length >= bytes) {
    it->second.wanted = std::max(it->second.wanted, bytes);
    return it->second.region;
  }
  if (it != buffers_.end()) {
    freeBuffer(it->second);
    buffers_.erase(it);
  }
  size_t size = std::max<size_t>(bytes, 4096);
  size = (size + 4095) / 4096 * 4096;
  void* mem = nullptr;
  MAESTRO_CHECK(posix_memalign(&mem, 4096, size) == 0, "cannot allocate a ", size, "-byte buffer");
  Region r;
  try {
    r = mesh_.transport->registerMemory(mem, size);
  } catch (...) {
    std::free(mem);
    throw;
  }
  buffers_[slot] = Buffer{r, mem, bytes};
  return r;
}

void Engine::freeBuffer(const Buffer& b) {
  mesh_.transport->deregisterMemory(b.region);
  std::free(b.memory);
}

void Engine::trimBuffers() {
  constexpr uint64_t kTrimEvery = 16;
  constexpr size_t kKeepBelow = 1 << 20;
  std::lock_guard<std::mutex> lock(buffers_mu_);
  if (++ops_since_trim_ < kTrimEvery) return;
  ops_since_trim_ = 0;
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    Buffer& b = it->second;
    if (b.region.length > kKeepBelow && b.region.length > 4 * b.wanted) {
      MAESTRO_TRACE("freeing a ", b.region.length, "-byte buffer: the last ", kTrimEvery, " operations needed at most ",
                    b.wanted);
      freeBuffer(b);
      it = buffers_.erase(it);
    } else {
      b.wanted = 0;
      ++it;
    }
  }
}

size_t Engine::bufferBytes() const {
  std::lock_guard<std::mutex> lock(buffers_mu_);
  size_t total = 0;
  for (const auto& kv : buffers_) total += kv.second.region.length;
  return total;
}

// ---------------------------------------------------------------- events

void Engine::notify() {
  events_.fetch_add(1);
  if (waiters_.load() > 0) {
    std::lock_guard<std::mutex> lock(event_mu_);
    event_cv_.notify_all();
  }
}

bool Engine::waitUntil(const std::function<bool()>& done, Deadline deadline) {
  for (;;) {
    const uint64_t seen = eventCount();
    if (done()) return true;
    if (!waitEvent(seen, deadline) && Clock::now() >= deadline) return false;
  }
}

bool Engine::waitEvent(uint64_t seen, Deadline deadline) {
  std::unique_lock<std::mutex> lock(event_mu_);
  waiters_.fetch_add(1);
  bool woke = event_cv_.wait_until(lock, deadline, [&] { return events_.load() != seen; });
  waiters_.fetch_sub(1);
  return woke;
}

void Engine::checkPeer(int peer) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.unreachable) throw Error(p.error);
}

bool Engine::reachable(int peer) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  return !p.unreachable;
}

// ---------------------------------------------------------------- sending

std::vector<PathView> Engine::views(const Peer& peer) const {
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
  }
  return v;
}

void Engine::enqueue(Peer& peer, ChunkDesc* chunk) {
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

void Engine::pump(Peer& peer, int path, bool pull) {
  PathSlot& slot = peer.paths[path];
  while (peer.usable(path) && slot.inflight < config_.window) {
    ChunkDesc* c = nullptr;
    if (!slot.queue.empty()) {
      c = slot.queue.front();
      slot.queue.pop_front();
    } else if (pull && peer.scheduler->pulls() && !peer.shared.empty() &&
               peer.scheduler->pull(views(peer), path, peer.shared.size(), peer.shared.front()->length) == path) {
      c = peer.shared.front();
      peer.shared.pop_front();
    } else {
      break;
    }
    post(peer, path, c);
  }
}

void Engine::pumpAll(Peer& peer) {
  if (peer.link != Peer::Link::kUp) return;
  const size_t n = peer.paths.size();
  for (size_t i = 0; i < n; ++i) pump(peer, static_cast<int>(i), /*pull=*/false);
  // Shared chunks (adaptive, latency): one at a time, to the path the
  // scheduler picks (none: the chunk waits for a path that will finish it
  // sooner). After this, each completion lets its own path pull first.
  while (!peer.shared.empty()) {
    const int best = peer.scheduler->pull(views(peer), kAnyPath, peer.shared.size(), peer.shared.front()->length);
    if (best < 0 || !peer.usable(best) || peer.paths[best].inflight >= config_.window) break;
    ChunkDesc* c = peer.shared.front();
    peer.shared.pop_front();
    post(peer, best, c);
  }
}

void Engine::post(Peer& peer, int path, ChunkDesc* c) {
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

std::shared_ptr<SendOp> Engine::write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
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

int Engine::slotOf(const Peer& peer, int transport_path) {
  return transport_path >= 0 && transport_path < static_cast<int>(peer.slot_of.size()) ? peer.slot_of[transport_path]
                                                                                       : -1;
}

void Engine::onWriteComplete(int peer, int transport_path, uint64_t wr_id, bool ok) {
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
        slot.rate.completed(c->length, now);
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

void Engine::failSends(Peer& peer, const std::string& why) {
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

void Engine::markUnreachable(Peer& peer, const std::string& why) {
  if (!peer.unreachable) {
    peer.unreachable = true;
    peer.error = why;
    if (peer.left || stopping_) MAESTRO_INFO(why);
    else MAESTRO_WARN(why);
  }
  failSends(peer, peer.error);
}

// ---------------------------------------------------------------- receiving

std::shared_ptr<RecvOp> Engine::expect(int peer, uint32_t tag, uint64_t length, ChunkHook hook) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  auto op = std::make_shared<RecvOp>();
  op->peer_ = peer;
  op->tag_ = tag;
  op->length_ = length;
  auto shared_hook = hook ? std::make_shared<ChunkHook>(std::move(hook)) : nullptr;
  Peer& p = *peers_[peer];
  std::vector<ChunkSpan> early;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    connectLocked(p);
    early = p.reassembler.expect(tag, length, shared_hook);
    p.receiving[tag] = op;
    if (p.reassembler.complete(tag)) op->done_.store(true, std::memory_order_release);
  }
  for (const ChunkSpan& s : early) {  // chunks that landed before we asked
    if (shared_hook) (*shared_hook)(s.offset, s.length);
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.reassembler.processed(tag)) op->done_.store(true, std::memory_order_release);
  }
  return op;
}

void Engine::beginOperation(uint64_t seq) {
  const uint32_t epoch = static_cast<uint32_t>(seq & 3);
  // A peer never connected has nothing to forget (its table is not even
  // allocated): the cost is per connected peer, not per rank of the group.
  for (int peer : activePeers()) {
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    p.reassembler.reset(epoch << kEpochShift, 1u << kEpochShift);
  }
  current_epoch_.store(epoch);
}

void Engine::release(const std::shared_ptr<RecvOp>& op) {
  Peer& p = *peers_[op->peer_];
  std::unique_lock<std::mutex> lock(p.mu);
  auto it = p.receiving.find(op->tag_);
  if (it != p.receiving.end() && it->second == op) {
    p.receiving.erase(it);
    p.reassembler.release(op->tag_);
  }
  // A hook still running writes into the operation's buffers: wait for it
  // (only an aborted operation releases a message with chunks in flight).
  while (op->hooks_running_ > 0) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
}

void Engine::onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) {
  Peer& p = *peers_[peer];
  uint32_t tag = immTag(imm);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> hook;
  std::shared_ptr<RecvOp> op;
  std::string error;
  Reassembler::Landed landed = Reassembler::Landed::kDuplicate;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, path);
    if (slot_index >= 0) {
      PathSlot& slot = p.paths[slot_index];
      slot.bytes_received += length;
      slot.chunks_received++;
      slot.last_arrival = Clock::now();
    }
    p.heard(Clock::now());
    // Only the current operation's chunks can be legitimate: a peer writes
    // to us only after our descriptor for that operation reached it.
    // Point-to-point messages are not operations: their tags are handed out
    // by this rank and taken back only when the sender is done with them.
    if (isP2PTag(tag) || (tag >> kEpochShift) == current_epoch_.load()) {
      landed = p.reassembler.land(tag, immChunk(imm), length, &span, &hook, &error);
      if (landed == Reassembler::Landed::kError)
          markUnreachable(p, strcat("protocol error from rank ", peer, " on path ", slot_index, ": ", error));
      if (landed == Reassembler::Landed::kNew) {
        auto it = p.receiving.find(tag);
        if (it != p.receiving.end()) {
          op = it->second;
          op->hooks_running_++;
        }
      }
    }
  }
  if (landed == Reassembler::Landed::kNew) {
    if (hook) (*hook)(span.offset, span.length);  // e.g. reduce this chunk while the next arrives
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(p.mu);
      if (op) op->hooks_running_--;
      if (p.reassembler.processed(tag) && op) {
        op->done_.store(true, std::memory_order_release);
        done = true;
      }
    }
    if (done) notify();  // only a finished message is worth waking the collective thread for
  }
}

// ---------------------------------------------------------------- control

int Engine::controlPath(const Peer& peer) const {
  // Control messages are small: the lowest-RTT live path under the latency
  // policy, else the first live one.
  int best = -1;
  for (size_t i = 0; i < peer.paths.size(); ++i) {
    if (!peer.usable(i)) continue;
    if (best < 0) best = static_cast<int>(i);
    if (config_.policy == Policy::kLatency && peer.paths[i].rtt > 0 &&
        (peer.paths[best].rtt <= 0 || peer.paths[i].rtt < peer.paths[best].rtt))
      best = static_cast<int>(i);
  }
  return best;
}

void Engine::sendControl(int peer, ControlType type, uint64_t seq, uint32_t sub, const void* payload,
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

void Engine::postControl(Peer& p, std::vector<uint8_t> msg, bool reliable) {
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

bool Engine::takeControl(int peer, ControlKey key, std::vector<uint8_t>* payload) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.inbox.find(key);
  if (it == p.inbox.end()) return false;
  if (payload) *payload = std::move(it->second);
  p.inbox.erase(it);
  return true;
}

void Engine::broadcastAbort(uint64_t seq, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    aborts_.emplace(seq, reason);
  }
  noteFailure(seq, reason);
  relayAbort(seq, static_cast<uint32_t>(rank_), reason, -1);
}

void Engine::relayAbort(uint64_t seq, uint32_t origin, const std::string& reason, int from) {
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

bool Engine::abortFor(uint64_t seq, std::string* reason) const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  auto it = aborts_.find(seq);
  if (it == aborts_.end()) return false;
  *reason = it->second;
  return true;
}

void Engine::interrupt(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (interrupted_.empty()) interrupted_ = why.empty() ? std::string("interrupted") : why;
  }
  notify();
}

void Engine::noteFailure(uint64_t seq, const std::string& why) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (seq <= failure_seq_ && !failure_.empty()) return;
  failure_seq_ = seq;
  failure_ = why;
}

bool Engine::interrupted(std::string* why) const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (interrupted_.empty()) return false;
  *why = interrupted_;
  return true;
}

void Engine::cancelSends(uint64_t seq, const std::string& why, std::chrono::milliseconds grace) {
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

void Engine::retire(uint64_t seq) {
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

void Engine::onMessage(int peer, int path, const uint8_t* data, size_t length) {
  Peer& p = *peers_[peer];
  if (length < sizeof(ControlHeader)) {
    std::lock_guard<std::mutex> lock(p.mu);
    markUnreachable(p, strcat("protocol error from rank ", peer, ": short control message"));
  } else {
    ControlHeader h;
    std::memcpy(&h, data, sizeof h);
    const uint8_t* body = data + sizeof h;
    size_t body_len = length - sizeof h;
    switch (static_cast<ControlType>(h.type)) {
      case ControlType::kPing:
        // Answer on the path it came on: the RTT is that path's.
        try {
          ControlHeader r = h;
          r.type = static_cast<uint8_t>(ControlType::kPong);
          mesh_.transport->postSend(peer, path, &r, sizeof r);
        } catch (const Error&) {
        }
        return;
      case ControlType::kPong: {
        std::lock_guard<std::mutex> lock(p.mu);
        p.heard(Clock::now());
        int slot_index = slotOf(p, path);
        if (slot_index < 0) return;
        PathSlot& slot = p.paths[slot_index];
        if (slot.ping_outstanding) {
          slot.rtt = ewma(slot.rtt, seconds(Clock::now() - slot.ping_sent), 0.3);
          slot.ping_outstanding = false;
          slot.confirmUpTo(slot.ping_sent);
        }
        if (slot.doubted) {
          slot.doubted = false;  // it answers: a notice about an older connection, or a delayed ACK
          slot.fenced = 0;       // and what it held has arrived (or was dropped): the pong came after it
          MAESTRO_INFO("path ", slot_index, " to rank ", peer, " answers its probe: back in use");
          pumpAll(p);
        }
        break;  // notify(): chunks may have moved
      }
      case ControlType::kPathDown: {
        bool close = false;
        {
          std::lock_guard<std::mutex> lock(p.mu);
          int slot_index = slotOf(p, static_cast<int>(h.sub));
          if (slot_index < 0 || !p.paths[slot_index].up || p.paths[slot_index].doubted) return;
          const PathSlot& s = p.paths[slot_index];
          // Our own chunks on it are stuck as well: the report is about this
          // connection, and they move only once it is closed. Otherwise
          // nothing waits on it: verify before believing.
          close = s.inflight > 0 && seconds(Clock::now() - s.last_progress) > kMinDoubtWindow;
          if (!close) doubt(p, slot_index, strcat("rank ", peer, " reports path ", slot_index, " dead"));
        }
        if (close) mesh_.transport->closePath(peer, static_cast<int>(h.sub), "the peer found this path dead");
        return;
      }
      case ControlType::kFence:
        // Our peer withdrew its writes on path <sub> up to mark <seq> and
        // sends them again on the path this came on (and others), after this.
        mesh_.transport->dropWritesUntil(peer, static_cast<int>(h.sub), h.seq);
        return;
      case ControlType::kBye: {
        std::lock_guard<std::mutex> lock(p.mu);
        p.left = true;
        p.left_after.assign(reinterpret_cast<const char*>(body), body_len);
        p.left_after_seq = h.seq;
        return;
      }
      case ControlType::kHunt: {
        // The opener re-opens this path on another route: what waits on it
        // moves now, and its old connection's close is no failure. Only the
        // paths' owners hunt (a group on shared paths hears of it through
        // onPathMoving): on a channel this is out of place.
        if (owner_) return;
        {
          std::lock_guard<std::mutex> lock(p.mu);
          int slot_index = slotOf(p, static_cast<int>(h.sub));
          if (slot_index < 0 || p.paths[slot_index].initiated || !p.paths[slot_index].up) return;
          PathSlot& slot = p.paths[slot_index];
          slot.hunt.active = true;
          slot.hunt.since = Clock::now();
          requeue(p, slot);
        }
        mux_->pathMoving(peer, static_cast<int>(h.sub), true, "");  // the groups on it drain it too
        break;
      }
      case ControlType::kHuntAsk:
      case ControlType::kHuntOffer:
      case ControlType::kHuntPick: {
        // Validated here, acted on by the reconnect thread (probes block).
        // Anything out of place is ignored: hunting is an optimisation, run
        // by the paths' owner (never on a channel of shared paths).
        if (owner_) return;
        const auto type = static_cast<ControlType>(h.type);
        HuntJob job{type == ControlType::kHuntAsk ? HuntJob::kAsked
                    : type == ControlType::kHuntOffer ? HuntJob::kOffered : HuntJob::kPicked,
                    peer, static_cast<int>(h.sub), {}};
        if (body_len % 2 != 0 || body_len > 2 * 64 || (type == ControlType::kHuntPick && body_len != 2)) return;
        for (size_t i = 0; i < body_len; i += 2) {
          uint16_t port;
          std::memcpy(&port, body + i, 2);
          job.ports.push_back(port);
        }
        {
          std::lock_guard<std::mutex> lock(p.mu);
          int slot_index = slotOf(p, job.id);
          // Asks and picks go to the opener, offers to the acceptor.
          if (!hunter_.enabled() || slot_index < 0 ||
              p.paths[slot_index].initiated != (type != ControlType::kHuntOffer))
            return;
        }
        queueHunt(std::move(job));
        return;
      }
      case ControlType::kAbort: {
        if (h.seq <= retired_.load()) return;  // about an operation this rank finished
        if (h.seq > retired_.load() + kMaxOpsAhead) {
          std::lock_guard<std::mutex> lock(p.mu);
          markUnreachable(p, strcat("protocol error from rank ", peer, ": abort of operation #", h.seq,
                                    ", more than ", kMaxOpsAhead, " ahead of #", retired_.load()));
          break;
        }
        std::string reason(reinterpret_cast<const char*>(body), body_len);
        bool first;
        {
          std::lock_guard<std::mutex> lock(abort_mu_);
          first = aborts_.emplace(h.seq, reason).second;
        }
        // Ranks this one is connected to and the origin is not may wait on
        // this operation too: pass it on (once).
        if (first) relayAbort(h.seq, h.sub, reason, peer);
        break;
      }
      case ControlType::kP2PReady:
      case ControlType::kP2PGrant:
      case ControlType::kP2PDone: {
        {
          std::lock_guard<std::mutex> lock(p.mu);
          p.heard(Clock::now());
        }
        bool overflow = false;
        {
          std::lock_guard<std::mutex> lock(p2p_mu_);
          if (p2p_waiting_[peer] >= kMaxInbox) {
            overflow = true;
          } else {
            ++p2p_waiting_[peer];
            p2p_inbox_.push_back(P2PMessage{peer, static_cast<ControlType>(h.type), h.seq, h.sub,
                                            std::vector<uint8_t>(body, body + body_len)});
          }
        }
        if (overflow) {
          std::lock_guard<std::mutex> lock(p.mu);
          markUnreachable(p, strcat("protocol error from rank ", peer, ": more than ", kMaxInbox,
                                    " point-to-point control messages waiting"));
        }
        break;
      }
      case ControlType::kDesc:
      case ControlType::kCredit:
      case ControlType::kBarrier: {
        std::lock_guard<std::mutex> lock(p.mu);
        p.heard(Clock::now());
        const uint64_t retired = retired_.load();
        if (h.seq <= retired) break;  // a duplicate for a finished operation
        if (h.seq > retired + kMaxOpsAhead || (p.inbox.size() >= kMaxInbox && !p.inbox.count(
                                                   {static_cast<ControlType>(h.type), h.seq, h.sub}))) {
          markUnreachable(p, strcat("protocol error from rank ", peer, ": control message for operation #", h.seq,
                                    " while #", retired, " is the last finished here (", p.inbox.size(),
                                    " waiting; at most ", kMaxInbox, ", at most ", kMaxOpsAhead, " operations ahead)"));
          break;
        }
        p.inbox[{static_cast<ControlType>(h.type), h.seq, h.sub}].assign(body, body + body_len);
        break;
      }
      default: {
        std::lock_guard<std::mutex> lock(p.mu);
        markUnreachable(p, strcat("protocol error from rank ", peer, ": unknown control message ", int(h.type)));
      }
    }
  }
  notify();
}

bool Engine::takeP2P(std::vector<P2PMessage>* out) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  if (p2p_inbox_.empty()) return false;
  for (auto& m : p2p_inbox_) {
    --p2p_waiting_[m.peer];
    out->push_back(std::move(m));
  }
  p2p_inbox_.clear();
  return true;
}

void Engine::recycleTag(int peer, uint32_t tag) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  MAESTRO_CHECK(tag < kUsedTags, "tag ", tag, " out of range");
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  MAESTRO_CHECK(!p.receiving.count(tag), "tag ", tag, " from rank ", peer, " is still expected");
  p.reassembler.reset(tag, 1);
}

void Engine::onPathError(int peer, int transport_path, const std::string& what) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int path = slotOf(p, transport_path);
    if (path < 0) return;  // a discovery candidate we do not use
    pathDown(p, path, what);
  }
  notify();
}

void Engine::onPathUp(int peer, int transport_path) {
  Peer& p = *peers_[peer];
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int path = slotOf(p, transport_path);
    if (path < 0 || p.unreachable) return;  // start-up, or a group already failed
    PathSlot& slot = p.paths[path];
    if (slot.up) return;
    const bool hunted = slot.hunt.active;
    slot.up = true;
    slot.generation++;
    slot.doubted = false;
    if (hunted) {
      // Re-opened by hunting (either side): a fresh connection on another
      // route; its throughput is measured anew.
      slot.hunt.active = false;
      slot.hunt.hunts++;
      slot.hunt.reopened = Clock::now();
      slot.hunt.slow_for = 0;
      slot.route = std::move(slot.hunt.next_route);
      slot.hunt.next_route.clear();
      slot.rate.reset();
    } else {
      slot.reconnects++;
    }
    slot.inflight = 0;  // the old connection flushed everything it held
    slot.fenced = 0;
    slot.last_progress = Clock::now();
    slot.ping_outstanding = false;
    // Chunks withdrawn from a path still set aside may come here: the peer
    // hears of that fence on this path first.
    for (const PathSlot& s : p.paths)
      if (s.fenced > 0 && s.up) sendFence(p, slot, s);
    if (hunted) MAESTRO_INFO("path ", path, " to rank ", peer, " re-opened on another route",
                             slot.route.empty() ? std::string() : strcat(" (via ", slot.route, ")"));
    else MAESTRO_INFO("path ", path, " to rank ", peer, " is up again");
    pumpAll(p);
  }
  notify();
}

void Engine::pathDown(Peer& p, int path, const std::string& what) {
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
    // Chunks queued on it move to the live paths; the ones in flight come
    // back as flushed completions and move then.
    std::deque<ChunkDesc*> orphans;
    orphans.swap(slot.queue);
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
      for (ChunkDesc* c : orphans) enqueue(p, c);
      pumpAll(p);
      resendUnconfirmed(p, slot);
    }
  }
}

void Engine::resendUnconfirmed(Peer& p, PathSlot& slot) {
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

BusyPath Engine::busyPath(const Peer& p, const PathSlot& s, Clock::time_point now) const {
  BusyPath b;
  b.inflight = s.inflight + s.fenced;
  b.control = static_cast<int>(s.unconfirmed.size());
  // Held since: the last completion (or the post that made it busy); with
  // no chunk, its oldest control message not known to have arrived.
  const Clock::time_point since = std::max(
      p.back_at, b.inflight > 0 ? s.last_progress : (s.unconfirmed.empty() ? now : s.unconfirmed.front().at));
  b.stalled = seconds(now - since);
  b.chunk_bytes = static_cast<double>(config_.chunk_size);
  b.throughput = s.rate.value();
  b.rtt = s.rtt;
  b.heard_since = p.last_heard > since && seconds(now - p.last_heard) <= p.lately;
  b.doubted = s.doubted;
  b.path_timeout = config_.path_timeout;
  return b;
}

double Engine::doubtWindow(const PathSlot& slot) const {
  // A live path answers a probe within a few of its round trips (the probe
  // overtakes queued data, and a doubted path gets no new chunks). Waiting
  // longer only holds the chunks already in flight on a path that is, most
  // often, really dead: they move only once it is closed.
  if (slot.rtt <= 0) return config_.path_timeout;
  return std::min(config_.path_timeout, std::max(kMinDoubtWindow, 4 * slot.rtt));
}

void Engine::sendPing(int peer, int id) {
  ControlHeader h{};
  h.type = static_cast<uint8_t>(ControlType::kPing);
  try {
    mesh_.transport->postSend(peer, id, &h, sizeof h);
  } catch (const Error&) {
    // A dead path: the missing pong is the answer, and its error is reported on its own.
  }
}

void Engine::doubt(Peer& p, int path, const std::string& why) {
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
  requeue(p, slot);
  resendUnconfirmed(p, slot);
  fence(p, path);
}

void Engine::fence(Peer& p, int path) {
  PathSlot& slot = p.paths[path];
  if (slot.inflight == 0) return;
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
  const uint64_t mark = mesh_.transport->withdrawWrites(p.rank, slot.id);
  if (mark == 0) return;  // the transport cannot: they move once the path is closed
  slot.fenced = slot.inflight;
  slot.fence_mark = mark;
  MAESTRO_INFO("path ", path, " to rank ", p.rank, ": its ", slot.inflight,
               " chunks in flight are sent again on the other paths");
  for (const PathSlot& s : p.paths)
    if (&s != &slot && s.up) sendFence(p, s, slot);
}

void Engine::sendFence(Peer& p, const PathSlot& via, const PathSlot& fenced) {
  ControlHeader h{};
  h.type = static_cast<uint8_t>(ControlType::kFence);
  h.sub = static_cast<uint32_t>(fenced.id);
  h.seq = fenced.fence_mark;
  try {
    mesh_.transport->postSend(p.rank, via.id, &h, sizeof h);
  } catch (const Error&) {
    // A dead path: no copy goes there either.
  }
}

void Engine::onWriteWithdrawn(int peer, int transport_path, uint64_t wr_id) {
  (void)transport_path;
  auto* c = reinterpret_cast<ChunkDesc*>(wr_id);
  SendOp* op = c->op;
  Peer& p = *peers_[peer];
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    PathSlot& slot = p.paths[c->path];
    if (c->generation == slot.generation) slot.inflight--;
    op->outstanding_--;
    if (!op->failed()) {
      slot.resent++;
      enqueue(p, c);
    }
    finished = op->failed() && op->outstanding_ == 0;
    if (finished) p.sending.erase(op);  // may free op (and c)
    pumpAll(p);
  }
  if (finished) notify();
}

void Engine::requeue(Peer& p, PathSlot& slot) {
  std::deque<ChunkDesc*> queued;
  queued.swap(slot.queue);
  for (ChunkDesc* c : queued) enqueue(p, c);
  pumpAll(p);
}

// ---------------------------------------------------------------- stats

std::vector<PathStats> Engine::pathStats() const {
  std::vector<PathStats> out;
  std::vector<int> ids;  // transport path ids
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    for (size_t i = 0; i < p.paths.size(); ++i) {
      const PathSlot& s = p.paths[i];
      PathStats st;
      st.peer = peer;
      st.path = static_cast<int>(i);
      // Suspect: set aside, or holding chunks past the stall that raises suspicion.
      const bool stalled = s.inflight > 0 && [&] {
        const BusyPath b = busyPath(p, s, Clock::now());
        return b.stalled > suspectAfter(b);
      }();
      st.state = !s.up ? "down" : (s.doubted || stalled) ? "suspect" : "up";
      st.description = s.description;
      st.last_error = s.last_error;
      st.route = s.route;
      st.reconnects = s.reconnects;
      st.hunts = s.hunt.hunts;
      st.bytes_sent = s.bytes_sent;
      st.bytes_received = s.bytes_received;
      st.chunks_sent = s.chunks_sent;
      st.chunks_received = s.chunks_received;
      st.errors = s.errors;
      st.resent = s.resent;
      st.throughput = s.rate.value();
      st.completion_time = s.completion;
      st.rtt = s.rtt;
      out.push_back(st);
      ids.push_back(s.id);
    }
  }
  // Outside the peers' locks: the transport takes its own. The counters are
  // the port's, so each port is read once, however many paths run on it.
  std::map<std::string, std::map<std::string, uint64_t>> by_port;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string port = mesh_.transport->nicPort(out[i].peer, ids[i]);
    transport::PathCounters pc = mesh_.transport->pathCounters(out[i].peer, ids[i]);
    out[i].congestion = std::move(pc.congestion);
    out[i].path_counters = std::move(pc.counters);
    if (port.empty()) continue;
    auto it = by_port.find(port);
    if (it == by_port.end()) it = by_port.emplace(port, transport::readNicCounters(port)).first;
    out[i].nic_counters = it->second;
  }
  return out;
}

double PathStats::retransmitted() const {
  auto sent = path_counters.find("tcp_bytes_sent");
  auto again = path_counters.find("tcp_bytes_retrans");
  if (sent == path_counters.end() || again == path_counters.end() || sent->second == 0) return -1;
  return static_cast<double>(again->second) / static_cast<double>(sent->second);
}

std::vector<double> Engine::chunkTimes(bool clear) {
  std::lock_guard<std::mutex> lock(samples_mu_);
  std::vector<double> out = chunk_samples_;
  if (clear) {
    chunk_samples_.clear();
    chunk_sample_next_ = 0;
  }
  return out;
}

std::string Engine::pathTable() const {
  std::ostringstream os;
  os << "  peer path state   " << std::left << std::setw(44) << "local <-> remote" << std::right << std::setw(12)
     << "sent MB" << std::setw(12) << "recv MB" << std::setw(9) << "chunks" << std::setw(7) << "errors"
     << std::setw(7) << "resent" << std::setw(7) << "hunts" << std::setw(10) << "MB/s" << std::setw(10) << "rtt ms"
     << std::setw(8) << "retx %" << "  cc\n";
  const std::vector<PathStats> stats = pathStats();
  for (const auto& s : stats) {
    os << "  " << std::setw(4) << s.peer << std::setw(5) << s.path << " " << std::left << std::setw(8) << s.state
       << std::setw(44) << s.description << std::right << std::fixed << std::setprecision(2) << std::setw(12)
       << s.bytes_sent / 1e6 << std::setw(12) << s.bytes_received / 1e6 << std::setw(9) << s.chunks_sent
       << std::setw(7) << s.errors << std::setw(7) << s.resent << std::setw(7) << s.hunts << std::setw(10)
       << s.throughput / 1e6
       << std::setw(10) << s.rtt * 1e3;
    // Retransmitted share of the bytes the connection sent (TCP loss the
    // kernel recovered from; "-" where the transport keeps no such count).
    const double retx = s.retransmitted();
    if (retx < 0) os << std::setw(8) << "-";
    else os << std::setw(8) << retx * 100;
    os << "  " << (s.congestion.empty() ? "-" : s.congestion) << "\n";
  }
  // Device-wide, so once: the NIC of the first path that has any.
  for (const auto& s : stats) {
    if (s.nic_counters.empty()) continue;
    os << "  NIC congestion/loss counters (device-wide):";
    for (const auto& kv : s.nic_counters) os << " " << kv.first << "=" << kv.second;
    os << "\n";
    break;
  }
  return os.str();
}

}  // namespace multipath
}  // namespace maestro
