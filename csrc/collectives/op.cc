#include "collectives/op.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "collectives/desync.h"
#include "common/error.h"
#include "common/log.h"

namespace maestro {
namespace collectives {
namespace {

// DESC payload: the descriptor, then the exposed regions.
struct WireRegion {
  uint32_t id;
  uint32_t reserved;
  uint64_t key;
  uint64_t addr;
  uint64_t length;
  uint64_t base;
};
static_assert(sizeof(OpDesc) == 16, "OpDesc is a wire format");
static_assert(sizeof(WireRegion) == 40, "WireRegion is a wire format");
// handshakeAll's DESC: the descriptor, then this.
struct WireTerms {
  uint64_t sends;     // bytes the sender writes into the receiver
  uint64_t receives;  // bytes the sender takes from the receiver
  WireRegion window;  // where they land at the sender
};
static_assert(sizeof(WireTerms) == 56, "WireTerms is a wire format");

}  // namespace

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kReduce: return "reduce";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kAlltoall: return "all_to_all";
  }
  return "?";
}

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kTree: return "tree";
  }
  return "?";
}

bool OpDesc::operator==(const OpDesc& o) const {
  return kind == o.kind && dtype == o.dtype && reduce_op == o.reduce_op && algorithm == o.algorithm &&
         root == o.root && count == o.count;
}

OpDesc opDesc(OpKind kind, DType dtype, uint64_t count, ReduceOp op, int root, Algorithm algorithm) {
  OpDesc d;
  d.algorithm = static_cast<uint8_t>(algorithm);
  d.kind = static_cast<uint8_t>(kind);
  d.dtype = static_cast<uint8_t>(dtype);
  d.reduce_op = static_cast<uint8_t>(op);
  d.root = root;
  d.count = count;
  return d;
}

std::string describe(const OpDesc& d) {
  auto kind = static_cast<OpKind>(d.kind);
  std::string s = opKindName(kind);
  if (kind == OpKind::kBarrier) return s;
  if (kind == OpKind::kAlltoall) return s + strcat(" of ", dtypeName(static_cast<DType>(d.dtype)), " elements");
  s += strcat(" of ", d.count, " ", dtypeName(static_cast<DType>(d.dtype)), " elements");
  if (kind == OpKind::kAllreduce || kind == OpKind::kReduceScatter || kind == OpKind::kReduce)
    s += strcat(" (", reduceOpName(static_cast<ReduceOp>(d.reduce_op)), ")");
  if (kind == OpKind::kBroadcast || kind == OpKind::kScatter) s += strcat(" from root ", d.root);
  if (kind == OpKind::kReduce || kind == OpKind::kGather) s += strcat(" to root ", d.root);
  if (d.algorithm) s += strcat(" by ", algorithmName(static_cast<Algorithm>(d.algorithm)));
  return s;
}

OpContext::OpContext(multipath::Engine& engine, uint64_t seq, const OpDesc& desc, Deadline deadline)
    : engine_(engine), seq_(seq), desc_(desc), deadline_(deadline) {
  engine_.beginOperation(seq_);
}

OpContext::~OpContext() {
  if (std::uncaught_exceptions() > uncaught_) {
    // Bounded: a path whose writes stay stuck for a path timeout is closed.
    const auto grace = std::chrono::milliseconds(static_cast<int64_t>(engine_.config().path_timeout * 1000));
    try {
      engine_.cancelSends(seq_, strcat(name(), " failed"), grace);
    } catch (const std::exception& e) {
      MAESTRO_WARN(name(), ": cancelling its writes: ", e.what());
    }
  } else if (!engine_.awaitQueued(seq_, deadline_)) {
    MAESTRO_WARN(name(), ": finished here, but a message of it to a rank it was connecting to had not left by "
                 "its deadline");
  }
  for (const auto& r : exposed_) engine_.conceal(r);
  engine_.retire(seq_);
}

