// The multipath engine of one process group: the paper's multi-path
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

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/rendezvous.h"
#include "multipath/channel_mux.h"
#include "multipath/hunter.h"
#include "multipath/metrics.h"
#include "multipath/qp_manager.h"
#include "multipath/reassembler.h"
#include "multipath/scheduler.h"
#include "transport/transport.h"

namespace maestro {
namespace multipath {

enum class ControlType : uint8_t {
  kDesc = 1, kCredit = 2, kAbort = 3, kBarrier = 4, kPing = 5, kPong = 6, kBye = 7,
  kPathDown = 8,  // "your path <sub> to me is dead": verified by a probe, then closed (its opener reconnects)
  // Point to point (collectives/p2p.h); seq is the sender's message number
  // towards this receiver, not an operation.
  kP2PReady = 9,   // sender -> receiver: message <seq> with user tag <sub> and its size is waiting
  kP2PGrant = 10,  // receiver -> sender: write message <seq> here, on these engine tags (or: refused)
  kP2PDone = 11,   // sender -> receiver: message <seq>'s writes are over (or: it was cancelled)
  // Path hunting (multipath/hunter.h); sub is the transport path id.
  kHunt = 12,       // opener -> acceptor: path <sub> is being re-opened on another route (drain it)
  kHuntAsk = 13,    // acceptor -> opener: path <sub> is slow towards you: offer me source ports
  kHuntOffer = 14,  // opener -> acceptor: candidate source ports (uint16 each), reserved for a while
  kHuntPick = 15,   // acceptor -> opener: re-open from this port (uint16; 0: none goes elsewhere)
  // "I took back my writes on path <sub> up to mark <seq> and send them again
  // elsewhere: drop the rest of them" (Transport::withdrawWrites()).
  kFence = 16,
};

// A point-to-point control message as it arrived.
struct P2PMessage {
  int peer = -1;
  ControlType type = ControlType::kP2PReady;
  uint64_t seq = 0;
  uint32_t sub = 0;
  std::vector<uint8_t> body;
};

struct ControlKey {
  ControlType type;
  uint64_t seq;
  uint32_t sub;
  bool operator<(const ControlKey& o) const {
    return std::tie(type, seq, sub) < std::tie(o.type, o.seq, o.sub);
  }
};

struct PathStats {
  int peer = -1;
  int path = -1;
  std::string state;        // up | suspect | down
  std::string description;  // local -> remote addresses
  std::string last_error;
  std::string route;        // core hop found by discovery ("" if not probed)
  uint64_t reconnects = 0;
  uint64_t hunts = 0;       // re-opened on another route by path hunting
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t chunks_sent = 0, chunks_received = 0;
  uint64_t errors = 0, resent = 0;
  double throughput = 0;       // bytes/s while busy (EWMA)
  double completion_time = 0;  // seconds per chunk, post to ACK (EWMA)
  double rtt = 0;              // probe round trip, seconds (EWMA)
  // The NIC's congestion and loss counters (verbs: CNPs, ECN marks,
  // retransmissions), device-wide; empty where the device exposes none.
  std::map<std::string, uint64_t> nic_counters;
  // The path's own connection (TCP: TCP_INFO's bytes sent and retransmitted,
  // since the current connection opened) and its congestion control.
  std::string congestion;
  std::map<std::string, uint64_t> path_counters;
  // Share of the bytes sent that the transport retransmitted; -1 if unknown.
  double retransmitted() const;
};

class SendOp;
struct ChunkDesc;
struct BusyPath;

class RecvOp {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  uint64_t length() const { return length_; }

 private:
  friend class Engine;
  int peer_ = -1;
  uint32_t tag_ = 0;
  uint64_t length_ = 0;
  std::atomic<bool> done_{false};
  int hooks_running_ = 0;  // chunk hooks in progress (peer.mu)
};

class Engine : public ChannelSink {
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
         Deadline setup_deadline, const std::string& rendezvous_host = "", Parent parent = {})
      : Engine(overrides, *store, rank, size, setup_deadline, rendezvous_host, std::move(parent)) {
    store_owner_ = std::move(store);
  }
  ~Engine() override;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's store (what its pairs connect through).
  Rendezvous& rendezvous() const { return qp_->store(); }
  const Config& config() const { return config_; }
  int paths() const { return mesh_.paths; }
  const std::string& transportName() const { return mesh_.transport_kind; }
  transport::Transport& transport() { return *mesh_.transport; }
  // This group sends on paths another group opened (shared paths): its
  // channel on them; 0 where the paths are its own.
  uint32_t channel() const { return channel_; }

