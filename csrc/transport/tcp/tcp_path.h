// One TCP path: a connected, non-blocking socket between a local vNIC and a
// peer's vNIC, driven by the process's event loop (event_loop.h) -- no
// thread of its own. Incoming WRITE payloads land directly in registered
// memory (no staging copy), read as far as the socket has them and resumed
// on the next readiness event. Outgoing frames leave inline from the
// posting thread while the socket takes them; the rest on EPOLLOUT.
//
// Completions follow RC semantics: a write completes when the peer ACKs it
// (its bytes are in the peer's memory), in posting order. When the path
// fails, onPathFenced (its mark: the peer drops what still arrives of the
// connection) and onPathError are raised once, and every write that was not
// ACKed completes with ok=false -- including writes posted later -- so the
// layer above can resend them elsewhere.
//
// With single copy (same_host.h), each side offers itself at start(); once
// the peer accepts, writes go by reference and the peer copies their
// payloads out of this process's memory.
//
// The sink is never called from inside postWrite()/postSend() (their caller
// may hold its own locks): completions that arise there -- a write posted to
// a failed path, a send that hit a dead socket -- are handed to the loop.
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstdint>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/event_loop.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/same_host.h"
#include "transport/transport.h"

namespace maestro {
namespace transport {
namespace tcp {

class TcpPath : public EventLoop::Handler, public std::enable_shared_from_this<TcpPath> {
 public:
  TcpPath(int fd, int peer, int path, std::string description, CompletionSink* sink, RegionTable* regions,
          EventLoop* loop, bool single_copy = false, uint64_t connection = 0);
  ~TcpPath() override;
  TcpPath(const TcpPath&) = delete;
  TcpPath& operator=(const TcpPath&) = delete;

  // Register with the loop (after construction: it hands out shared_from_this).
  void start();
  void postWrite(const WriteRequest& req);
  void postSend(const void* data, size_t length);
  void close(const std::string& why);
  // Stop without raising completions (transport shutdown): queued control
  // messages (a goodbye) get a brief chance to leave first.
  void stop();

  bool failed() const;
  // Failed, and every write it held has been completed (flushed).
  bool settled() const;
  const std::string& description() const { return description_; }
  // TCP_INFO's byte counts of this connection and its congestion control,
  // and the bytes it sent by reference (single copy).
  PathCounters counters() const;
  // The path's writes dropped by fences so far count on in the connection
  // that replaces this one (the path's count, not the connection's: the
  // drops of a connection that was found dead later are not lost).
  void inheritFenceDrops(const TcpPath& old) { rx_fenced_drops_.store(old.rx_fenced_drops_.load()); }
  // What TCP_INFO says of delivery: unacknowledged segments, time since the
  // last ACK and the last send, RTT, unanswered retransmission timeouts.
  PathDelivery delivery() const;
  // The region is being closed while a payload is landing in it (its sender
  // stopped mid-payload): drop the grant and drain the rest. Any thread.
  void revoke(uint32_t region);
  // A fence, sender side: take back every write not yet acknowledged (each
  // completes once, as withdrawn, on the loop; never otherwise) and queue a
  // MARK behind them. Returns the mark, or 0 if the path failed (its writes
  // are flushed instead).
  uint64_t withdraw();
  // A fence, receiver side: drop the peer's WRITEs here (read and ACKed,
  // never written) until a MARK of at least `mark` is read, a payload
  // landing now included. Any thread (the loop does it; another waits for
  // it: it must not hold what the loop's calls take).
  void dropUntil(uint64_t mark);

  // EventLoop::Handler (loop thread)
  void onEvents(uint32_t events) override;

 private:
  // A WRITE on the wire, not yet ACKed; a withdrawn one was completed
  // already and its ACK completes nothing.
  struct Unacked {
    uint64_t wr_id = 0;
    bool withdrawn = false;
  };
  struct Outgoing {
    FrameHeader header;
    const void* payload = nullptr;      // WRITE: registered memory
    uint64_t reference = 0;             // WRITE by reference: the payload's address, sent instead
    std::vector<uint8_t> owned;         // SEND: a copy of the message
    uint64_t wr_id = 0;
    bool is_write = false;
  };
  // What the receive side is in the middle of (loop thread only).
  enum class Rx { kHeader, kPayload, kDrain, kMessage, kReference };

