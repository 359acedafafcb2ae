// One path of the verbs transport: an RC queue pair and the bookkeeping of
// the work requests posted on it.
//
// Every work request carries, as its wr_id, the address of a WorkSlot (the
// paper's "WR descriptor", SOSR'21 §4.2): the completion thread gets from a
// completion to its path, its kind and the caller's wr_id in O(1), without a
// map, and this also works for error completions, whose opcode field the
// verbs spec leaves undefined.
//
// Send queue: max_inflight_per_path writes plus a few control sends. Writes
// and sends beyond what the QP holds wait in a software backlog (FIFO, so
// the order of everything posted on a path is kept) and are posted as send
// completions free slots; postWrite()/postSend() therefore never block and
// never fail for lack of room.
//
// Receive queue: every slot owns a kMaxControlBytes buffer, so a pre-posted
// receive can take either a control SEND (the bytes land in the buffer) or
// the notification of a WRITE WITH IMM (no bytes: they went straight to the
// target region). Slots are re-posted as soon as their completion has been
// handled. A peer that finds no posted receive gets RNR NAKs and retries
// forever (rnr_retry 7): back-pressure, not an error.
//
// Failure: fail() marks the path dead and hands back the wr_ids of every
// write that had not completed, so the layer above sees each of them
// complete with ok=false exactly once, whether or not the provider later
// flushes them (their late completions are recognised and dropped).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/verbs/device.h"

namespace maestro {
namespace transport {
namespace verbs {

class Path;

enum class SlotKind : uint8_t { kWrite, kSend, kRecv };

struct WorkSlot {
  Path* path = nullptr;
  SlotKind kind = SlotKind::kRecv;
  bool busy = false;
  bool flushed = false;      // already reported as ok=false: drop its late completion
  uint64_t user_wr_id = 0;   // the caller's wr_id (writes)
  uint8_t* buffer = nullptr; // kMaxControlBytes: send bounce buffer / receive landing buffer
};

class Path {
 public:
  Path(int peer, int index, Device* device, int send_depth, int recv_depth);
  ~Path();
  Path(const Path&) = delete;
  Path& operator=(const Path&) = delete;

  int peer() const { return peer_; }
  int index() const { return index_; }
  ibv_qp* qp() const { return qp_; }
  int port() const;  // the device port rdma_cm bound it to
  const Device& device() const { return *device_; }

  // Creates the QP on `id` (which rdma_cm bound to this path's device and
  // source GID), registers the control buffers and pre-posts every receive.
  // Throws maestro::Error. Called once, on the connection-manager thread.
  void createQp(rdma_cm_id* id);
  // Destroys the QP and frees the control buffers and their registration
  // (not the cm id, not the slots: late completions may still point at
  // them). Only for a path that failed or at shutdown. Idempotent.
  void release();

  // ---- posting (any thread) ----------------------------------------------
  enum class PostResult { kPosted, kQueued, kClosed };
  // Throws maestro::Error on a malformed request (out of bounds, too long).
  // kClosed: the path is down and nothing was posted. A failing
  // ibv_post_send closes the path and returns kClosed (see closeReason()).
  PostResult postWrite(const WriteRequest& req);
  PostResult postSend(const void* data, size_t length);

  // ---- completions (completion thread) -----------------------------------
  // A send-queue slot completed successfully. Returns true (and the caller's
  // wr_id) when it should be reported as a completed write. Refills the send
  // queue from the backlog; if that posting fails the path is closed and
  // *post_failed is set.
  bool onSendCompletion(WorkSlot* slot, uint64_t* user_wr_id, bool* post_failed);
  // Gives a receive slot back to the QP. False (path closed) if it could not.
  bool repostRecv(WorkSlot* slot);

  // ---- failure -----------------------------------------------------------
  // Stops new posts and records why (the first reason wins). Returns true the
  // first time. Moves the QP to the error state, which makes the NIC stop and
  // flush, and tells the peer (rdma_disconnect) so its side fails too.
  bool close(const std::string& why);
  // Completion thread: marks the path failed and appends the wr_ids of all
  // writes that have not completed (posted or backlogged). Returns true the
  // first time: the caller then raises onPathError and completes them.
  bool fail(std::vector<uint64_t>* unfinished_writes);
  bool failed() const;
  // Empty while the path is open.
  std::string closeReason() const;

  // The connection is up and the path is in use: from now on an error
  // completion fails the path (before, connection setup owns its fate).
  // `description`: "192.168.50.2 -> 192.168.50.1:39811 gid_idx 3 qp 17".
  void markEstablished(const std::string& description);
  bool established() const;
  std::string description() const;

 private:
  struct Pending {  // a backlogged write or send
    SlotKind kind;
    WriteRequest write;
    std::vector<uint8_t> bytes;
  };
  void checkWrite(const WriteRequest& req) const;
  // Posts into a free slot; returns false (errno in *error) on failure.
  // Requires mu_ and a free slot.
  bool postLocked(const Pending& item, std::string* error);
  bool closeLocked(const std::string& why);
  void disconnectQp();

  const int peer_;
  const int index_;
  Device* const device_;
  const int send_depth_;
  const int recv_depth_;

  rdma_cm_id* id_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint8_t* buffers_ = nullptr;  // (send_depth_ + recv_depth_) * kMaxControlBytes
  ibv_mr* buffers_mr_ = nullptr;
  bool cq_reserved_ = false;

  mutable std::mutex mu_;
  std::vector<WorkSlot> slots_;            // send slots first, then receive slots
  std::vector<WorkSlot*> free_send_slots_;
  std::deque<Pending> backlog_;
  bool established_ = false;
  bool closed_ = false;
  bool failed_ = false;
  std::string close_reason_;
  std::string description_;
};

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
