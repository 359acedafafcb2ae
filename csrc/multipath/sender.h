// The sender (paper §4.2-4.3), a component of the engine (engine_core.h):
// message() cuts a message into chunks (decomposer.h); send() has the load
// balancer (scheduler.h) give each chunk to a path's queue or to the peer's
// shared queue, and fills every path's window (at most `window` chunks in
// flight); post() hands a chunk to the transport, with the address of its
// ChunkDesc as the wr_id (the paper's Table 1 trick); a completion retires
// the chunk, or -- flushed or withdrawn from a failed path -- places it
// again on a live one (failover). fail() and cancel() take back what a
// failed peer or operation still has queued.
//
// It owns the send side of every peer: the messages being sent, the shared
// queue and the scheduler; and of every path: the chunks queued on it, the
// chunks in flight and on which connection, and what the path carried
// (bytes, chunks, resends, completion time, throughput: path_stats()).
// What it needs of the paths' health and of the transport it asks through
// SenderLinks, so it is tested alone (tests/cpp/test_sender.cc).
//
// Locking: the sender has no lock of its own for that state. Every call
// that names a peer is made with that peer's lock held (EngineCore::Peer::mu,
// which guards the peer's health too: one completion updates both, and the
// monitor reads both in one look); SenderLinks are called under that same
// lock and never take it. The sender's one lock, of the chunk time samples,
// is a leaf: taken alone or under a peer's lock, nothing is taken while it
// is held. So the one lock order is: a peer's lock, then the samples' lock;
// no call into the sender blocks or waits.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "multipath/decomposer.h"
#include "multipath/path_stats.h"
#include "multipath/rate_estimate.h"
#include "multipath/scheduler.h"
#include "multipath/transfer.h"
#include "transport/transport.h"

namespace maestro {
namespace multipath {

// What the sender asks of the engine around it; `path` is a path's index
// among the peer's paths. Called with the peer's lock held.
class SenderLinks {
 public:
  virtual ~SenderLinks() = default;
  // The peer's paths are installed; until then its chunks wait in the shared queue.
  virtual bool linked(int peer) const = 0;
  // The path may carry new chunks (up, and not set aside).
  virtual bool usable(int peer, int path) const = 0;
  // Its probe RTT, seconds (0: not measured yet).
  virtual double rtt(int peer, int path) const = 0;
  virtual void postWrite(int peer, int path, const transport::WriteRequest& req) = 0;
  // No path to the peer is up: it is unreachable (the engine then calls fail()).
  virtual void noPath(int peer, const std::string& why) = 0;
};

class Sender {
 public:
  // chunking[p]: how messages to peer p are cut (the receiver cuts them
  // alike). `samples`: how many chunk completion times chunkTimes() keeps.
  Sender(const Config& config, std::vector<Chunking> chunking, std::unique_ptr<SenderLinks> links, size_t samples);
  ~Sender();
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // ---- messages
  // The message cut into chunks, not yet placed (no lock: it reads no peer
  // state). An empty one is done already. `window` > 0: a path takes a
  // chunk of it only while it holds fewer than that many (of any message),
  // within its own window: a message whose chunks are better placed as
  // completions come back than all at once (the exchange's, tuner.h).
  // `cut`: how it is cut into chunks (decomposer.h; the receiver's expect()
  // names the same).
  std::shared_ptr<SendOp> message(int peer, const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                                  uint64_t dst_offset, uint64_t length, uint32_t tag, int window = 0,
                                  Cut cut = Cut::kDefault) const;
  // Its chunks placed and the windows filled; kept until it is finished.
  void send(const std::shared_ptr<SendOp>& op);

  // ---- paths
  // The peer's `paths` are installed: their progress counts from `now`.
  void install(int peer, size_t paths, Clock::time_point now);
  // The chunks that waited for the peer's paths are placed on them.
  void placeWaiting(int peer);
  // A new connection of the path: nothing of the old one is in flight any
  // more (its late completions are not counted); on another route
  // (`new_route`) its throughput is measured anew.
  void pathUp(int peer, int path, bool new_route, Clock::time_point now);
  // What waits on the path moves to its siblings.
  void requeue(int peer, int path);
  // Every path's window filled, the shared chunks spread.
  void pumpAll(int peer);

