// Point to point: send / recv / recv from any source between two ranks of a
// group, on the same engine primitives as the collectives (a message is
// written one-sided, chunk by chunk, over every path to the peer, straight
// into the receiver's buffer).
//
// Unlike a collective, a message involves two ranks only and does not take
// an operation number: it runs beside the collectives, and either side may
// post first. A rendezvous, receiver-driven so that the data lands in place:
//
//   sender                         receiver
//   READY(n, tag, bytes)  ------>  matched with a posted recv (in order)
//                         <------  GRANT(n): its buffer (exposed for this
//                                  message) and the engine tags to use
//   writes (chunked, all paths) -> lands in place; recv completes
//   DONE(n)               ------>  the tags may carry another message
//
// n numbers the sender's messages to that receiver (1, 2, ...); the receiver
// takes READYs in that order whatever path carried them, and matches them
// like torch/Gloo: a recv takes the oldest unmatched message from its source
// (any source: from any rank) with its tag; an unmatched READY waits for the
// next recv that fits. So messages between a pair with the same tag match in
// the order they were sent. Sizes must agree: a mismatch fails both sides.
//
// Every control message may arrive twice (failover re-sends it): each is
// acted on once, by its number. A send that gave up (deadline) answers a
// later GRANT with DONE(cancelled), so its receiver fails instead of waiting.
//
// Eager: a message of up to MAESTRO_EAGER_SIZE bytes skips the round trip
// before its data. Each receiver lends each sender kEagerSlots slots of
// that size in memory it keeps exposed (announced with its first GRANT to
// that sender); the sender writes a small message straight into a free
// slot and says so in its READY:
//
//   sender                         receiver
//   writes into slot s    ------>  lands in the slot
//   READY(n, s)           ------>  matched like any READY
//                         <------  ACCEPT(n): a GRANT saying it was taken
//                                  (or refusing a size that does not match);
//                                  once the data has landed it is copied
//                                  into the recv's buffer
//   DONE(n)               ------>  slot s may take another message
//
// so a recv completes half a round trip after the send was posted, and the
// send once the receiver took it and its write is acknowledged (sizes are
// still checked on both sides), a round trip instead of two. The receiver tells the sender which slots
// are free again in every GRANT and ACCEPT as per-slot counts of the uses
// it released, which a re-sent copy cannot take back. A message larger than
// a slot, the pair's first one (no slots lent yet), and any while every
// slot is taken go by the rendezvous above. A send that gives up after
// writing its slot says DONE(cancelled): a recv not yet matched never sees
// it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collectives/op.h"
#include "multipath/engine.h"

namespace maestro {
namespace collectives {

class PointToPoint {
 public:
  // Called once, on the point-to-point thread, when the message is over:
  // error null on success; source is the rank it came from (recv) or went to.
  // The buffer may be handed back to the user then: nothing reads or writes
  // it any more.
  using Done = std::function<void(std::exception_ptr error, int source)>;

  // max_piece_bytes: cut messages into pieces of at most this many bytes
  // (0: the largest one engine message can carry; tests make it small).
  explicit PointToPoint(multipath::Engine& engine, uint64_t max_piece_bytes = 0);
  ~PointToPoint();  // stop("the process group was shut down")
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // `buffer` (bytes at buffer.base) stays valid and unchanged until done.
  void send(int peer, uint32_t tag, const Window& buffer, uint64_t bytes, Deadline deadline, Done done);
  // peer -1: from any source.
  void recv(int peer, uint32_t tag, const Window& buffer, uint64_t bytes, Deadline deadline, Done done);
  // Fail every message not finished with `why` and stop the thread; writes
  // already posted are waited for (bounded by the path timeout) so no buffer
  // is read after this returns. Idempotent.
  void stop(const std::string& why);

  // Largest message piece: one engine message per piece (its chunk index
  // must fit the immediate).
  uint64_t pieceBytes() const;
  // Messages this rank sent eager, so far (for tests and statistics).
  uint64_t eagerSent() const { return eager_sent_.load(); }

  // Slots a receiver lends each sender for eager messages.
  static constexpr int kEagerSlots = 4;

