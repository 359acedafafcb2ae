#include "multipath/engine.h"

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
namespace {

// Control message header; the payload follows.
struct ControlHeader {
  uint8_t type;
  uint8_t reserved[3];
  uint32_t sub;
  uint64_t seq;
};
static_assert(sizeof(ControlHeader) == 16, "ControlHeader is a wire format");

// Exponentially weighted moving average with a fixed gain.
double ewma(double current, double sample, double gain = 0.2) {
  return current <= 0 ? sample : current + gain * (sample - current);
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct Engine::SentControl {
  Clock::time_point at;
  std::vector<uint8_t> msg;
};

namespace {
constexpr double kRateSample = 0.004;    // seconds: the shortest busy interval a throughput sample covers
constexpr double kMinDoubtWindow = 0.25;  // seconds: a floor for scheduling noise on a loaded host
// A path with this many control messages unconfirmed is probed: the pong
// confirms them all (the path is ordered). None is ever dropped: until a
// probe answers or the path is closed (then they are re-sent elsewhere),
// they are kept.
constexpr size_t kConfirmAfter = 4096;
// A peer's control messages waiting to be taken: at most this many
// operations ahead of the last one this rank finished, and this many in all.
// Beyond either, the peer is not following the protocol.
constexpr uint64_t kMaxOpsAhead = 1u << 16;
constexpr size_t kMaxInbox = 1u << 16;
}  // namespace

struct Engine::PathSlot {
  int id = -1;             // the transport's path id
  bool initiated = false;  // this rank opened it, and reopens it after a failure
  bool up = false;
  // Connections this path has had. A chunk remembers the one it was posted
  // on, so a late flush from a replaced connection neither takes the new one
  // down nor unbalances its in-flight count.
  uint32_t generation = 0;
  // The peer reported this path dead (kPathDown). The notice may be about a
  // connection that has since been replaced, so unless our own chunks on it
  // are stuck too, the path is not closed on the peer's word: it is set
  // aside (no new chunks or control messages) and probed, cleared by any
  // answer, and closed if none comes within doubtWindow() (a few RTTs, at
  // most path_timeout).
  bool doubted = false;
  Clock::time_point doubted_since{};
  std::string description;
  std::string last_error;
  std::string route;
  uint64_t reconnects = 0;
  HuntState hunt;
  uint64_t tick_bytes = 0;  // bytes_sent at the monitor's last tick
  std::deque<ChunkDesc*> queue;  // assigned here, not yet posted
  int inflight = 0;
  uint64_t bytes_sent = 0, bytes_received = 0, chunks_sent = 0, chunks_received = 0, errors = 0, resent = 0;
  // Monitor.
  Clock::time_point last_progress{};
  double completion = 0;     // EWMA seconds per chunk
  double throughput = 0;     // EWMA bytes/s while busy
  Clock::time_point busy_mark{};  // start of the current throughput sample (chunks in flight since)
  uint64_t busy_bytes = 0;        // bytes completed since busy_mark
  double rtt = 0;            // EWMA probe RTT
  Clock::time_point ping_sent{};
  bool ping_outstanding = false;
  Clock::time_point last_arrival{};  // the peer's last write that landed through this path
  // Control messages posted here and not yet known to have arrived. The path
  // is ordered, so a completion of a write posted later, or the pong of a
  // ping posted later, proves delivery; if the path dies first they are
  // re-sent on a live one (every control message is idempotent by its key).
  std::deque<SentControl> unconfirmed;
  // Everything posted here up to `t` has arrived.
  void confirmUpTo(Clock::time_point t) {
    while (!unconfirmed.empty() && unconfirmed.front().at <= t) unconfirmed.pop_front();
  }
};

struct Engine::Peer {
  Peer(int rank, const Config& config) : rank(rank), scheduler(makeScheduler(config)), reassembler(config.chunk_size) {}
  const int rank;
  std::mutex mu;
  std::vector<PathSlot> paths;
  // Up, and not in doubt -- unless every up path is in doubt: then the
  // doubted ones still carry traffic rather than none.
  // A path being re-opened by hunting is set aside the same way.
  bool usable(size_t i) const {
    if (!paths[i].up) return false;
    if (!paths[i].doubted && !paths[i].hunt.active) return true;
    for (const auto& s : paths)
      if (s.up && !s.doubted && !s.hunt.active) return false;
    return true;
  }
  std::vector<int> slot_of;       // transport path id -> index in paths (-1: not ours)
  std::deque<ChunkDesc*> shared;  // kAnyPath chunks: the scheduler's pull() picks the path that takes each
  std::unique_ptr<Scheduler> scheduler;
  Reassembler reassembler;
  std::map<ControlKey, std::vector<uint8_t>> inbox;
  std::unordered_map<SendOp*, std::shared_ptr<SendOp>> sending;
  std::unordered_map<uint32_t, std::shared_ptr<RecvOp>> receiving;  // by tag
  bool unreachable = false;
  bool left = false;  // the peer said goodbye (its group was destroyed)
  std::string error;
  Clock::time_point last_heard{};  // any completion, arrival or message from this peer
  Clock::time_point last_tick{};   // the monitor's last look at its paths
};

Engine::Engine(const std::map<std::string, std::string>& overrides, Rendezvous& store, int rank, int size,
               Deadline setup_deadline, const std::string& rendezvous_host)
    : rank_(rank), size_(size) {
  setLogRank(rank);
  QpManager qp(store, rank, size, setup_deadline);
  config_ = qp.agreeOnConfig(overrides);
  mesh_ = qp.plan(config_, rendezvous_host);
  // Every rank agreed on the knobs and the transport, so on this too.
  if (config_.chunk_size == 0) config_.chunk_size = chunkSizeFor(mesh_.transport_kind);
  config_.discovery = mesh_.discovery;  // auto, decided
  hunter_ = Hunter(config_);
  // Size every peer's path table before the first path opens: completions
  // may arrive as soon as it does.
  auto now = Clock::now();
  p2p_waiting_.assign(size_, 0);
  for (int i = 0; i < size_; ++i) {
    peers_.push_back(std::make_unique<Peer>(i, config_));
    if (i == rank_) continue;
    peers_[i]->paths.resize(mesh_.paths);
    peers_[i]->last_heard = now;
    for (auto& slot : peers_[i]->paths) {
      slot.up = true;
      slot.last_progress = now;
    }
  }
  qp.open(config_, mesh_, this);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    for (int i = 0; i < mesh_.paths; ++i) {
      PathSlot& slot = p.paths[i];
      slot.id = mesh_.ids[peer][i];
      slot.initiated = mesh_.initiator[peer];
      slot.up = mesh_.up[peer][i];
      slot.route = mesh_.routes[peer][i];
      slot.description = mesh_.transport->describePath(peer, slot.id);
      if (!slot.up) slot.last_error = "did not connect at start-up (retried in the background)";
      if (static_cast<int>(p.slot_of.size()) <= slot.id) p.slot_of.resize(slot.id + 1, -1);
      p.slot_of[slot.id] = i;
    }
  }
  if (!mesh_.discovery_report.empty()) MAESTRO_INFO("discovery:", mesh_.discovery_report);
  if (!mesh_.vnics.warning.empty() && rank_ == 0) MAESTRO_WARN(mesh_.vnics.warning);
  MAESTRO_INFO(describeSetup());
  monitor_ = std::thread([this] { monitorLoop(); });
  reconnector_ = std::thread([this] { reconnectLoop(); });
}

Engine::~Engine() {
  stopping_ = true;
  monitor_cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(reconnect_mu_);
    reconnect_cv_.notify_all();
  }
  if (monitor_.joinable()) monitor_.join();
  if (reconnector_.joinable()) reconnector_.join();
  if (logLevel() >= LogLevel::kInfo && mesh_.transport) MAESTRO_INFO("path statistics at shutdown:\n", pathTable());
  // Say goodbye on every path (each is ordered, so the goodbye arrives before
  // that path's close) so the peers do not mistake it for a crash.
  ControlHeader bye{};
  bye.type = static_cast<uint8_t>(ControlType::kBye);
  for (int peer = 0; peer < size_ && mesh_.transport; ++peer) {
    if (peer == rank_) continue;
    for (int path = 0; path < mesh_.paths; ++path) {
      try {
        mesh_.transport->postSend(peer, path, &bye, sizeof bye);
      } catch (const Error&) {
      }
    }
  }
  if (mesh_.transport) mesh_.transport->shutdown();  // no completion arrives after this
  std::lock_guard<std::mutex> lock(buffers_mu_);
  for (auto& kv : buffers_) freeBuffer(kv.second);
}

