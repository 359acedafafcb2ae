// The engine's implementation behind the Engine facade (engine.h): one
// class whose methods are defined by concept in engine.cc (set-up, shutdown,
// buffers, progress), receiver.cc, control.cc, failover.cc, monitor.cc,
// hunting.cc, connections.cc, shared_paths.cc and path_stats.cc, and a
// component it holds: the sender (sender.h, held as sender_), which owns
// the send side of every peer and path; sender.cc defines it and the core's
// methods about sending. This header does not include sender.h, so that a
// change to the sender recompiles only the files that call it (sender.cc,
// failover.cc, monitor.cc, path_stats.cc, connections.cc); the others reach
// it through pumpAll(), requeue() and inflight(). Internal: only the
// engine's files (and engine_state.h) include it.
//
// Locking: each peer's state, its health and its send side alike, is
// guarded by its Peer::mu (engine_state.h); the sender keeps no lock of its
// own for its share (sender.h). One order: channels_mu_ (the monitor ticks
// the groups on its paths under it), then one peer's mu -- never two
// peers' at once -- then the short locks taken under it: monitor_mu_,
// active_mu_, connecting_mu_, the owner's reconnect_mu_, event_mu_
// (notify()), the sender's samples lock and the transport's own. None of
// those is held while a peer's mu is taken.
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
#include "multipath/engine.h"
#include "multipath/hunter.h"
#include "multipath/metrics.h"
#include "multipath/qp_manager.h"
#include "multipath/reassembler.h"
#include "transport/transport.h"

namespace maestro {
namespace multipath {

struct BusyPath;
class Sender;

class EngineCore : public ChannelSink {
 public:
  using Parent = Engine::Parent;
  // See Engine's constructors. `store_owner` (may be null) keeps the store
  // alive as long as the core.
  EngineCore(const std::map<std::string, std::string>& overrides, Rendezvous& store, int rank, int size,
             Deadline setup_deadline, const std::string& rendezvous_host, Parent parent,
             std::shared_ptr<Rendezvous> store_owner);
  ~EngineCore() override;

  // What the facade forwards (engine.h says what each does).
  int rank() const { return rank_; }
  int size() const { return size_; }
  Rendezvous& rendezvous() const { return qp_->store(); }
  const Config& config() const { return config_; }
  int paths() const { return mesh_.paths; }
  bool spansHosts() const;
  const std::string& transportName() const { return mesh_.transport_kind; }
  transport::Transport& transport() { return *mesh_.transport; }
  uint32_t channel() const { return channel_; }

  Region registerMemory(void* addr, size_t length) { return mesh_.transport->registerMemory(addr, length); }
  void deregisterMemory(const Region& r) { mesh_.transport->deregisterMemory(r); }
  uint64_t expose(const Region& r) { return mesh_.transport->expose(r); }
  void conceal(const Region& r) { mesh_.transport->conceal(r); }
  Region buffer(int slot, size_t bytes);
  size_t bufferBytes() const;

  void beginOperation(uint64_t seq);
  std::shared_ptr<SendOp> write(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                uint64_t dst_offset, uint64_t length, uint32_t tag, int window = 0,
                                Cut cut = Cut::kDefault);
  std::shared_ptr<RecvOp> expect(int peer, uint32_t tag, uint64_t length, ChunkHook hook = nullptr,
                                 Cut cut = Cut::kDefault);
  void release(const std::shared_ptr<RecvOp>& op);

  void sendControl(int peer, ControlType type, uint64_t seq, uint32_t sub, const void* payload = nullptr,
                   size_t length = 0);
  bool takeControl(int peer, ControlKey key, std::vector<uint8_t>* payload);
  void broadcastAbort(uint64_t seq, const std::string& reason);
  bool abortFor(uint64_t seq, std::string* reason) const;
  void retire(uint64_t seq);
  void cancelSends(uint64_t seq, const std::string& why, std::chrono::milliseconds grace);
  void interrupt(const std::string& why);
  bool interrupted(std::string* why) const;
  void noteFailure(uint64_t seq, const std::string& why);

  bool takeP2P(std::vector<P2PMessage>* out);
  void recycleTag(int peer, uint32_t tag);

  void connect(int peer);
  bool connected(int peer);
  void awaiting(int peer, int delta);
  bool awaitQueued(uint64_t seq, Deadline deadline);
  std::vector<int> activePeers() const;

  uint64_t eventCount() const { return events_.load(); }
  void wake() { notify(); }
  bool waitEvent(uint64_t seen, Deadline deadline);
  bool waitUntil(const std::function<bool()>& done, Deadline deadline);
  void checkPeer(int peer);
  bool reachable(int peer);

  std::vector<PathStats> pathStats() const;
  std::vector<double> chunkTimes(bool clear);
  static constexpr size_t kChunkSamples = Engine::kChunkSamples;
  std::string pathTable() const;  // human readable, for MAESTRO_DEBUG=INFO
  std::string describeSetup() const;