std::string OpContext::name() const { return strcat(opKindName(static_cast<OpKind>(desc_.kind)), " #", seq_); }

namespace {
std::atomic<uint32_t> ring_tag_window{kMessagesPerOp};
}  // namespace

uint32_t ringTagWindow() { return ring_tag_window.load(); }

namespace {
std::atomic<int> ring_spans_hosts{-1};  // -1: the engine's answer
}  // namespace

bool ringSpansHosts(const multipath::Engine& engine) {
  const int set = ring_spans_hosts.load();
  return set < 0 ? engine.spansHosts() : set != 0;
}
void setRingSpansHosts(bool spans) { ring_spans_hosts.store(spans ? 1 : 0); }
void resetRingSpansHosts() { ring_spans_hosts.store(-1); }

void setRingTagWindow(uint32_t window) {
  MAESTRO_CHECK(window <= kMessagesPerOp, "a ring tag window of ", window, " tags; at most ", kMessagesPerOp);
  ring_tag_window.store(window == 0 ? kMessagesPerOp : window);
}

uint32_t OpContext::tag(uint32_t index) const {
  MAESTRO_CHECK(index < kMessagesPerOp, name(), ": message index ", index, " out of range");
  return static_cast<uint32_t>((seq_ & 3) << multipath::kEpochShift) | index;
}

void OpContext::abort(const std::string& reason) {
  std::string msg = strcat("maestro ", name(), " failed on rank ", rank(), ": ", reason);
  engine_.broadcastAbort(seq_, msg);
  throw Error(msg);
}

void OpContext::checkHealth(const std::vector<int>& peers) {
  std::string reason;
  if (engine_.abortFor(seq_, &reason)) throw Error(reason);
  if (engine_.interrupted(&reason)) throw Error(strcat("maestro ", name(), " on rank ", rank(), ": ", reason));
  for (int peer : peers) checkPeer(peer);
}

void OpContext::checkPeer(int peer) {
  try {
    engine_.checkPeer(peer);
  } catch (const Error& e) {
    abort(e.what());
  }
}

void OpContext::run(const std::function<bool()>& step, const std::function<std::string()>& waiting_for,
                    const std::function<std::vector<int>()>& depends) {
  // A rank that only waits for a peer (and sends it nothing) must still ask
  // for the pair: the lower rank of a pair opens its paths.
  // And tells the engine whom it waits on: a peer stopped before it sent
  // its word (it never entered this operation) has nothing in flight to
  // judge it by, yet is failed at the peer timeout, not the operation's.
  struct Awaiting {
    multipath::Engine& engine;
    std::vector<int> peers;
    ~Awaiting() {
      for (int peer : peers) engine.awaiting(peer, -1);
    }
  } awaiting{engine_, {}};
  for (int peer : depends()) {
    engine_.awaiting(peer, +1);
    awaiting.peers.push_back(peer);
  }
  for (int peer : awaiting.peers) engine_.connect(peer);
  for (;;) {
    uint64_t seen = engine_.eventCount();
    // A peer is marked unreachable only after everything it sent before it
    // left (its goodbye, then its connections' close) has been delivered.
    // So the peers found unreachable *before* step() looks are the ones it
    // can fail on: if step() still waits for one of them, that will never
    // come. A peer marked while or after step() looked may have delivered
    // its last message (a neighbour that finished first and destroyed its
    // group) too late for it: the mark is an event, so the next round looks
    // again before judging it.
    std::vector<int> lost;
    for (int peer : depends())
      if (!engine_.reachable(peer)) lost.push_back(peer);
    if (step()) return;
    std::vector<int> failed;
    for (int peer : depends())
      if (std::find(lost.begin(), lost.end(), peer) != lost.end()) failed.push_back(peer);
    checkHealth(failed);
    if (!engine_.waitEvent(seen, deadline_) && Clock::now() >= deadline_) {
      // Which ranks are not in this operation, from the marks of the ranks
      // that timed out in it (collectives/desync.h); the abort goes out
      // after that wait, so that it does not end the others' operation
      // before they mark theirs.
      const std::string waited = waiting_for();
      const auto absent = ranksAbsentFrom(engine_.rendezvous(), seq_, rank(), size(), kAbsentWait);
      // " timeout ": the word torch's tests and log scrapers match.
      std::string msg = strcat("maestro ", name(), " timed out on rank ", rank(), " (", describe(desc_),
                               "): its timeout ran out while waiting for ", waited, "; ",
                               describeAbsent(absent, size(), name(), kAbsentWait), "; path states:\n",
                               engine_.pathTable());
      engine_.broadcastAbort(seq_, msg);
      throw TimeoutError(msg);
    }
  }
}

