// The multipath engine of one process group (this header is its facade;
// the implementation is EngineCore, engine_core.h): the paper's multi-path
// transport (§4.2-4.4) on top of any transport.
//
//   write()   Decomposer: cuts a message into chunks; the load balancer
//             (Scheduler) assigns each to a path or to the shared queue;
//             every path holds at most `window` chunks in flight. The wr_id
//             of each posted chunk is the address of its ChunkDesc (the
//             paper's Table 1 trick), so a completion finds its chunk, its
//             message and its path in O(1).
//   expect()  Reassembler: counts the chunks of a message as they land
//             (in place), runs a per-chunk hook, says when all have landed.
//   control   small two-sided messages (operation descriptors, credits,
//             aborts, barrier tokens), matched by (type, seq, sub).
//   failover  a chunk flushed by a failed path is re-assigned to a live one;
//             the receiver counts it once even if both copies land.
//   monitor   (monitor.cc) per-path throughput (rate_estimate.h: what
//             the scheduler plans with, and for how long), chunk completion
//             time, probe RTT; a path that holds chunks or control messages
//             without progress is judged by path_health.h (closed once the
//             network provably drops its bytes, at path_timeout at the
//             latest), and an idle one whose probe stays unanswered for
//             twice path_timeout while the peer answers elsewhere is closed;
//             a peer that answers nothing on any path for peer_timeout
//             while an operation waits on it fails (path_health.h).
//   hunting   (hunting.cc) a path that stays slow against its siblings is
//             re-opened on another core route.
//   connections (connections.cc) a pair connects at start-up or on first
//             use; what was sent meanwhile goes once its paths are up.
//   sharing   (shared_paths.cc) a subgroup sends on its parent group's
//             paths, on a channel of its own (channel_mux.h).
//
// Threads: transport threads deliver completions (CompletionSink); one
// collective thread drives write()/expect() and sleeps in waitEvent(), which
// wakes on every completion, arrival, control message and error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/rendezvous.h"
#include "multipath/control.h"
#include "multipath/path_stats.h"
#include "multipath/reassembler.h"
#include "multipath/transfer.h"
#include "transport/transport.h"

namespace maestro {
namespace multipath {

class EngineCore;

class Engine {
 public:
  // The group a new one is a subgroup of: its rank r is that group's rank
  // ranks[r]. Empty: none (the default group, or one on paths of its own).
  struct Parent {
    std::shared_ptr<Engine> engine;
    std::vector<int> ranks;
  };
  // Runs the QP manager: agrees on the config with every rank (Options
  // overrides + environment), then connects the ring neighbours' paths
  // (MAESTRO_CONNECT=eager: every rank's). `store` must outlive the engine:
  // any other pair connects through it when it is first used.
  // A subgroup (`parent` set) sends on the paths of the parent's process
  // group where every one of its ranks can (MAESTRO_SHARE_PATHS, the same
  // path knobs, a free channel): it opens none of its own.
  Engine(const std::map<std::string, std::string>& overrides, Rendezvous& store, int rank, int size,
         Deadline setup_deadline, const std::string& rendezvous_host = "", Parent parent = {});
  // The same, keeping the store for as long as the engine lives.
  Engine(const std::map<std::string, std::string>& overrides, std::shared_ptr<Rendezvous> store, int rank, int size,
         Deadline setup_deadline, const std::string& rendezvous_host = "", Parent parent = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's store (what its pairs connect through).
  Rendezvous& rendezvous() const;
  const Config& config() const;
  int paths() const;
  // Whether the group's ranks are on more than one host (or a rank's host
  // is unknown): the same answer on every rank.
  bool spansHosts() const;
  const std::string& transportName() const;
  transport::Transport& transport();
  // This group sends on paths another group opened (shared paths): its
  // channel on them; 0 where the paths are its own.
  uint32_t channel() const;
  // The knobs that shape paths (shared_paths.cc): a subgroup sends on its
  // parent's paths only where it sets none of them otherwise.
  static const std::vector<std::string>& pathKnobs();

  // ---- memory ----
  Region registerMemory(void* addr, size_t length);
  void deregisterMemory(const Region& r);
  uint64_t expose(const Region& r);
  void conceal(const Region& r);
  // An engine-owned registered buffer of at least `bytes` (grown on demand;
  // the returned region stays valid until the next call with the same slot).
  Region buffer(int slot, size_t bytes);
  // Bytes held in those buffers now.
  size_t bufferBytes() const;

  // ---- data ----
  // The operation now running on this rank. Chunks whose tag belongs to
  // another operation (late duplicates after a failover) are dropped before
  // they reach the reassembler. Tags carry the operation's epoch in their
  // top two bits (see collectives/op.h).
  // Also forgets what the epoch's tags saw in their previous use.
  void beginOperation(uint64_t seq);
  // `window` > 0: a path takes a chunk of this message only while it holds
  // fewer than that many (Sender::message); 0: the path's window. `cut`:
  // how the message is cut into chunks (decomposer.h); the receiver's
  // expect() must name the same.
  std::shared_ptr<SendOp> write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                uint64_t dst_offset, uint64_t length, uint32_t tag, int window = 0,
                                Cut cut = Cut::kDefault);
  std::shared_ptr<RecvOp> expect(int peer, uint32_t tag, uint64_t length, ChunkHook hook = nullptr,
                                 Cut cut = Cut::kDefault);
  void release(const std::shared_ptr<RecvOp>& op);