  // CompletionSink
  void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) override;
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override;
  bool landedAlready(int peer, uint32_t imm) override;
  void onMessage(int peer, int path, const uint8_t* data, size_t length) override;
  void onPathError(int peer, int path, const std::string& what) override;
  void onPathFenced(int peer, int path, uint64_t mark) override;
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
  // The sender's verbs for the files that need no more of it (sender.cc).
  void pumpAll(Peer& peer);                   // peer.mu held: every path's window filled, shared chunks spread
  void requeue(Peer& peer, int slot);         // peer.mu held: what waits on the path moves to its siblings
  int inflight(const Peer& peer, int slot) const;  // peer.mu held: chunks in flight on the path
  class SendLinks;  // what the sender asks of the core (sender.cc)
  void startSender();  // settle(): once the peers' chunking is known
  void markUnreachable(Peer& peer, const std::string& why);  // peer.mu held
  int controlPath(const Peer& peer) const;         // peer.mu held
  static int slotOf(const Peer& peer, int transport_path);  // peer.mu held; -1 if not a path of ours
  void pathDown(Peer& peer, int slot, const std::string& what);  // peer.mu held
  void doubt(Peer& peer, int slot, const std::string& why);        // peer.mu held: set aside and probed
  void fence(Peer& peer, int slot);          // peer.mu held: what is in flight on it moves too, if it can
  void sendFence(Peer& peer, const PathSlot& via, int fenced, uint64_t mark);  // peer.mu held
  // peer.mu held: the fence of `fenced` up to `mark` on every other path up
  void sendFenceElsewhere(Peer& peer, const PathSlot& fenced, uint64_t mark);
  double doubtWindow(const PathSlot& slot) const;                  // how long a doubted path may take to answer
  void sendPing(int peer, int id);                                 // an RTT probe on transport path `id`
  void resendUnconfirmed(Peer& peer, PathSlot& slot);              // peer.mu held
  void monitorLoop();
  bool monitorTick();  // one look at every active peer's paths; true: chunks are in flight
  // resumed: this process was stopped since the last look (monitorTick).
  bool monitorPeer(int peer, Clock::time_point now, bool probe, bool resumed);
  struct Look;                                              // monitor.cc: what one look decided
  void huntLook(Peer& peer, Look& look);                     // peer.mu held
  void pathsLook(Peer& peer, int rank, bool probe, Look& look);  // peer.mu held
  void silenceLook(Peer& peer, int rank, Look& look);        // peer.mu held
  void judgeStalled(Peer& peer, int rank, Look& look);
  void act(int peer, const Look& look);
  BusyPath busyPath(const Peer& peer, int slot, Clock::time_point now) const;  // peer.mu held
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
  // The transport's route control, which every step of a hunt uses (runHunt
  // checks that there is one first).
  transport::RouteControl& routes();
  std::vector<uint16_t> reservePorts(int peer, int id);
  // Give back the reserved `ports`, except those in `keep`.
  void releasePorts(int peer, int id, const std::vector<uint16_t>& ports, const std::vector<uint16_t>& keep = {});
  // The control channel: each message type's handler, registered by its
  // protocol's file; true wakes the waiters (waitEvent()).
  struct ControlIn {
    int peer, path;
    ControlType type;
    uint64_t seq;
    uint32_t sub;
    const uint8_t* body;
    size_t length;
  };
  using ControlHandler = bool (EngineCore::*)(Peer& peer, const ControlIn& message);
  void registerControl(ControlType type, ControlHandler handler);
  void registerOperationControl();  // control.cc: descriptors, credits, barrier tokens, aborts, point to point
  void registerHealthControl();     // failover.cc: probes, path-down notices, fences, goodbyes
  void registerHuntingControl();    // hunting.cc
  bool onOperationMessage(Peer& peer, const ControlIn& message);
  bool onAbort(Peer& peer, const ControlIn& message);
  bool onP2PMessage(Peer& peer, const ControlIn& message);
  bool onPing(Peer& peer, const ControlIn& message);
  bool onPong(Peer& peer, const ControlIn& message);
  bool onPathDownNotice(Peer& peer, const ControlIn& message);
  bool onFence(Peer& peer, const ControlIn& message);
  bool onBye(Peer& peer, const ControlIn& message);
  bool onHuntNotice(Peer& peer, const ControlIn& message);
  bool onHuntMessage(Peer& peer, const ControlIn& message);
  ControlHandler control_handlers_[256] = {};
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
  std::shared_ptr<EngineCore> owner_;
  // owner_'s facade, kept alive with it: the process's later subgroups find
  // the owning group through a weak reference to its Engine (c10d).
  std::shared_ptr<Engine> owner_engine_;
  uint32_t channel_ = 0;
  std::vector<int> ranks_;
  std::unique_ptr<QpManager> qp_;
  Mesh mesh_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // The send side of every peer (guarded by each peer's mu). Destroyed
  // through sender.cc, so that engine.cc need not include sender.h.
  struct SenderDeleter {
    void operator()(Sender* sender) const;
  };
  std::unique_ptr<Sender, SenderDeleter> sender_;
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
  std::vector<EngineCore*> channels_;
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

}  // namespace multipath
}  // namespace maestro