 private:
  struct Send;
  struct Recv;
  struct Ready {  // a sender's message waiting for a recv
    int peer;
    uint64_t seq;
    uint32_t tag;
    uint64_t bytes;
    int slot = -1;  // eager: the lent slot its data is written into
  };
  // Receiver side, per sender: the slots this rank lends it.
  struct Lending {
    std::unique_ptr<uint8_t[]> memory;
    Region region;
    uint64_t key = 0;
    std::vector<uint32_t> tags;       // one engine tag per slot, kept for good
    std::vector<uint64_t> released;   // per slot: uses given back
    std::vector<char> busy;           // per slot: holds a message (READY taken, DONE not yet)
    bool lent() const { return region.valid(); }
  };
  // Sender side, per receiver: the slots it lends this rank.
  struct Borrowing {
    RemoteRegion region;
    uint64_t slot_bytes = 0;
    std::vector<uint32_t> tags;
    std::vector<uint64_t> uses;      // per slot: uses begun
    std::vector<uint64_t> released;  // per slot: uses the receiver gave back
    int freeSlot() const;            // -1: none
  };
  struct Matched;  // a recv matched with a READY, until the sender's DONE

  void loop();
  void ensureThread();                           // mu_ held
  void handle(multipath::P2PMessage& m);         // thread
  void onReady(const Ready& r);                  // thread
  void onGrant(multipath::P2PMessage& m);        // thread
  void onDone(const multipath::P2PMessage& m);   // thread
  void match(std::shared_ptr<Recv> r, const Ready& ready);  // thread
  void grant(Matched& m);                        // thread: tags available
  // Thread: completions, deadlines, dead peers. `lost[p]` is why peer p was
  // unreachable (empty: it was not) when the round began, before its
  // messages were taken and its operations looked at.
  void progress(const std::vector<std::string>& lost);
  void finish(std::shared_ptr<Send> s, std::exception_ptr error);
  void finish(std::shared_ptr<Recv> r, std::exception_ptr error);
  void freeTags(int peer, const std::vector<uint32_t>& tags);
  // Eager (receiver): lend the peer its slots (once), give a slot back.
  void lend(int peer);
  void releaseSlot(int peer, int slot);
  // A message over on both sides: its tags, or its slot, go back.
  void over(int peer, const Matched& m);
  // Eager (receiver): copy a landed message out of its slot.
  void copyOut(const Matched& m);
  // Eager (sender): write s into a borrowed slot and say READY; false: no slot.
  bool sendEager(Send& s);
  // A GRANT or ACCEPT to `peer`: g and the piece tags, then what this rank
  // lends it (the released counts; the slots themselves where not yet told).
  void grantTo(int peer, uint64_t seq, const void* grant, const std::vector<uint32_t>& tags);
  void readLending(int peer, const uint8_t* trailer, size_t length);
  void control(int peer, multipath::ControlType type, uint64_t seq, uint32_t sub, const void* body = nullptr,
               size_t length = 0);

  multipath::Engine& engine_;
  const int n_;
  const uint64_t max_piece_bytes_;

  std::mutex mu_;  // guards the posting side: new_sends_, new_recvs_, stopping_, thread_
  std::vector<std::shared_ptr<Send>> new_sends_;
  std::vector<std::shared_ptr<Recv>> new_recvs_;
  bool stopping_ = false;
  std::string stop_why_;
  std::thread thread_;

  // Owned by the thread.
  std::vector<uint64_t> next_send_seq_;                     // per peer: our next message number to it
  std::vector<std::map<uint64_t, std::shared_ptr<Send>>> sends_;  // per peer, by number
  std::vector<std::set<uint64_t>> cancelled_;               // per peer: sends that gave up before a GRANT
  std::vector<uint64_t> next_ready_;                        // per peer: the READY number taken next
  std::vector<std::map<uint64_t, Ready>> early_ready_;      // per peer: READYs ahead of it
  std::deque<Ready> unexpected_;                            // READYs no recv took yet, in arrival order
  std::deque<std::shared_ptr<Recv>> posted_;                // recvs not yet matched, in post order
  std::vector<std::map<uint64_t, std::shared_ptr<Matched>>> matched_;  // per peer, by the sender's number
  std::vector<std::deque<std::shared_ptr<Matched>>> want_tags_;       // per peer: matched, no tags free yet
  std::vector<std::vector<uint32_t>> free_tags_;            // per peer
  std::vector<char> awaiting_;                              // per peer: told the engine we wait on it
  const uint64_t eager_bytes_;                              // MAESTRO_EAGER_SIZE: a slot (0: off)
  std::vector<Lending> lending_;                            // per peer (the thread's; stop() gives them back)
  std::vector<char> told_slots_;                            // per peer: its slots were announced
  std::vector<char> eager_refused_;                         // per peer: lending its slots failed (not tried again)
  std::vector<Borrowing> borrowing_;                        // per peer
  std::atomic<uint64_t> eager_sent_{0};
};

}  // namespace collectives
}  // namespace maestro