  // Send what the socket takes, mu_ held. Returns the error that ended the
  // connection ("" while it is fine); never calls the sink.
  std::string pushLocked();
  void receive();                   // loop thread: read until the socket is empty or a budget is spent
  bool finishFrame(std::string* error);  // loop thread: a header or payload is complete
  void handleAck(uint64_t writes_received);
  // Queue a control frame (SEND, OFFER, ACCEPT) ahead of the writes.
  void postControl(const FrameHeader& header, const void* data, size_t length);
  void handleOffer();               // loop thread: the peer's OFFER is in rx_message_
  // loop thread: a by-reference write's address has arrived; copy it in.
  bool finishReference(std::string* error);
  void markDead();
  void countLanded();               // loop thread: a WRITE frame is done with (the ACK counts it)                  // our liveness word: this connection's writes may not be read
  void fail(const std::string& why);
  void failLater(const std::string& why);  // from a thread that may hold the caller's locks
  void failSending(const std::string& why);  // loop thread: a send failed; read what came before failing
  void completeLater();                    // complete late_ on the loop thread
  bool dropping() const { return rx_marks_ < rx_drop_until_; }
  void resetReceive();                     // loop thread: drop a half-read frame and its grant
  void releaseGrant();                     // loop thread: the destination region is no longer pinned
  void dropGrant(uint64_t grant);          // loop thread: revoke()'s work, for that grant (rx_grant_id_)
  void deliverFlush(std::vector<uint64_t>& wr_ids);

  const int fd_;
  const uint64_t connection_;  // the hello's number for it (fence marks)
  const int peer_;
  const int path_;
  const std::string description_;
  CompletionSink* const sink_;
  RegionTable* const regions_;
  EventLoop* const loop_;
  uint64_t loop_id_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Outgoing> control_;       // SENDs, sent ahead of queued writes
  std::deque<Outgoing> queue_;         // writes not yet on the wire
  std::deque<Unacked> unacked_;        // WRITEs on the wire (or in batch_), oldest first
  std::vector<Outgoing> batch_;        // frames being sent, in iov_ from iov_next_
  std::vector<iovec> iov_;
  size_t iov_next_ = 0;
  FrameHeader ack_;                    // the ACK frame inside batch_, if any
  bool want_write_ = false;            // EPOLLOUT requested
  // Writes to complete on the loop: flushed (ok=false: posted to a failed
  // path) or withdrawn (withdraw()); a loop task will deliver them.
  struct Late {
    uint64_t wr_id = 0;
    bool withdrawn = false;
  };
  std::vector<Late> late_;
  bool late_scheduled_ = false;
  uint16_t fences_ = 0;                // withdraw()s so far (the low bits of the marks)
  uint64_t writes_acked_ = 0;          // ACKs processed (sender side)
  uint64_t writes_received_ = 0;       // WRITE frames landed (receiver side)
  uint64_t acks_sent_ = 0;             // last cumulative count we ACKed
  bool failed_ = false;
  bool error_raised_ = false;          // onPathError has returned (or was skipped at shutdown)
  bool stopping_ = false;
  // Single copy, sender side: our liveness word (null: single copy off) and
  // whether the peer accepted our offer.
  std::atomic<uint64_t>* const alive_;
  bool by_reference_ = false;
  uint64_t reference_bytes_ = 0;       // payload bytes sent by reference

  // Receive state: the loop thread's alone.
  Rx rx_ = Rx::kHeader;
  FrameHeader rx_header_;
  size_t rx_have_ = 0;                 // header bytes read
  uint64_t rx_left_ = 0;               // payload bytes still to read
  uint8_t* rx_dst_ = nullptr;          // where they go (kPayload, kMessage)
  RegionTable::Grant rx_grant_;        // kPayload, kReference: pins the destination region
  // Which grant rx_grant_ is: its serial number << 32 | its region id (0:
  // none); read by revoke() on any thread. A revoke names the grant it was
  // meant for, not just the region: by the time the loop runs it, that write
  // may be over and a later one, after the region was exposed again, be
  // landing there.
  std::atomic<uint64_t> rx_grant_id_{0};
  uint32_t rx_grants_ = 0;             // grants taken (the serial numbers)
  std::vector<uint8_t> rx_message_;    // kMessage
  bool rx_landed_ = false;             // a WRITE landed in this receive(): ACK it
  // Single copy, receiver side.
  same_host::Offer peer_offer_;        // the peer's offer once it checked out (pid 0 until then)
  uint64_t rx_reference_ = 0;          // kReference: the payload's address in the peer
  size_t rx_copied_ = 0;               // bytes copied by reference in this receive() (its budget)
  // Fences, receiver side: the highest MARK read here, and the highest mark
  // the peer told of (dropUntil()); WRITEs are dropped while the first is
  // below the second.
  uint64_t rx_marks_ = 0;
  uint64_t rx_drop_until_ = 0;
  std::atomic<uint64_t> rx_duplicate_drops_{0};  // WRITEs whose chunk had landed already (landedAlready)
  std::atomic<uint64_t> rx_fenced_drops_{0};  // WRITEs dropped so
};

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