  // ---- completions
  struct Completed {
    int path;                 // the path it was posted on
    bool current;             // on the path's current connection
    Clock::time_point posted;
    Clock::time_point at;     // now
    // The chunk's message, kept alive until the completion is settled: the
    // engine's pathDown() in between may give the peer up (fail()), which
    // forgets a message with no chunk left posted -- the last reference,
    // once its caller has let it go.
    std::shared_ptr<SendOp> message;
  };
  // A write completed (ok) or was flushed: counted on its path and its
  // message. Then the engine updates the path's health, then calls settle().
  Completed completed(int peer, ChunkDesc* chunk, bool ok);
  // A flushed chunk is placed again (unless its message failed); the path
  // of an ok one pulls first. True: its message is finished and forgotten,
  // which may have freed the chunk.
  bool settle(int peer, ChunkDesc* chunk, int path, bool ok);
  // A write withdrawn from a path set aside (a fence): placed again, like a
  // flushed one. True: its (failed) message is finished and forgotten.
  bool withdrawn(int peer, ChunkDesc* chunk);

  // ---- failures
  // The peer failed: every message to it fails with `why`, nothing queued
  // stays; those with chunks still posted are kept until those complete.
  void fail(int peer, const std::string& why);
  // Operation `epoch` (seq mod 4) failed: its messages to the peer fail with
  // `why` and their queued chunks are dropped. False: it had none unfinished.
  bool cancel(int peer, uint32_t epoch, const std::string& why);
  // Messages of operation `epoch` with chunks still posted to the peer.
  size_t posted(int peer, uint32_t epoch) const;
  // The paths with chunks in flight, if a message of `epoch` still has
  // chunks posted to the peer (none otherwise).
  std::vector<int> holding(int peer, uint32_t epoch) const;

  // ---- what the monitor and the statistics read
  int inflight(int peer, int path) const;
  Clock::time_point lastProgress(int peer, int path) const;  // last completion, or the post that made it busy
  double throughput(int peer, int path) const;               // bytes/s while busy (rate_estimate.h)
  uint64_t bytesSent(int peer, int path) const;
  double busyRateSinceLastLook(int peer, int path, Clock::time_point now);  // path hunting's look
  bool sending(int peer) const;  // messages to it not finished
  bool waiting(int peer) const;  // chunks in its shared queue
  // The path's bytes_sent, chunks_sent, resent, throughput and completion_time.
  void stats(int peer, int path, PathStats* out) const;
  // The latest chunk completion times (seconds); `clear` starts a new sample.
  std::vector<double> chunkTimes(bool clear);

 private:
  struct Path {
    std::deque<ChunkDesc*> queue;  // assigned here, not yet posted
    int inflight = 0;
    // Connections the path has had. A chunk remembers the one it was posted
    // on, so a late flush from a replaced connection neither takes the new
    // one down (Completed::current) nor unbalances its in-flight count.
    uint32_t generation = 0;
    uint64_t bytes_sent = 0, chunks_sent = 0, resent = 0;
    Clock::time_point last_progress{};
    double completion = 0;  // EWMA seconds per chunk
    RateEstimate rate;      // throughput while busy
  };
  struct PeerSend {
    Chunking chunking;
    std::unique_ptr<Scheduler> scheduler;
    std::vector<Path> paths;
    std::deque<ChunkDesc*> shared;  // kAnyPath chunks: the scheduler's pull() picks the path that takes each
    std::unordered_map<SendOp*, std::shared_ptr<SendOp>> sending;
  };

  // `placing`: the message whose chunk the scheduler places next;
  // `window`: the room a path has for it (windowFor).
  std::vector<PathView> views(int peer, const SendOp* placing, int window) const;
  // The chunks a path may hold when it takes one of `op`'s.
  int windowFor(const SendOp* op) const { return op->window_ > 0 ? std::min(window_, op->window_) : window_; }
  void enqueue(int peer, ChunkDesc* chunk);
  void pump(int peer, int path, bool pull = true);  // fill one path's window
  void post(int peer, int path, ChunkDesc* chunk);
  void sample(double seconds);

  const int window_;
  const std::vector<double> weights_;
  const std::unique_ptr<SenderLinks> links_;
  std::vector<PeerSend> peers_;

  std::mutex samples_mu_;  // a leaf (see Locking)
  const size_t samples_;
  std::vector<double> chunk_samples_;  // ring buffer of chunk completion times
  size_t chunk_sample_next_ = 0;
};

}  // namespace multipath
}  // namespace maestro