std::vector<RemoteWindow> OpContext::handshake(const std::vector<Window>& windows) {
  // Windows of empty buffers have no registration (id 0): nothing to expose.
  std::vector<uint64_t> keys;
  for (const auto& w : windows) keys.push_back(exposeOnce(w));
  std::vector<uint8_t> payload(sizeof(OpDesc) + windows.size() * sizeof(WireRegion));
  std::memcpy(payload.data(), &desc_, sizeof(OpDesc));
  for (size_t i = 0; i < windows.size(); ++i) {
    const Region& r = windows[i].region;
    uint64_t key = keys[i];
    WireRegion w{r.id, 0, key, reinterpret_cast<uint64_t>(r.addr), r.length, windows[i].base};
    std::memcpy(payload.data() + sizeof(OpDesc) + i * sizeof(WireRegion), &w, sizeof w);
  }
  try {
    engine_.sendControl(left(), multipath::ControlType::kDesc, seq_, 0, payload.data(), payload.size());
  } catch (const Error& e) {
    abort(e.what());
  }
  std::vector<uint8_t> theirs;
  run([&] { return engine_.takeControl(right(), {multipath::ControlType::kDesc, seq_, 0}, &theirs); },
      [&] { return strcat("rank ", right(), " to start the same collective"); },
      [&] { return std::vector<int>{right()}; });
  checkDesc(theirs, right());
  if ((theirs.size() - sizeof(OpDesc)) % sizeof(WireRegion) != 0)
    abort(strcat("malformed operation descriptor from rank ", right()));
  std::vector<RemoteWindow> out((theirs.size() - sizeof(OpDesc)) / sizeof(WireRegion));
  // The same collective exposes the same buffers on every rank: a caller
  // may index every window it exposed itself.
  if (out.size() != windows.size())
    abort(strcat("malformed operation descriptor from rank ", right(), ": ", out.size(), " buffers, expected ",
                 windows.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    WireRegion w;
    std::memcpy(&w, theirs.data() + sizeof(OpDesc) + i * sizeof(WireRegion), sizeof w);
    out[i] = RemoteWindow{RemoteRegion{w.id, w.key, w.addr, w.length}, w.base};
  }
  return out;
}

uint64_t OpContext::exposeOnce(const Window& w) {
  if (!w.region.valid()) return 0;  // an empty buffer has no registration
  for (size_t i = 0; i < exposed_.size(); ++i)
    if (exposed_[i].id == w.region.id) return exposed_keys_[i];
  uint64_t key = engine_.expose(w.region);
  exposed_.push_back(w.region);
  exposed_keys_.push_back(key);
  return key;
}

void OpContext::checkDesc(const std::vector<uint8_t>& theirs, int peer) {
  if (theirs.size() < sizeof(OpDesc)) abort(strcat("malformed operation descriptor from rank ", peer));
  OpDesc other;
  std::memcpy(&other, theirs.data(), sizeof(OpDesc));
  if (!(other == desc_))
    abort(strcat("ranks called different collectives or with different tensors: rank ", rank(), " called ",
                 describe(desc_), " but rank ", peer, " called ", describe(other)));
}

std::vector<RemoteWindow> OpContext::handshakeAll(const std::vector<PeerTerms>& terms) {
  // Pairwise order (rank r+1 first): every rank starts with a different peer.
  std::vector<int> peers;
  for (int k = 1; k < size(); ++k) peers.push_back((rank() + k) % size());
  return handshakeWith(peers, terms);
}

std::vector<RemoteWindow> OpContext::handshakeWith(const std::vector<int>& peers, const std::vector<PeerTerms>& terms) {
  const int n = size(), me = rank();
  MAESTRO_CHECK(static_cast<int>(terms.size()) == n, name(), ": terms for ", terms.size(), " ranks, not ", n);
  const size_t elem = desc_.dtype ? dtypeSize(static_cast<DType>(desc_.dtype)) : 1;
  for (int p : peers) {
    MAESTRO_CHECK(p >= 0 && p < n && p != me, name(), ": no handshake with rank ", p);
    const PeerTerms& t = terms[p];
    const Region& r = t.window.region;
    WireTerms w{t.sends, t.receives,
                WireRegion{r.id, 0, exposeOnce(t.window), reinterpret_cast<uint64_t>(r.addr), r.length, t.window.base}};
    std::vector<uint8_t> payload(sizeof(OpDesc) + sizeof w);
    std::memcpy(payload.data(), &desc_, sizeof(OpDesc));
    std::memcpy(payload.data() + sizeof(OpDesc), &w, sizeof w);
    try {
      engine_.sendControl(p, multipath::ControlType::kDesc, seq_, 0, payload.data(), payload.size());
    } catch (const Error& e) {
      abort(e.what());
    }
  }
  std::vector<RemoteWindow> out(n);
  std::vector<char> heard(n, 1);
  for (int p : peers) heard[p] = 0;
  int missing = static_cast<int>(peers.size());
  auto take = [&]() -> bool {
    for (int p = 0; p < n && missing > 0; ++p) {
      std::vector<uint8_t> theirs;
      if (heard[p] || !engine_.takeControl(p, {multipath::ControlType::kDesc, seq_, 0}, &theirs)) continue;
      heard[p] = 1;
      --missing;
      checkDesc(theirs, p);
      if (theirs.size() != sizeof(OpDesc) + sizeof(WireTerms))
        abort(strcat("malformed operation descriptor from rank ", p));
      WireTerms w;
      std::memcpy(&w, theirs.data() + sizeof(OpDesc), sizeof w);
      const PeerTerms& t = terms[p];
      if (w.sends != t.receives || w.receives != t.sends)
        abort(strcat("ranks disagree on what they exchange in ", describe(desc_), ": rank ", p, " sends ",
                     w.sends / elem, " elements to rank ", me, " and expects ", w.receives / elem,
                     " from it, but rank ", me, " expects ", t.receives / elem, " from rank ", p, " and sends ",
                     t.sends / elem));
      if (t.sends > 0 && (w.window.id == 0 || w.window.length < w.window.base + t.sends))
        abort(strcat("malformed operation descriptor from rank ", p, ": no buffer for ", t.sends, " bytes"));
      out[p] = RemoteWindow{RemoteRegion{w.window.id, w.window.key, w.window.addr, w.window.length}, w.window.base};
    }
    return missing == 0;
  };
  run(take, [&] {
        std::string who;
        int count = 0;
        for (int p = 0; p < n; ++p)
          if (!heard[p]) who += strcat(count++ ? ", " : "", p);
        return strcat(count == 1 ? "rank " : "ranks ", who, " to start the same collective");
      },
      [&] {
        std::vector<int> peers;
        for (int p = 0; p < n; ++p)
          if (!heard[p]) peers.push_back(p);
        return peers;
      });
  return out;
}

}  // namespace collectives
}  // namespace maestro
