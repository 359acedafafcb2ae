#include "transport/verbs/path.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/verbs/memory_region.h"

namespace maestro {
namespace transport {
namespace verbs {

Path::Path(int peer, int index, Device* device, int send_depth, int recv_depth)
    : peer_(peer), index_(index), device_(device), send_depth_(send_depth), recv_depth_(recv_depth) {}

Path::~Path() { release(); }

void Path::createQp(rdma_cm_id* id) {
  MAESTRO_CHECK(qp_ == nullptr, "verbs: path ", index_, " to peer ", peer_, " already has a QP");
  const size_t bytes = static_cast<size_t>(send_depth_ + recv_depth_) * kMaxControlBytes;
  void* mem = nullptr;
  MAESTRO_CHECK(posix_memalign(&mem, 4096, bytes) == 0, "verbs: out of memory for ", bytes,
                " bytes of control buffers");
  buffers_ = static_cast<uint8_t*>(mem);
  std::memset(buffers_, 0, bytes);
  buffers_mr_ = registerOrExplain(device_->pd(), buffers_, bytes, IBV_ACCESS_LOCAL_WRITE,
                                  "path control buffers");

  slots_.assign(send_depth_ + recv_depth_, WorkSlot{});
  for (int i = 0; i < send_depth_ + recv_depth_; ++i) {
    WorkSlot& slot = slots_[i];
    slot.path = this;
    slot.kind = i < send_depth_ ? SlotKind::kSend : SlotKind::kRecv;
    slot.buffer = buffers_ + static_cast<size_t>(i) * kMaxControlBytes;
  }
  // Pop from the back: hand out slot 0 first (only matters for debugging).
  for (int i = send_depth_ - 1; i >= 0; --i) free_send_slots_.push_back(&slots_[i]);

  device_->reserveCq(send_depth_ + recv_depth_);
  cq_reserved_ = true;
  ibv_qp_init_attr attr{};
  attr.send_cq = device_->cq();
  attr.recv_cq = device_->cq();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = send_depth_;
  attr.cap.max_recv_wr = recv_depth_;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 0;  // every WR asks for its completion explicitly
  MAESTRO_CHECK(rdma_create_qp(id, device_->pd(), &attr) == 0, "verbs: rdma_create_qp on ",
                device_->name(), " (send ", send_depth_, ", recv ", recv_depth_, ") failed: ",
                std::strerror(errno));
  id_ = id;
  qp_ = id->qp;

  for (int i = send_depth_; i < send_depth_ + recv_depth_; ++i) {
    MAESTRO_CHECK(repostRecv(&slots_[i]), "verbs: pre-posting receive ", i - send_depth_, " on ",
                  device_->name(), " failed: ", closeReason());
  }
}

void Path::release() {
  if (qp_ != nullptr) {
    rdma_destroy_qp(id_);
    qp_ = nullptr;
  }
  if (cq_reserved_) {
    device_->releaseCq(send_depth_ + recv_depth_);
    cq_reserved_ = false;
  }
  // The buffers go too (pinned memory: a connect() that retries for minutes
  // must not pile them up). Nothing reads them any more: a failed path
  // drops its completions without looking at their buffers.
  if (buffers_mr_ != nullptr) {
    ibv_dereg_mr(buffers_mr_);
    buffers_mr_ = nullptr;
  }
  std::free(buffers_);
  buffers_ = nullptr;
}

void Path::checkWrite(const WriteRequest& req) const {
  const auto* base = static_cast<const uint8_t*>(req.local.addr);
  const auto* src = static_cast<const uint8_t*>(req.src);
  MAESTRO_CHECK(req.local.valid() && src >= base && req.length <= req.local.length &&
                    static_cast<size_t>(src - base) <= req.local.length - req.length,
                "verbs: write of ", req.length, " bytes from ", req.src,
                " is not inside its local region [", req.local.addr, ", +", req.local.length, ")");
  MAESTRO_CHECK(req.remote_offset <= req.remote.length && req.length <= req.remote.length - req.remote_offset,
                "verbs: write of ", req.length, " bytes at offset ", req.remote_offset,
                " runs past the remote region (", req.remote.length, " bytes)");
  MAESTRO_CHECK(req.length <= device_->attr().max_mr_size && req.length <= 0x7fffffffu,
                "verbs: write of ", req.length, " bytes is larger than one RDMA message may be");
  MAESTRO_CHECK(req.remote.key <= 0xffffffffu, "verbs: remote key ", req.remote.key,
                " is not a 32-bit rkey (region registered by another transport?)");
}

Path::PostResult Path::postWrite(const WriteRequest& req) {
  checkWrite(req);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return PostResult::kClosed;
    Pending item{SlotKind::kWrite, req, {}};
    if (!backlog_.empty() || free_send_slots_.empty()) {
      backlog_.push_back(std::move(item));
      return PostResult::kQueued;
    }
    if (postLocked(item, &error)) return PostResult::kPosted;
    closeLocked(error);
  }
  disconnectQp();
  return PostResult::kClosed;
}

Path::PostResult Path::postSend(const void* data, size_t length) {
  MAESTRO_CHECK(length <= kMaxControlBytes, "verbs: control message of ", length,
                " bytes exceeds kMaxControlBytes (", kMaxControlBytes, ")");
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return PostResult::kClosed;
    const auto* bytes = static_cast<const uint8_t*>(data);
    Pending item{SlotKind::kSend, {}, std::vector<uint8_t>(bytes, bytes + length)};
    if (!backlog_.empty() || free_send_slots_.empty()) {
      backlog_.push_back(std::move(item));
      return PostResult::kQueued;
    }
    if (postLocked(item, &error)) return PostResult::kPosted;
    closeLocked(error);
  }
  disconnectQp();
  return PostResult::kClosed;
}

bool Path::postLocked(const Pending& item, std::string* error) {
  WorkSlot* slot = free_send_slots_.back();
  ibv_sge sge{};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = reinterpret_cast<uint64_t>(slot);
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  if (item.kind == SlotKind::kWrite) {
    const WriteRequest& req = item.write;
    sge.addr = reinterpret_cast<uint64_t>(req.src);
    sge.length = static_cast<uint32_t>(req.length);
    sge.lkey = req.local.lkey;
    wr.num_sge = req.length > 0 ? 1 : 0;  // a zero-length write (imm only) has no SGE
    wr.opcode = req.with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.imm_data = htonl(req.imm);  // the wire carries it big-endian; the receiver ntohl()s
    wr.wr.rdma.remote_addr = req.remote.addr + req.remote_offset;
    wr.wr.rdma.rkey = static_cast<uint32_t>(req.remote.key);
    slot->user_wr_id = req.wr_id;
  } else {
    // Copy into the registered bounce buffer: the caller's bytes need not be
    // registered and may be reused as soon as postSend() returns.
    std::memcpy(slot->buffer, item.bytes.data(), item.bytes.size());
    sge.addr = reinterpret_cast<uint64_t>(slot->buffer);
    sge.length = static_cast<uint32_t>(item.bytes.size());
    sge.lkey = buffers_mr_->lkey;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    slot->user_wr_id = 0;
  }
  slot->kind = item.kind;
  const int rc = ibv_post_send(qp_, &wr, &bad);
  if (rc != 0) {
    *error = strcat("verbs: ibv_post_send on path ", index_, " to peer ", peer_, " (", description_,
                    ") failed: ", std::strerror(rc));
    return false;
  }
  slot->busy = true;
  free_send_slots_.pop_back();
  return true;
}

bool Path::onSendCompletion(WorkSlot* slot, uint64_t* user_wr_id, bool* post_failed) {
  *post_failed = false;
  std::string error;
  bool report = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot->flushed) return false;  // reported with ok=false when the path failed
    report = slot->kind == SlotKind::kWrite;
    *user_wr_id = slot->user_wr_id;
    slot->busy = false;
    free_send_slots_.push_back(slot);
    while (!closed_ && !backlog_.empty() && !free_send_slots_.empty()) {
      if (!postLocked(backlog_.front(), &error)) {
        closeLocked(error);
        *post_failed = true;
        break;
      }
      backlog_.pop_front();
    }
  }
  if (*post_failed) disconnectQp();
  return report;
}