  // ---- control ----
  void sendControl(int peer, ControlType type, uint64_t seq, uint32_t sub, const void* payload = nullptr,
                   size_t length = 0);
  bool takeControl(int peer, ControlKey key, std::vector<uint8_t>* payload);
  // Tell every peer that operation `seq` failed here (best effort).
  void broadcastAbort(uint64_t seq, const std::string& reason);
  // An abort some rank sent for `seq`, if any (aborts are passed on, so it
  // reaches ranks the sender has no paths to).
  bool abortFor(uint64_t seq, std::string* reason) const;
  // Operation `seq` is finished: drop its leftover control messages.
  void retire(uint64_t seq);
  // Operation `seq` failed: its writes not yet posted are dropped, and this
  // returns once none still posted can read its buffers (the paths they are
  // stuck on are closed after `grace`), so the caller may hand the memory
  // back to the user.
  void cancelSends(uint64_t seq, const std::string& why, std::chrono::milliseconds grace);
  // Make the operation now running (and every later one) fail at once with
  // `why`: abort() of the process group. Idempotent; cannot be undone.
  void interrupt(const std::string& why);
  // The reason, if interrupt() was called.
  bool interrupted(std::string* why) const;
  // Operation `seq` failed here with `why` (broadcastAbort notes its own).
  // The goodbye at shutdown carries the latest such failure, so that a peer
  // that meets only this rank's departure -- the abort it relayed never
  // reached it, because the two were not connected yet -- still learns why.
  // The first failure of an operation is kept.
  void noteFailure(uint64_t seq, const std::string& why);

  // ---- point to point ----
  // Appends the point-to-point control messages that arrived since the last
  // call, in arrival order; false if there were none. They wait here (at
  // most kMaxInbox from one peer) until the point-to-point layer takes them.
  bool takeP2P(std::vector<P2PMessage>* out);
  // A tag from `peer` (released after its message) may carry a new message:
  // the sender confirmed no write on it is left. Point-to-point tags, and a
  // collective's tags reused within its operation (the ring beyond its tag
  // window).
  void recycleTag(int peer, uint32_t tag);

  // ---- connections ----
  // Start connecting to `peer` in the background if this rank has no paths
  // to it yet (the lower rank of the pair opens them; both must ask). Every
  // call that sends to a peer or waits on it asks by itself; a caller that
  // will only wait for a peer's first word (a receive) asks here. A pair
  // that cannot connect makes the peer unreachable, with the reason.
  void connect(int peer);
  // Paths to `peer` are up (it was connected at start-up or on demand).
  bool connected(int peer);
  // Wait until no control message of operation `seq` still waits for its
  // pair to connect (false at the deadline). An operation may finish on this
  // rank before its last message to a new pair left -- the peer's answer came
  // first -- and the process may then exit.
  bool awaitQueued(uint64_t seq, Deadline deadline);
  // An operation waits on `peer`'s word (its descriptor, its READY, its
  // data): +1 when it starts waiting, -1 when it stops. While any does, a
  // peer silent on every path for peer_timeout is failed (path_health.h:
  // judgePeer), whether or not anything to it is in flight.
  void awaiting(int peer, int delta);
  // Peers this rank has connected or is connecting to, in that order.
  std::vector<int> activePeers() const;

  // ---- progress ----
  uint64_t eventCount() const;
  // Wake every waitEvent() (new work was posted from outside the engine).
  void wake();
  // Sleep until something happens after `seen` (false at the deadline).
  bool waitEvent(uint64_t seen, Deadline deadline);
  // Sleep until done() holds, looked at after every event (false at the
  // deadline).
  bool waitUntil(const std::function<bool()>& done, Deadline deadline);
  // Throws if `peer` can no longer be reached (every path down).
  void checkPeer(int peer);
  // False once the peer is unreachable (checkPeer() would throw).
  bool reachable(int peer);

  // ---- introspection ----
  std::vector<PathStats> pathStats() const;
  // Completion times (post to ACK, seconds) of the most recent chunks, at
  // most kChunkSamples; `clear` starts a new sample.
  std::vector<double> chunkTimes(bool clear);
  static constexpr size_t kChunkSamples = 65536;
  std::string pathTable() const;  // human readable, for MAESTRO_DEBUG=INFO
  std::string describeSetup() const;

  // As the transport would deliver them (tests and fuzzers feed the engine
  // through these).
  void onMessage(int peer, int path, const uint8_t* data, size_t length);
  int inflightOn(int peer, int path);

 private:
  friend class EngineCore;
  const int rank_;
  const int size_;
  std::shared_ptr<EngineCore> core_;
};

}  // namespace multipath
}  // namespace maestro
