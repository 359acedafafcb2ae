// One collective operation on one rank: its descriptor, the handshake every
// operation starts with, message tags, and the wait loop that turns aborts,
// dead peers and the deadline into errors on every rank.
//
// Handshake: each rank exposes the regions its left neighbour will write into
// and sends the left neighbour a DESC (the operation descriptor + those
// regions); it then receives its right neighbour's DESC and checks that the
// descriptors match. The ring is connected, so if any two ranks disagree
// (shape, dtype, op, root, collective), some rank sees it and aborts the
// operation on every rank with a message naming both sides. No data moves
// into a rank's memory before that rank has exposed it for this operation.
//
// Operations in which a rank writes to ranks other than its right neighbour
// (reduce's root, gather, scatter, all-to-all) use handshakeAll instead: a
// DESC to and from every other rank, carrying also how many bytes flow
// between the two and the one window the sender exposes to that peer. Each
// pair checks both; as before, any disagreement aborts on every rank.
#pragma once

#include <exception>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/reduce.h"
#include "multipath/engine.h"

namespace maestro {
namespace collectives {

enum class OpKind : uint8_t {
  kAllreduce = 1, kReduceScatter, kAllgather, kBroadcast, kBarrier, kReduce, kGather, kScatter, kAlltoall
};
const char* opKindName(OpKind kind);
// How an operation runs, where it has a choice (collectives/tuner.h).
enum class Algorithm : uint8_t { kRing = 1, kRecursiveDoubling = 2, kDirect = 3, kTree = 4 };
const char* algorithmName(Algorithm algorithm);

// What every rank must agree on. Sent to the left neighbour in the DESC.
struct OpDesc {
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t reduce_op = 0;
  uint8_t algorithm = 0;  // the tuner's choice (tuner.h), where the operation has one; else 0
  int32_t root = -1;
  // elements: allreduce/broadcast/reduce the tensor, reduce_scatter the
  // output, allgather/gather/scatter one rank's block; all-to-all: 0 (the
  // sizes are per pair, see handshakeAll)
  uint64_t count = 0;
  bool operator==(const OpDesc& o) const;
};
std::string describe(const OpDesc& desc);
// A descriptor; op and root where the collective has them.
OpDesc opDesc(OpKind kind, DType dtype, uint64_t count, ReduceOp op = ReduceOp{}, int root = -1,
              Algorithm algorithm = Algorithm{});

// A registered buffer as one operation sees it: the tensor starts `base`
// bytes into the registration (registrations cover whole storages).
struct Window {
  Region region;
  uint64_t base = 0;
};
struct RemoteWindow {
  RemoteRegion region;
  uint64_t base = 0;
};

// Tag of a message: the operation's epoch (seq mod 4) and the message's
// index within the operation, so consecutive operations never share tags.
constexpr uint32_t kMessagesPerOp = 1u << multipath::kEpochShift;
// The tags a ring operation's messages take turns on: kMessagesPerOp. A
// ring of more messages (groups beyond kMessagesPerOp / 2 + 1 ranks) reuses
// each tag once its previous message is over on both sides (ring.cc).
// Tests lower it (0: back to kMessagesPerOp) to make small rings reuse tags.
uint32_t ringTagWindow();
void setRingTagWindow(uint32_t window);
// Whether a ring's group spans hosts (ringSegmentBytes, plan.h): the
// engine's answer. Tests running ranks as threads of one process set it
// (true / false; reset: back to the engine's answer).
bool ringSpansHosts(const multipath::Engine& engine);
void setRingSpansHosts(bool spans);
void resetRingSpansHosts();

class OpContext {
 public:
  OpContext(multipath::Engine& engine, uint64_t seq, const OpDesc& desc, Deadline deadline);
  // Conceals the exposed regions, retires the seq. Leaving by an exception,
  // it first cancels the operation's writes: none reads the caller's
  // buffers after it returns.
  ~OpContext();
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;

  multipath::Engine& engine() { return engine_; }
  int rank() const { return engine_.rank(); }
  int size() const { return engine_.size(); }
  int left() const { return (rank() + size() - 1) % size(); }
  int right() const { return (rank() + 1) % size(); }
  uint64_t seq() const { return seq_; }
  const OpDesc& desc() const { return desc_; }
  std::string name() const;  // "allreduce #12"

  // Expose `windows` (to the left neighbour), exchange and check the DESC;
  // returns the right neighbour's windows.
  std::vector<RemoteWindow> handshake(const std::vector<Window>& windows);
  // What this rank tells one peer in handshakeAll.
  struct PeerTerms {
    uint64_t sends = 0;     // bytes this rank writes into the peer
    uint64_t receives = 0;  // bytes this rank takes from the peer
    Window window;          // where they land here (exposed to the peer; empty if none)
  };
  // Exchange DESCs with every other rank (terms indexed by rank; this
  // rank's entry is ignored): the descriptors must match, and each pair must
  // agree on the bytes between them. Returns each peer's window for this
  // rank (empty where the peer takes nothing from it).
  std::vector<RemoteWindow> handshakeAll(const std::vector<PeerTerms>& terms);
  // The same with the listed peers only (an algorithm whose ranks each talk
  // to a few partners); the other entries of terms and of the result are
  // unused.
  std::vector<RemoteWindow> handshakeWith(const std::vector<int>& peers, const std::vector<PeerTerms>& terms);
  // Abort unless `peer` is reachable (for peers other than the neighbours).
  void checkPeer(int peer);

  uint32_t tag(uint32_t message_index) const;

  // Drive the operation: call step() (non-blocking progress) until it
  // returns true, sleeping on engine events in between. Throws on an abort
  // from any rank, on a peer the operation still depends on becoming
  // unreachable (`depends` lists them: a neighbour that finished its part
  // and left is no error), or at the deadline; `waiting_for` describes the
  // state for the timeout message.
  void run(const std::function<bool()>& step, const std::function<std::string()>& waiting_for,
           const std::function<std::vector<int>()>& depends);

  // Raise an error on this rank and abort the operation on every rank.
  [[noreturn]] void abort(const std::string& reason);

 private:
  // After its timeout, how long an operation waits for the other ranks that
  // timed out in it to say so, before it names those that did not
  // (collectives/desync.h) and aborts the operation everywhere.
  static constexpr std::chrono::seconds kAbsentWait{2};

  void checkHealth(const std::vector<int>& peers);
  // Expose a window once per operation; its key.
  uint64_t exposeOnce(const Window& w);
  // Abort unless a DESC's descriptor matches ours (checked before its layout,
  // so that two different collectives get that message).
  void checkDesc(const std::vector<uint8_t>& theirs, int peer);

  multipath::Engine& engine_;
  const uint64_t seq_;
  const OpDesc desc_;
  const Deadline deadline_;
  std::vector<Region> exposed_;
  std::vector<uint64_t> exposed_keys_;  // exposed_[i]'s key
  const int uncaught_ = std::uncaught_exceptions();
};

}  // namespace collectives
}  // namespace maestro