bool Path::repostRecv(WorkSlot* slot) {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    ibv_sge sge{reinterpret_cast<uint64_t>(slot->buffer), static_cast<uint32_t>(kMaxControlBytes),
                buffers_mr_->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = reinterpret_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    const int rc = ibv_post_recv(qp_, &wr, &bad);
    if (rc == 0) {
      slot->busy = true;
      return true;
    }
    closeLocked(strcat("verbs: ibv_post_recv on path ", index_, " to peer ", peer_, " (", description_,
                       ") failed: ", std::strerror(rc)));
  }
  disconnectQp();
  return false;
}

bool Path::closeLocked(const std::string& why) {
  if (closed_) return false;
  closed_ = true;
  close_reason_ = why;
  return true;
}

bool Path::close(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closeLocked(why)) return false;
  }
  disconnectQp();
  return true;
}

void Path::disconnectQp() {
  if (qp_ == nullptr) return;
  // The error state stops the QP at once and flushes what is queued on it;
  // rdma_disconnect then sends a DREQ so the peer's rdma_cm reports
  // DISCONNECTED and its side of the path fails too, even if it is idle.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
  rdma_disconnect(id_);  // fails harmlessly when already disconnected
}

bool Path::fail(std::vector<uint64_t>* unfinished_writes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) return false;
  failed_ = true;
  closeLocked("path failed");
  for (WorkSlot& slot : slots_) {
    if (slot.kind == SlotKind::kWrite && slot.busy && !slot.flushed) {
      slot.flushed = true;
      unfinished_writes->push_back(slot.user_wr_id);
    }
  }
  for (const Pending& item : backlog_) {
    if (item.kind == SlotKind::kWrite) unfinished_writes->push_back(item.write.wr_id);
  }
  backlog_.clear();
  return true;
}

bool Path::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string Path::closeReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return close_reason_;
}

void Path::markEstablished(const std::string& description) {
  std::lock_guard<std::mutex> lock(mu_);
  established_ = true;
  description_ = description;
}

bool Path::established() const {
  std::lock_guard<std::mutex> lock(mu_);
  return established_;
}

int Path::port() const { return id_ != nullptr && id_->port_num != 0 ? id_->port_num : 1; }

std::string Path::description() const {
  std::lock_guard<std::mutex> lock(mu_);
  return description_;
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
