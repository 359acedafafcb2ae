#include "collectives/op.h"

#include <cstring>

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

}  // namespace

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

bool OpDesc::operator==(const OpDesc& o) const {
  return kind == o.kind && dtype == o.dtype && reduce_op == o.reduce_op && root == o.root && count == o.count;
}

std::string describe(const OpDesc& d) {
  auto kind = static_cast<OpKind>(d.kind);
  std::string s = opKindName(kind);
  if (kind == OpKind::kBarrier) return s;
  s += strcat(" of ", d.count, " ", dtypeName(static_cast<DType>(d.dtype)), " elements");
  if (kind == OpKind::kAllreduce || kind == OpKind::kReduceScatter)
    s += strcat(" (", reduceOpName(static_cast<ReduceOp>(d.reduce_op)), ")");
  if (kind == OpKind::kBroadcast) s += strcat(" from root ", d.root);
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
  }
  for (const auto& r : exposed_) engine_.conceal(r);
  engine_.retire(seq_);
}

std::string OpContext::name() const { return strcat(opKindName(static_cast<OpKind>(desc_.kind)), " #", seq_); }

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
  for (;;) {
    uint64_t seen = engine_.eventCount();
    if (step()) return;
    checkHealth(depends());
    if (!engine_.waitEvent(seen, deadline_) && Clock::now() >= deadline_) {
      std::string msg = strcat("maestro ", name(), " timed out on rank ", rank(), " (", describe(desc_),
                               ") while waiting for ", waiting_for(),
                               "; a rank may have skipped this collective or be stuck; path states:\n",
                               engine_.pathTable());
      engine_.broadcastAbort(seq_, msg);
      throw TimeoutError(msg);
    }
  }
}

std::vector<RemoteWindow> OpContext::handshake(const std::vector<Window>& windows) {
  // Windows of empty buffers have no registration (id 0): nothing to expose.
  std::vector<uint64_t> keys;
  for (const auto& w : windows) {
    if (!w.region.valid()) {
      keys.push_back(0);
      continue;
    }
    keys.push_back(engine_.expose(w.region));
    exposed_.push_back(w.region);
  }
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
  OpDesc other;
  if (theirs.size() < sizeof(OpDesc) || (theirs.size() - sizeof(OpDesc)) % sizeof(WireRegion) != 0)
    abort(strcat("malformed operation descriptor from rank ", right()));
  std::memcpy(&other, theirs.data(), sizeof(OpDesc));
  if (!(other == desc_))
    abort(strcat("ranks called different collectives or with different tensors: rank ", rank(), " called ",
                 describe(desc_), " but rank ", right(), " called ", describe(other)));
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

}  // namespace collectives
}  // namespace maestro
