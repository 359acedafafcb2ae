#include "transport/verbs/device.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

constexpr int kInitialCqEntries = 256;
// Acknowledging CQ events takes a mutex inside libibverbs; do it in batches.
constexpr unsigned kAckBatch = 64;

}  // namespace

Device::Device(ibv_context* context, bool with_channel) : context_(context) {
  name_ = ibv_get_device_name(context->device);
  MAESTRO_CHECK(ibv_query_device(context_, &attr_) == 0, "verbs: ibv_query_device(", name_,
                ") failed: ", std::strerror(errno));
  pd_ = ibv_alloc_pd(context_);
  MAESTRO_CHECK(pd_ != nullptr, "verbs: ibv_alloc_pd(", name_, ") failed: ", std::strerror(errno));
  try {
    if (with_channel) {
      channel_ = ibv_create_comp_channel(context_);
      MAESTRO_CHECK(channel_ != nullptr, "verbs: ibv_create_comp_channel(", name_,
                    ") failed: ", std::strerror(errno));
      // Non-blocking, so the progress thread can poll() it beside its wake-up fd.
      const int flags = fcntl(channel_->fd, F_GETFL);
      MAESTRO_CHECK(flags >= 0 && fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) == 0,
                    "verbs: cannot make the completion channel non-blocking: ", std::strerror(errno));
    }
    cq_capacity_ = std::min(kInitialCqEntries, attr_.max_cqe);
    cq_ = ibv_create_cq(context_, cq_capacity_, nullptr, channel_, 0);
    MAESTRO_CHECK(cq_ != nullptr, "verbs: ibv_create_cq(", name_, ", ", cq_capacity_,
                  ") failed: ", std::strerror(errno));
    cq_capacity_ = cq_->cqe;  // providers may round up
    if (channel_ != nullptr) armCq();
  } catch (...) {
    if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
    ibv_dealloc_pd(pd_);
    throw;
  }
  MAESTRO_INFO("verbs: device ", name_, " opened (max_qp_wr ", attr_.max_qp_wr, ", max_cqe ",
               attr_.max_cqe, ", ", channel_ ? "completion channel" : "busy poll", ")");
}

Device::~Device() {
  if (unacked_events_ > 0) ibv_ack_cq_events(cq_, unacked_events_);
  if (cq_ != nullptr && ibv_destroy_cq(cq_) != 0) {
    MAESTRO_WARN("verbs: ibv_destroy_cq(", name_, ") failed: ", std::strerror(errno));
  }
  if (channel_ != nullptr && ibv_destroy_comp_channel(channel_) != 0) {
    MAESTRO_WARN("verbs: ibv_destroy_comp_channel(", name_, ") failed: ", std::strerror(errno));
  }
  if (pd_ != nullptr && ibv_dealloc_pd(pd_) != 0) {
    MAESTRO_WARN("verbs: ibv_dealloc_pd(", name_, ") failed (a memory region still registered?): ",
                 std::strerror(errno));
  }
}

void Device::reserveCq(int entries) {
  std::lock_guard<std::mutex> lock(cq_mu_);
  const int needed = cq_reserved_ + entries;
  MAESTRO_CHECK(needed <= attr_.max_cqe, "verbs: ", name_, " cannot hold ", needed,
                " completions in one CQ (max_cqe ", attr_.max_cqe,
                "): too many paths, or max_inflight_per_path too large");
  if (needed > cq_capacity_) {
    // Grow geometrically so that opening many paths resizes only a few times.
    const int target = std::min(attr_.max_cqe, std::max(needed, 2 * cq_capacity_));
    MAESTRO_CHECK(ibv_resize_cq(cq_, target) == 0, "verbs: ibv_resize_cq(", name_, ", ", target,
                  ") failed: ", std::strerror(errno));
    cq_capacity_ = cq_->cqe;
  }
  cq_reserved_ = needed;
}

void Device::releaseCq(int entries) {
  std::lock_guard<std::mutex> lock(cq_mu_);
  cq_reserved_ = std::max(0, cq_reserved_ - entries);
}

void Device::armCq() {
  MAESTRO_CHECK(ibv_req_notify_cq(cq_, 0) == 0, "verbs: ibv_req_notify_cq(", name_, ") failed: ",
                std::strerror(errno));
}

bool Device::takeCqEvent() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(channel_, &cq, &context) != 0) return false;  // EAGAIN: nothing pending
  if (++unacked_events_ >= kAckBatch) {
    ibv_ack_cq_events(cq_, unacked_events_);
    unacked_events_ = 0;
  }
  return true;
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