  // ---- memory ----
  Region registerMemory(void* addr, size_t length) { return mesh_.transport->registerMemory(addr, length); }
  void deregisterMemory(const Region& r) { mesh_.transport->deregisterMemory(r); }
  uint64_t expose(const Region& r) { return mesh_.transport->expose(r); }
  void conceal(const Region& r) { mesh_.transport->conceal(r); }
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
  std::shared_ptr<SendOp> write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                uint64_t dst_offset, uint64_t length, uint32_t tag);
  std::shared_ptr<RecvOp> expect(int peer, uint32_t tag, uint64_t length, ChunkHook hook = nullptr);
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
  // Peers this rank has connected or is connecting to, in that order.
  std::vector<int> activePeers() const;

  // ---- progress ----
  uint64_t eventCount() const { return events_.load(); }
  // Wake every waitEvent() (new work was posted from outside the engine).
  void wake() { notify(); }
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

  // CompletionSink
  void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) override;
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override;
  void onMessage(int peer, int path, const uint8_t* data, size_t length) override;
  void onPathError(int peer, int path, const std::string& what) override;
  void onPathUp(int peer, int path) override;
  void onWriteWithdrawn(int peer, int path, uint64_t wr_id) override;
  // ChannelSink
  void onPairUp(int peer) override;
  void onPairFailed(int peer, const std::string& why) override;
  void onPathMoving(int peer, int path, bool moving, const std::string& route) override;
  int inflightOn(int peer, int path) override;

 private:
  struct PathSlot;
  struct Peer;

  void notify();
  void pump(Peer& peer, int path, bool pull = true);  // peer.mu held: fill one path's window
  void pumpAll(Peer& peer);                            // peer.mu held: every path, shared chunks spread
  void post(Peer& peer, int path, ChunkDesc* c);       // peer.mu held
  void enqueue(Peer& peer, ChunkDesc* chunk);      // peer.mu held
  std::vector<PathView> views(const Peer& peer) const;  // peer.mu held
  void failSends(Peer& peer, const std::string& why);    // peer.mu held
  void markUnreachable(Peer& peer, const std::string& why);  // peer.mu held
  int controlPath(const Peer& peer) const;         // peer.mu held
  static int slotOf(const Peer& peer, int transport_path);  // peer.mu held; -1 if not a path of ours
  void pathDown(Peer& peer, int slot, const std::string& what);  // peer.mu held
  void doubt(Peer& peer, int slot, const std::string& why);        // peer.mu held: set aside and probed
  void requeue(Peer& peer, PathSlot& slot);  // peer.mu held: what waits on the path moves to its siblings
  void fence(Peer& peer, int slot);          // peer.mu held: what is in flight on it moves too, if it can
  void sendFence(Peer& peer, const PathSlot& via, const PathSlot& fenced);  // peer.mu held
  double doubtWindow(const PathSlot& slot) const;                  // how long a doubted path may take to answer
  void sendPing(int peer, int id);                                 // an RTT probe on transport path `id`
  void resendUnconfirmed(Peer& peer, PathSlot& slot);              // peer.mu held
  void monitorLoop();
  bool monitorTick();  // one look at every active peer's paths; true: chunks are in flight
  // resumed: this process was stopped since the last look (monitorTick).
  bool monitorPeer(int peer, Clock::time_point now, bool probe, bool resumed);
  BusyPath busyPath(const Peer& peer, const PathSlot& slot, Clock::time_point now) const;  // peer.mu held
  void reconnectLoop();
  void reconnectPath(int peer, int transport_path, Clock::time_point until);
  // Path hunting, on the reconnect thread (probes and connects block).
  struct HuntJob {
    enum Kind { kSlow, kAsked, kOffered, kPicked } kind;
    int peer, id;                 // transport path id
    std::vector<uint16_t> ports;  // kOffered: the opener's candidates; kPicked: the one chosen
  };
  void queueHunt(HuntJob job);
  void runHunt(const HuntJob& job);
  // Whether path `id` to `peer` is being re-opened, or was less than
  // hunt_interval ago: another hunter's verdict on it is then not acted on.
  bool movedLately(int peer, int id);
  // The opener: drain path `id`, re-open it from `port` (0: any new one).
  void reopenPath(int peer, int id, uint16_t port, const std::string& route);
  // Probe each candidate's route: ours towards the peer (the opener's
  // direction) or the peer's port towards our listener (the acceptor's).
  std::vector<std::string> probeCandidates(int peer, int id, const std::vector<uint16_t>& ports, bool opener);
  // The core hops of the peer's other paths, and (own_too) of this one.
  std::vector<std::string> otherRoutes(int peer, int id, bool own_too = true);
  std::vector<uint16_t> reservePorts(int peer, int id);
  // Give back the reserved `ports`, except those in `keep`.
  void releasePorts(int peer, int id, const std::vector<uint16_t>& ports, const std::vector<uint16_t>& keep = {});
  struct SentControl;
  void postControl(Peer& peer, std::vector<uint8_t> msg, bool reliable);  // peer.mu held
  // Send abort `seq` (first raised by rank `origin`) to every active peer
  // but `from`.
  void relayAbort(uint64_t seq, uint32_t origin, const std::string& reason, int from);
  void activate(Peer& peer);                               // peer.mu held: kNone -> kConnecting, in activePeers()
  void connectLocked(Peer& peer);                          // peer.mu held: connect() (no-op once started)
  void install(int peer, const PeerPaths& paths);          // the pair is connected: its paths carry traffic
  void installLocked(Peer& p, const PeerPaths& paths);     // peer.mu held
  // Set-up on the parent's paths, if every rank of the group can; false:
  // the group opens its own.
  bool shareWith(Parent parent, Deadline setup_deadline);
  void joinChannel(Deadline setup_deadline);  // shareWith, once attached: start-up pairs
  // Once the mesh is known (the transport, the path count, discovery): the
  // knobs' auto values, the hunter and every peer's state. Both ways of
  // making an engine (owner, shareWith) end their set-up here.
  void settle();
  // How messages to and from `peer` are cut (both sides agree): a peer on
  // this host and network namespace gets no mid-size spread, since its
  // paths share one memory bus and smaller chunks only cost more work.
  Chunking chunkingFor(int peer) const;
  // Shared paths, the owner's side: the pair towards transport peer
  // `peer` as a group on a channel should install it (false: not connected).
  bool pairPaths(int peer, PeerPaths* out);
  // A group on a channel needs the pair to `peer` (the owner's rank): the
  // owner connects it (on its reconnect thread) and tells the channels.
  void requestPair(int peer);
  void servePairRequests();  // the reconnect thread
  void connectInBackground(int peer);                      // a connecting thread's body
  void reapConnecting(bool all);                           // join connecting threads that finished (all: every one)

  const int rank_;
  const int size_;
  Config config_;
  std::shared_ptr<Rendezvous> store_owner_;  // may be null: the caller keeps the store
  // The paths' demultiplexer (the owner's). A group on shared paths keeps
  // the owning engine alive, and its channel there; ranks_[r] is the
  // owner's rank of its rank r.
  std::shared_ptr<ChannelMux> mux_;
  std::shared_ptr<Engine> owner_;
  uint32_t channel_ = 0;
  std::vector<int> ranks_;
  std::unique_ptr<QpManager> qp_;
  Mesh mesh_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // How long a pair connected on demand waits for its peer: the group's
  // timeout, as the set-up had.
  Clock::duration connect_wait_{};
  mutable std::mutex active_mu_;
  std::vector<int> active_;  // activePeers()
  struct Connecting {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::mutex connecting_mu_;
  std::vector<Connecting> connecting_;  // one thread per pair being connected on demand

  std::atomic<uint64_t> events_{0};
  std::atomic<int> waiters_{0};
  std::mutex event_mu_;
  std::condition_variable event_cv_;

  mutable std::mutex abort_mu_;
  std::map<uint64_t, std::string> aborts_;
  std::string interrupted_;  // abort_mu_; "" while not interrupted
  uint64_t failure_seq_ = 0;  // abort_mu_; noteFailure()'s, sent with the goodbye
  std::string failure_;
  std::atomic<uint64_t> retired_{0};

  struct Buffer {
    Region region;
    void* memory = nullptr;
    size_t wanted = 0;  // the most any operation asked of it since the last trim
  };
  mutable std::mutex buffers_mu_;
  std::map<int, Buffer> buffers_;
  uint64_t ops_since_trim_ = 0;
  // After every kTrimEvery operations: a buffer more than 4x (and 1 MiB)
  // larger than any of them needed is freed (one large all_gather does not
  // keep its size pinned for the life of the group).
  void trimBuffers();
  void freeBuffer(const Buffer& b);

  std::mutex p2p_mu_;
  std::deque<P2PMessage> p2p_inbox_;
  std::vector<size_t> p2p_waiting_;  // per peer, in p2p_inbox_

  std::mutex samples_mu_;
  std::vector<double> chunk_samples_;  // ring buffer of chunk completion times
  size_t chunk_sample_next_ = 0;
  std::atomic<uint32_t> current_epoch_{0};
  std::atomic<bool> stopping_{false};
  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  std::vector<std::pair<int, int>> down_notices_;  // (peer, transport path) to report, monitor_mu_
  std::thread monitor_;
  Clock::time_point last_probe_ = Clock::now();  // the monitor's last probe round
  Clock::time_point last_look_{};                // the monitor's last tick
  std::unique_ptr<MetricsFile> metrics_;  // MAESTRO_METRICS: the monitor's thread only, then the destructor
  // Groups on this engine's paths (shared paths): its monitor thread ticks
  // theirs too, so a subgroup costs no monitor thread of its own.
  std::mutex channels_mu_;
  std::vector<Engine*> channels_;
  std::mutex reconnect_mu_;
  std::condition_variable reconnect_cv_;
  std::set<std::pair<int, int>> reconnect_wanted_;  // (peer, transport path) to reopen, reconnect_mu_
  std::set<int> pair_requests_;                       // peers groups on channels asked for, reconnect_mu_
  std::deque<HuntJob> hunt_jobs_;                     // reconnect_mu_
  // The opener's ports offered to an acceptor, by (peer, transport path),
  // with when (released if no pick comes). Reconnect thread only.
  struct Offer {
    std::vector<uint16_t> ports;
    std::map<uint16_t, std::string> route;  // our direction's core hop of each
    Clock::time_point at;
  };
  std::map<std::pair<int, int>, Offer> offers_;
  Hunter hunter_;
  std::thread reconnector_;
};

// The Decomposer's unit of work: one chunk of one message (paper Table 1:
// WR id, VP id, message id, chunk id).
struct ChunkDesc {
  SendOp* op = nullptr;
  uint32_t index = 0;   // chunk id
  int path = -1;        // virtual path it is posted to
  uint32_t generation = 0;  // which connection of that path
  uint64_t offset = 0;  // within the message
  uint64_t length = 0;
  int attempts = 0;
  Clock::time_point posted{};
};

class SendOp {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  const std::string& error() const { return error_; }  // valid once failed()
  uint64_t length() const { return length_; }

 private:
  friend class Engine;
  int peer_ = -1;
  uint32_t tag_ = 0;
  uint64_t length_ = 0;
  Region src_;
  const uint8_t* src_addr_ = nullptr;
  RemoteRegion dst_;
  uint64_t dst_offset_ = 0;
  std::vector<ChunkDesc> chunks_;
  uint32_t remaining_ = 0;    // chunks not yet landed (peer.mu)
  uint32_t outstanding_ = 0;  // chunks posted and not yet completed (peer.mu)
  std::string error_;
  std::atomic<bool> done_{false};
  std::atomic<bool> failed_{false};
};

}  // namespace multipath
}  // namespace maestro
