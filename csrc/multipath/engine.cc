#include "multipath/engine_core.h"
#include "multipath/engine_state.h"
#include "multipath/path_health.h"

#include <sys/resource.h>

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

// ---------------------------------------------------------------- the facade

Engine::Engine(const std::map<std::string, std::string>& overrides, Rendezvous& store, int rank, int size,
               Deadline setup_deadline, const std::string& rendezvous_host, Parent parent)
    : rank_(rank),
      size_(size),
      core_(std::make_shared<EngineCore>(overrides, store, rank, size, setup_deadline, rendezvous_host,
                                         std::move(parent), nullptr)) {}

Engine::Engine(const std::map<std::string, std::string>& overrides, std::shared_ptr<Rendezvous> store, int rank,
               int size, Deadline setup_deadline, const std::string& rendezvous_host, Parent parent)
    : rank_(rank),
      size_(size),
      core_(std::make_shared<EngineCore>(overrides, *store, rank, size, setup_deadline, rendezvous_host,
                                         std::move(parent), store)) {}

// A group on shared paths keeps its owner's Engine and core alive (owner_engine_).
Engine::~Engine() = default;

Rendezvous& Engine::rendezvous() const { return core_->rendezvous(); }
const Config& Engine::config() const { return core_->config(); }
int Engine::paths() const { return core_->paths(); }
bool Engine::spansHosts() const { return core_->spansHosts(); }
const std::string& Engine::transportName() const { return core_->transportName(); }
transport::Transport& Engine::transport() { return core_->transport(); }
uint32_t Engine::channel() const { return core_->channel(); }
Region Engine::registerMemory(void* addr, size_t length) { return core_->registerMemory(addr, length); }
void Engine::deregisterMemory(const Region& r) { core_->deregisterMemory(r); }
uint64_t Engine::expose(const Region& r) { return core_->expose(r); }
void Engine::conceal(const Region& r) { core_->conceal(r); }
Region Engine::buffer(int slot, size_t bytes) { return core_->buffer(slot, bytes); }
size_t Engine::bufferBytes() const { return core_->bufferBytes(); }
void Engine::beginOperation(uint64_t seq) { core_->beginOperation(seq); }
std::shared_ptr<SendOp> Engine::write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                      uint64_t dst_offset, uint64_t length, uint32_t tag, int window, Cut cut) {
  return core_->write(peer, src, src_offset, dst, dst_offset, length, tag, window, cut);
}
std::shared_ptr<RecvOp> Engine::expect(int peer, uint32_t tag, uint64_t length, ChunkHook hook, Cut cut) {
  return core_->expect(peer, tag, length, std::move(hook), cut);
}
void Engine::release(const std::shared_ptr<RecvOp>& op) { core_->release(op); }
void Engine::sendControl(int peer, ControlType type, uint64_t seq, uint32_t sub, const void* payload,
                         size_t length) {
  core_->sendControl(peer, type, seq, sub, payload, length);
}
bool Engine::takeControl(int peer, ControlKey key, std::vector<uint8_t>* payload) {
  return core_->takeControl(peer, key, payload);
}
void Engine::broadcastAbort(uint64_t seq, const std::string& reason) { core_->broadcastAbort(seq, reason); }
bool Engine::abortFor(uint64_t seq, std::string* reason) const { return core_->abortFor(seq, reason); }
void Engine::retire(uint64_t seq) { core_->retire(seq); }
void Engine::cancelSends(uint64_t seq, const std::string& why, std::chrono::milliseconds grace) {
  core_->cancelSends(seq, why, grace);
}
void Engine::interrupt(const std::string& why) { core_->interrupt(why); }
bool Engine::interrupted(std::string* why) const { return core_->interrupted(why); }
void Engine::noteFailure(uint64_t seq, const std::string& why) { core_->noteFailure(seq, why); }
bool Engine::takeP2P(std::vector<P2PMessage>* out) { return core_->takeP2P(out); }
void Engine::recycleTag(int peer, uint32_t tag) { core_->recycleTag(peer, tag); }
void Engine::connect(int peer) { core_->connect(peer); }
void Engine::awaiting(int peer, int delta) { core_->awaiting(peer, delta); }
bool Engine::connected(int peer) { return core_->connected(peer); }
bool Engine::awaitQueued(uint64_t seq, Deadline deadline) { return core_->awaitQueued(seq, deadline); }
std::vector<int> Engine::activePeers() const { return core_->activePeers(); }
uint64_t Engine::eventCount() const { return core_->eventCount(); }
void Engine::wake() { core_->wake(); }
bool Engine::waitEvent(uint64_t seen, Deadline deadline) { return core_->waitEvent(seen, deadline); }
bool Engine::waitUntil(const std::function<bool()>& done, Deadline deadline) {
  return core_->waitUntil(done, deadline);
}
void Engine::checkPeer(int peer) { core_->checkPeer(peer); }
bool Engine::reachable(int peer) { return core_->reachable(peer); }
std::vector<PathStats> Engine::pathStats() const { return core_->pathStats(); }
std::vector<double> Engine::chunkTimes(bool clear) { return core_->chunkTimes(clear); }
std::string Engine::pathTable() const { return core_->pathTable(); }
std::string Engine::describeSetup() const { return core_->describeSetup(); }
void Engine::onMessage(int peer, int path, const uint8_t* data, size_t length) {
  core_->onMessage(peer, path, data, length);
}
int Engine::inflightOn(int peer, int path) { return core_->inflightOn(peer, path); }

