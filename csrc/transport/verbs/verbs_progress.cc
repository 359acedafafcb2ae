// The progress thread of the verbs transport: polls the shared completion
// queue and is the only thread that calls the CompletionSink.
//
// Idle strategy: with busy_poll it spins on ibv_poll_cq (lowest latency, one
// core); otherwise it arms the CQ, polls once more (a completion may have
// slipped in between the last poll and the arming), and sleeps in poll() on
// the completion channel and its wake-up eventfd.
#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/verbs/verbs_transport_impl.h"
#include "common/thread.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

constexpr int kPollBatch = 32;

const char* slotWhat(SlotKind kind) {
  switch (kind) {
    case SlotKind::kWrite: return "RDMA write";
    case SlotKind::kSend: return "control send";
    default: return "receive";
  }
}

// What a failed work completion most likely means, in words.
const char* statusHint(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer's NIC refused the access: rkey, address or length do not match a region the peer "
             "exposes now (a key of an earlier exposure, or the region was concealed or deregistered)";
    case IBV_WC_RETRY_EXC_ERR:
      return "no acknowledgement from the peer after every retry: the path or the peer is down";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "the peer had no receive posted for too long";
    case IBV_WC_WR_FLUSH_ERR:
      return "the queue pair had gone to the error state: the peer sent something this side refused (a "
             "write with a bad rkey, say), or the connection was closed";
    case IBV_WC_LOC_PROT_ERR:
      return "the local buffer is not covered by its registration (wrong lkey or out of bounds)";
    case IBV_WC_REM_INV_REQ_ERR:
      return "the peer considered the request invalid (length beyond its limits?)";
    default:
      return nullptr;
  }
}

}  // namespace

void VerbsTransport::progressLoop() {
  setLogRank(options_.rank);
  nameThisThread("maestro-cq");
  Device* device = device_.get();  // set before this thread was started, stays until it is joined
  ibv_wc wcs[kPollBatch];
  pollfd fds[2] = {{device->channel() ? device->channel()->fd : -1, POLLIN, 0},
                   {progress_wake_fd_, POLLIN, 0}};
  while (!stopping_.load(std::memory_order_acquire)) {
    // Completions first, then tasks: when the peer's side of a path fails
    // because of something our NIC already reported (say a write with a bad
    // rkey), the error completion is in our CQ well before the peer's
    // DISCONNECTED has made it into a task, and it is the better message.
    int n = ibv_poll_cq(device->cq(), kPollBatch, wcs);
    if (n < 0) {
      MAESTRO_WARN("verbs: ibv_poll_cq on ", device->name(), " failed (", n, ")");
      n = 0;
    }
    for (int i = 0; i < n; ++i) handleCompletion(wcs[i]);
    if (tasks_pending_.load(std::memory_order_acquire)) runTasks();
    if (n > 0 || options_.busy_poll) continue;

    device->armCq();
    n = ibv_poll_cq(device->cq(), kPollBatch, wcs);
    for (int i = 0; i < n; ++i) handleCompletion(wcs[i]);
    if (n > 0 || tasks_pending_.load(std::memory_order_acquire)) continue;
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
      MAESTRO_WARN("verbs: progress thread: poll failed: ", std::strerror(errno));
      break;
    }
    if (fds[0].revents != 0) {
      while (device->takeCqEvent()) {
      }
    }
    if (fds[1].revents != 0) {
      uint64_t value;
      (void)!read(progress_wake_fd_, &value, sizeof(value));
    }
  }
}

void VerbsTransport::handleCompletion(const ibv_wc& wc) {
  auto* slot = reinterpret_cast<WorkSlot*>(wc.wr_id);
  Path* path = slot->path;
  if (wc.status != IBV_WC_SUCCESS) {
    // Only wr_id, status, qp_num and vendor_err are defined here: the kind of
    // work comes from the slot, not from wc.opcode.
    if (path->failed()) return;  // the flush of a path already reported
    // A connection still being set up (or one that failed to be) belongs to
    // the cm thread, which may be destroying its cm id right now: its QP's
    // flushes are not the progress thread's business. (An error on a path
    // that then gets established reaches us as the peer's DISCONNECTED.)
    if (!path->established()) return;
    // A flush is only an echo of why the QP went to the error state: when we
    // put it there (closePath, DISCONNECTED, a failed post), say why we did.
    const std::string closed_because = path->closeReason();
    if (wc.status == IBV_WC_WR_FLUSH_ERR && !closed_because.empty()) {
      failPath(path, closed_because);
      return;
    }
    const char* hint = statusHint(wc.status);
    failPath(path, strcat("verbs: ", slotWhat(slot->kind), " on path ", path->index(), " to peer ",
                          path->peer(), " (", path->description(), ") failed: ", ibv_wc_status_str(wc.status),
                          " (status ", static_cast<int>(wc.status), ", vendor_err 0x", std::hex,
                          wc.vendor_err, std::dec, ")", hint ? ": " : "", hint ? hint : ""));
    return;
  }
  if (slot->kind == SlotKind::kRecv) {
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      // The bytes are already in place; the immediate travelled big-endian.
      sink_->onWriteArrived(path->peer(), path->index(), ntohl(wc.imm_data), wc.byte_len);
    } else {
      sink_->onMessage(path->peer(), path->index(), slot->buffer, wc.byte_len);
    }
    if (!path->repostRecv(slot)) failPath(path, path->closeReason());
    return;
  }
  uint64_t user_wr_id = 0;
  bool post_failed = false;
  if (path->onSendCompletion(slot, &user_wr_id, &post_failed)) {
    sink_->onWriteComplete(path->peer(), path->index(), user_wr_id, true);
  }
  if (post_failed) failPath(path, path->closeReason());
}

void VerbsTransport::failPath(Path* path, const std::string& why) {
  path->close(why);  // stops posts, QP -> error, tells the peer (if not done yet)
  std::vector<uint64_t> unfinished;
  if (!path->fail(&unfinished)) return;
  // `why` and not closeReason(): the reason that reaches the progress thread
  // first is the one reported, so an error completion already in the CQ
  // wins over a DISCONNECTED that closed the path a moment earlier.
  MAESTRO_INFO("verbs: path ", path->index(), " to peer ", path->peer(), " failed (", unfinished.size(),
               " writes flushed): ", why);
  sink_->onPathError(path->peer(), path->index(), why);
  for (uint64_t wr_id : unfinished) sink_->onWriteComplete(path->peer(), path->index(), wr_id, false);
}

void VerbsTransport::requestPathFailure(Path* path, const std::string& why) {
  path->close(why);
  enqueue(Task{Task::kFailPath, path, 0, why});
}

void VerbsTransport::enqueue(const Task& task) {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_.push_back(task);
    tasks_pending_.store(true, std::memory_order_release);
  }
  const uint64_t one = 1;
  (void)!write(progress_wake_fd_, &one, sizeof(one));
}

void VerbsTransport::runTasks() {
  std::deque<Task> batch;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    batch.swap(tasks_);
    tasks_pending_.store(false, std::memory_order_release);
  }
  for (const Task& task : batch) {
    if (task.kind == Task::kPathUp) {
      sink_->onPathUp(task.path->peer(), task.path->index());
      continue;
    }
    // Either other kind first makes sure the path's error was raised (a write
    // is flushed only on a path that was closed, so closeReason() is set).
    failPath(task.path, task.kind == Task::kFailPath ? task.why : task.path->closeReason());
    if (task.kind == Task::kFlushWrite) {
      sink_->onWriteComplete(task.path->peer(), task.path->index(), task.wr_id, false);
    }
  }
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