std::string Engine::describeSetup() const {
  std::ostringstream os;
  os << "group of " << size_ << " ranks, transport " << mesh_.transport_kind << " (" << mesh_.transport_why
     << "), " << mesh_.paths << " paths per peer, vNICs ";
  for (size_t i = 0; i < mesh_.vnics.addresses.size(); ++i) os << (i ? "," : "") << mesh_.vnics.addresses[i];
  os << " from " << mesh_.vnics.source << ", chunks of " << config_.chunk_size << " bytes";
  os << ", discovery " << mesh_.discovery << (mesh_.discovery_why.empty() ? "" : " (" + mesh_.discovery_why + ")");
  os << ", path hunting " << (hunter_.enabled() ? "on" : "off");
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
    v[i].throughput = s.throughput;
    v[i].rtt = s.rtt;
    v[i].stalled = s.inflight > 0 ? seconds(now - s.last_progress) : 0.0;
  }
  return v;
}

void Engine::enqueue(Peer& peer, ChunkDesc* chunk) {
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
    slot.busy_mark = c->posted;
    slot.busy_bytes = 0;
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
  for (const ChunkSpan& s : decompose(length, config_.chunk_size)) {
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
      p.last_heard = now;
      slot.bytes_sent += c->length;
      slot.chunks_sent++;
      if (current) {
        slot.last_progress = now;
        slot.doubted = false;
        // Throughput while busy: bytes completed over at least kRateSample
        // of time with chunks in flight (a path's idle gaps never count).
        slot.busy_bytes += c->length;
        const double busy = seconds(now - slot.busy_mark);
        if (busy >= kRateSample) {
          slot.throughput = ewma(slot.throughput, slot.busy_bytes / busy);
          slot.busy_mark = now;
          slot.busy_bytes = 0;
        }
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
    if (peer.left) MAESTRO_INFO(why);
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
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
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
    p.last_heard = Clock::now();
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
  std::string text = reason.substr(0, transport::kMaxControlBytes - sizeof(ControlHeader));
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    try {
      sendControl(peer, ControlType::kAbort, seq, static_cast<uint32_t>(rank_), text.data(), text.size());
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
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      Peer& p = *peers_[peer];
      std::lock_guard<std::mutex> lock(p.mu);
      for (auto& kv : p.sending)
        if (ofThisOp(kv.first) && kv.first->outstanding_ > 0) ++n;
    }
    return n;
  };
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    bool any = false;
    for (auto it = p.sending.begin(); it != p.sending.end();) {
      SendOp* op = it->first;
      if (!ofThisOp(op) || op->done()) {
        ++it;
        continue;
      }
      any = true;
      if (!op->failed()) {  // a flushed chunk of it is not sent again
        op->error_ = why;
        op->failed_.store(true, std::memory_order_release);
      }
      it = op->outstanding_ == 0 ? p.sending.erase(it) : std::next(it);
    }
    if (!any) continue;
    auto drop = [&](std::deque<ChunkDesc*>& q) {
      q.erase(std::remove_if(q.begin(), q.end(), [&](ChunkDesc* c) { return ofThisOp(c->op) && c->op->failed(); }),
              q.end());
    };
    for (auto& slot : p.paths) drop(slot.queue);
    drop(p.shared);
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
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
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
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
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
        p.last_heard = Clock::now();
        int slot_index = slotOf(p, path);
        if (slot_index < 0) return;
        PathSlot& slot = p.paths[slot_index];
        if (slot.ping_outstanding) {
          slot.rtt = ewma(slot.rtt, seconds(Clock::now() - slot.ping_sent), 0.3);
          slot.ping_outstanding = false;
          slot.confirmUpTo(slot.ping_sent);
        }
        if (slot.doubted) {
          slot.doubted = false;  // it answers: the notice was about an older connection
          MAESTRO_INFO("path ", slot_index, " to rank ", peer, " answers: rank ", peer,
                       "'s report that it is dead was about an earlier connection");
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
          if (!close) doubt(p, slot_index);
        }
        if (close) mesh_.transport->closePath(peer, static_cast<int>(h.sub), "the peer found this path dead");
        return;
      }
      case ControlType::kBye: {
        std::lock_guard<std::mutex> lock(p.mu);
        p.left = true;
        return;
      }
      case ControlType::kHunt: {
        // The opener re-opens this path on another route: what waits on it
        // moves now, and its old connection's close is no failure.
        std::lock_guard<std::mutex> lock(p.mu);
        int slot_index = slotOf(p, static_cast<int>(h.sub));
        if (slot_index < 0 || p.paths[slot_index].initiated || !p.paths[slot_index].up) return;
        PathSlot& slot = p.paths[slot_index];
        slot.hunt.active = true;
        slot.hunt.since = Clock::now();
        requeue(p, slot);
        break;
      }
      case ControlType::kHuntAsk:
      case ControlType::kHuntOffer:
      case ControlType::kHuntPick: {
        // Validated here, acted on by the reconnect thread (probes block).
        // Anything out of place is ignored: hunting is an optimisation.
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
        std::lock_guard<std::mutex> lock(abort_mu_);
        aborts_.emplace(h.seq, std::string(reinterpret_cast<const char*>(body), body_len));
        break;
      }
      case ControlType::kP2PReady:
      case ControlType::kP2PGrant:
      case ControlType::kP2PDone: {
        {
          std::lock_guard<std::mutex> lock(p.mu);
          p.last_heard = Clock::now();
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
        p.last_heard = Clock::now();
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
  MAESTRO_CHECK(isP2PTag(tag), "tag ", tag, " is not a point-to-point tag");
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  MAESTRO_CHECK(!p.receiving.count(tag), "point-to-point tag ", tag, " from rank ", peer, " is still expected");
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
      slot.hunt.slow_for = 0;
      slot.route = std::move(slot.hunt.next_route);
      slot.hunt.next_route.clear();
      slot.throughput = 0;
      slot.busy_bytes = 0;
      slot.busy_mark = Clock::time_point{};
    } else {
      slot.reconnects++;
    }
    slot.inflight = 0;  // the old connection flushed everything it held
    slot.last_progress = Clock::now();
    slot.ping_outstanding = false;
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
        MAESTRO_WARN("path ", path, " to rank ", peer, " (", slot.description, ") is down: ", what);
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
      markUnreachable(p, strcat("rank ", peer, " has shut down its process group (destroy_process_group)"));
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

void Engine::doubt(Peer& p, int path) {
  PathSlot& slot = p.paths[path];
  slot.doubted = true;
  slot.doubted_since = Clock::now();
  MAESTRO_INFO("rank ", p.rank, " reports path ", path, " dead: set aside and probed before it is closed");
  if (!slot.ping_outstanding) {
    slot.ping_outstanding = true;
    slot.ping_sent = slot.doubted_since;
    sendPing(p.rank, slot.id);
  }
  // What waits on it moves now, as if it were down; if it answers, the
  // duplicates are harmless (control messages are idempotent by key).
  requeue(p, slot);
  resendUnconfirmed(p, slot);
}

void Engine::requeue(Peer& p, PathSlot& slot) {
  std::deque<ChunkDesc*> queued;
  queued.swap(slot.queue);
  for (ChunkDesc* c : queued) enqueue(p, c);
  pumpAll(p);
}

// ---------------------------------------------------------------- monitor

void Engine::monitorLoop() {
  setLogRank(rank_);
  nameThisThread("maestro-monitor");
  const auto tick = std::chrono::duration<double>(std::min(config_.probe_interval, config_.path_timeout / 4));
  auto last_probe = Clock::now();
  while (!stopping_) {
    std::vector<std::pair<int, int>> notices;
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, tick, [&] { return stopping_.load() || !down_notices_.empty(); });
      notices.swap(down_notices_);
    }
    if (stopping_) break;
    for (const auto& n : notices) {
      try {
        sendControl(n.first, ControlType::kPathDown, 0, static_cast<uint32_t>(n.second));
      } catch (const Error&) {
        // No live path to that peer: nothing to tell it over.
      }
    }
    auto now = Clock::now();
    bool probe = seconds(now - last_probe) >= config_.probe_interval;
    if (probe) last_probe = now;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      try {
        monitorPeer(peer, now, probe);
      } catch (const std::exception& e) {
        // The monitor must outlive any surprise: log it and go on.
        MAESTRO_WARN("path monitor, rank ", peer, ": ", e.what());
      }
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
  for (int id : to_hunt) queueHunt({HuntJob::kSlow, peer, id, {}});
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
  nameThisThread("maestro-reconn");
  while (!stopping_) {
    std::set<std::pair<int, int>> batch;
    std::deque<HuntJob> hunts;
    {
      std::unique_lock<std::mutex> lock(reconnect_mu_);
      reconnect_cv_.wait(lock, [&] { return stopping_.load() || !reconnect_wanted_.empty() || !hunt_jobs_.empty(); });
      if (stopping_) break;
      batch.swap(reconnect_wanted_);
      hunts.swap(hunt_jobs_);
    }
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
    for (const auto& want : batch) tries.emplace_back([this, want, until] { reconnectPath(want.first, want.second, until); });
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

// ---------------------------------------------------------------- hunting

void Engine::queueHunt(HuntJob job) {
  std::lock_guard<std::mutex> lock(reconnect_mu_);
  if (hunt_jobs_.size() >= 4 * static_cast<size_t>(size_) * mesh_.paths) return;  // a peer flooding asks
  hunt_jobs_.push_back(std::move(job));
  reconnect_cv_.notify_all();
}

std::vector<std::string> Engine::otherRoutes(int peer, int id, bool own_too) {
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

std::vector<uint16_t> Engine::reservePorts(int peer, int id) {
  std::vector<uint16_t> ports;
  const std::string& addr = mesh_.vnics.addresses[id % mesh_.vnics.addresses.size()];
  for (int c = 0; c < config_.candidates; ++c) {
    uint16_t port = mesh_.transport->reservePort(addr);
    if (port == 0) break;
    ports.push_back(port);
  }
  return ports;
}

void Engine::releasePorts(int peer, int id, const std::vector<uint16_t>& ports, const std::vector<uint16_t>& keep) {
  const std::string& addr = mesh_.vnics.addresses[id % mesh_.vnics.addresses.size()];
  for (uint16_t port : ports)
    if (std::find(keep.begin(), keep.end(), port) == keep.end()) mesh_.transport->releasePort(addr, port);
}

std::vector<std::string> Engine::probeCandidates(int peer, int id, const std::vector<uint16_t>& ports, bool opener) {
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
  auto hops = mesh_.transport->probeRoutes(probes, config_.probe_ttl, Clock::now() + std::chrono::milliseconds(1500),
                                           &why);
  if (!why.empty()) MAESTRO_INFO("path hunting, path ", id, " to rank ", peer, ": ", why);
  return hops;
}

void Engine::runHunt(const HuntJob& job) {
  const int peer = job.peer, id = job.id;
  const bool predict = config_.discovery == "ttl";
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

void Engine::reopenPath(int peer, int id, uint16_t port, const std::string& route) {
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
    requeue(p, slot);
  }
  notify();
  // What is in flight completes on the old route (bounded: a write stuck
  // there comes back flushed when the connection is replaced, and moves).
  const auto drain_until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < drain_until && !stopping_) {
    {
      std::lock_guard<std::mutex> lock(p.mu);
      int slot_index = slotOf(p, id);
      if (slot_index < 0 || p.paths[slot_index].inflight == 0 || !p.paths[slot_index].up) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::min(2.0, config_.connect_timeout)));
  bool moved = false;
  try {
    moved = mesh_.transport->reopen(peer, id, port, until);  // onPathError (old), then onPathUp (new)
  } catch (const std::exception& e) {
    MAESTRO_WARN("path hunting: cannot re-open path ", id, " to rank ", peer, ": ", e.what());
  }
  std::string desc = moved ? mesh_.transport->describePath(peer, id) : std::string();
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
      st.state = !s.up ? "down"
                 : (s.doubted || (s.inflight > 0 && seconds(Clock::now() - s.last_progress) > config_.path_timeout / 2))
                     ? "suspect"
                     : "up";
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
      st.throughput = s.throughput;
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