// ---------------------------------------------------------------- the core

EngineCore::EngineCore(const std::map<std::string, std::string>& overrides, Rendezvous& store, int rank, int size,
                       Deadline setup_deadline, const std::string& rendezvous_host, Parent parent,
                       std::shared_ptr<Rendezvous> store_owner)
    : rank_(rank), size_(size), store_owner_(std::move(store_owner)) {
  setLogRank(rank);
  registerOperationControl();
  registerHealthControl();
  registerHuntingControl();
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

EngineCore::~EngineCore() {
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

void EngineCore::settle() {
  // Every rank agreed on the knobs and the transport, so on these too.
  if (config_.chunk_size == 0) config_.chunk_size = chunkSizeFor(mesh_.transport_kind);
  if (config_.min_chunk_size == 0) config_.min_chunk_size = minChunkFor(mesh_.transport_kind, config_.chunk_size);
  config_.scratch_slots = scratchSlots(config_, size_);
  config_.alltoall_window = alltoallWindow(config_, size_);
  // This rank's own limit: the registrations it may keep are its own.
  rlimit memlock{};
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) != 0) memlock.rlim_cur = RLIM_INFINITY;
  config_.reg_cache_bytes = regCacheBytes(config_, static_cast<uint64_t>(memlock.rlim_cur));
  config_.discovery = mesh_.discovery;  // auto, decided
  // A group on shared paths judges its own traffic on them; a path it finds
  // slow is re-opened by the group that owns them (monitorPeer).
  hunter_ = Hunter(config_);
  // Every peer's state exists before the first path opens: completions may
  // arrive as soon as it does. Its paths are set when its pair connects.
  p2p_waiting_.assign(size_, 0);
  for (int i = 0; i < size_; ++i) peers_.push_back(std::make_unique<Peer>(i, config_, chunkingFor(i)));
  startSender();
}

Chunking EngineCore::chunkingFor(int peer) const {
  const bool here = peer < static_cast<int>(mesh_.hosts.size()) && rank_ < static_cast<int>(mesh_.hosts.size()) &&
                    !mesh_.hosts[peer].empty() && mesh_.hosts[peer] == mesh_.hosts[rank_];
  if (here) return Chunking(config_.chunk_size);
  return Chunking(config_.chunk_size, config_.min_chunk_size, static_cast<uint32_t>(std::max(1, mesh_.paths)));
}

bool EngineCore::spansHosts() const {
  for (const auto& h : mesh_.hosts)
    if (h.empty() || h != mesh_.hosts.front()) return true;
  return mesh_.hosts.empty() && size_ > 1;
}

std::string EngineCore::describeSetup() const {
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
  if (mesh_.transport->capabilities().congestion_control)
    os << ", congestion control " << mesh_.congestion_why;
  os << "\nknobs:\n" << config_.describe() << "paths:\n" << pathTable();
  return os.str();
}

// ---------------------------------------------------------------- memory

Region EngineCore::buffer(int slot, size_t bytes) {
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

void EngineCore::freeBuffer(const Buffer& b) {
  mesh_.transport->deregisterMemory(b.region);
  std::free(b.memory);
}

void EngineCore::trimBuffers() {
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

size_t EngineCore::bufferBytes() const {
  std::lock_guard<std::mutex> lock(buffers_mu_);
  size_t total = 0;
  for (const auto& kv : buffers_) total += kv.second.region.length;
  return total;
}

// ---------------------------------------------------------------- events

void EngineCore::notify() {
  events_.fetch_add(1);
  if (waiters_.load() > 0) {
    std::lock_guard<std::mutex> lock(event_mu_);
    event_cv_.notify_all();
  }
}

bool EngineCore::waitUntil(const std::function<bool()>& done, Deadline deadline) {
  for (;;) {
    const uint64_t seen = eventCount();
    if (done()) return true;
    if (!waitEvent(seen, deadline) && Clock::now() >= deadline) return false;
  }
}

bool EngineCore::waitEvent(uint64_t seen, Deadline deadline) {
  std::unique_lock<std::mutex> lock(event_mu_);
  waiters_.fetch_add(1);
  bool woke = event_cv_.wait_until(lock, deadline, [&] { return events_.load() != seen; });
  waiters_.fetch_sub(1);
  return woke;
}

void EngineCore::checkPeer(int peer) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.unreachable) throw Error(p.error);
}

void EngineCore::awaiting(int peer, int delta) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  p.awaited += delta;
}

bool EngineCore::reachable(int peer) {
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  return !p.unreachable;
}

}  // namespace multipath
}  // namespace maestro
