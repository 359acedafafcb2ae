#include "transport/verbs/memory_window.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/verbs/device.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

// A bind is a local operation (no packet leaves the NIC): it completes in
// microseconds. This bound only turns a broken device into an error.
constexpr auto kBindTimeout = std::chrono::seconds(5);
constexpr int kQueueDepth = 4;

}  // namespace

bool WindowBinder::supported(const Device& device) {
  return device.attr().max_mw > 0 && (device.attr().device_cap_flags & IBV_DEVICE_MEM_WINDOW) != 0;
}

WindowBinder::WindowBinder(Device* device, const GidEntry& gid) : device_(device), gid_(gid) {
  cq_ = ibv_create_cq(device_->context(), kQueueDepth, nullptr, nullptr, 0);
  MAESTRO_CHECK(cq_ != nullptr, "verbs: ibv_create_cq for the memory-window binder on ", device_->name(),
                " failed: ", std::strerror(errno));
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = kQueueDepth;
  attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  qp_ = ibv_create_qp(device_->pd(), &attr);
  if (qp_ == nullptr) {
    const int err = errno;
    ibv_destroy_cq(cq_);
    fail("verbs: ibv_create_qp for the memory-window binder on ", device_->name(), " failed: ", std::strerror(err));
  }
  try {
    connectToSelf();
  } catch (...) {
    ibv_destroy_qp(qp_);
    ibv_destroy_cq(cq_);
    throw;
  }
  MAESTRO_INFO("verbs: memory windows on ", device_->name(), ": remote write access is granted per exposure");
}

WindowBinder::~WindowBinder() {
  if (qp_ != nullptr && ibv_destroy_qp(qp_) != 0)
    MAESTRO_WARN("verbs: ibv_destroy_qp(binder) failed: ", std::strerror(errno));
  if (cq_ != nullptr && ibv_destroy_cq(cq_) != 0)
    MAESTRO_WARN("verbs: ibv_destroy_cq(binder) failed: ", std::strerror(errno));
}

void WindowBinder::connectToSelf() {
  auto modify = [&](ibv_qp_attr& a, int mask, const char* state) {
    const int rc = ibv_modify_qp(qp_, &a, mask);
    MAESTRO_CHECK(rc == 0, "verbs: the memory-window binder's QP on ", device_->name(), " cannot reach ", state, ": ",
                  std::strerror(rc));
  };
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  modify(a, IBV_QP_STATE, "RESET");

  a = {};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(gid_.port);
  a.qp_access_flags = 0;  // it only binds; nothing is ever written through it
  modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");

  ibv_port_attr port{};
  MAESTRO_CHECK(ibv_query_port(device_->context(), static_cast<uint8_t>(gid_.port), &port) == 0,
                "verbs: ibv_query_port(", device_->name(), ", ", gid_.port, ") failed: ", std::strerror(errno));
  ibv_gid gid{};
  MAESTRO_CHECK(ibv_query_gid(device_->context(), static_cast<uint8_t>(gid_.port), gid_.index, &gid) == 0,
                "verbs: ibv_query_gid(", device_->name(), ", ", gid_.index, ") failed: ", std::strerror(errno));
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = port.active_mtu;
  a.dest_qp_num = qp_->qp_num;  // itself
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_.index);
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = static_cast<uint8_t>(gid_.port);
  modify(a,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
             IBV_QP_MIN_RNR_TIMER,
         "RTR");

  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  modify(a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
         "RTS");
  broken_ = false;
}

uint32_t WindowBinder::bind(ibv_mw* mw, ibv_mr* mr) {
  std::lock_guard<std::mutex> lock(mu_);
  ibv_mw_bind_info info{};
  info.mr = mr;
  info.addr = reinterpret_cast<uint64_t>(mr->addr);
  info.length = mr->length;
  info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  run(mw, info, "binding");
  return mw->rkey;
}

void WindowBinder::unbind(ibv_mw* mw, ibv_mr* mr) {
  std::lock_guard<std::mutex> lock(mu_);
  // A bind of length 0 invalidates a type-1 window (and steps its key). The
  // MR is named although nothing of it is bound: providers read its lkey.
  ibv_mw_bind_info info{};
  info.mr = mr;
  info.addr = reinterpret_cast<uint64_t>(mr->addr);
  info.length = 0;
  info.mw_access_flags = 0;
  run(mw, info, "invalidating");
}

void WindowBinder::run(ibv_mw* mw, const ibv_mw_bind_info& info, const char* what) {
  if (broken_) connectToSelf();
  const uint32_t old_rkey = mw->rkey;
  ibv_mw_bind bind{};
  bind.wr_id = next_wr_id_++;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info = info;
  const int rc = ibv_bind_mw(qp_, mw, &bind);
  MAESTRO_CHECK(rc == 0, "verbs: ", what, " a memory window on ", device_->name(), " failed: ", std::strerror(rc));
  const auto until = Clock::now() + kBindTimeout;
  ibv_wc wc{};
  for (int spins = 0;; ++spins) {
    const int n = ibv_poll_cq(cq_, 1, &wc);
    MAESTRO_CHECK(n >= 0, "verbs: polling the memory-window binder's CQ on ", device_->name(), " failed");
    if (n == 1 && wc.wr_id == bind.wr_id) break;
    if (n == 1) continue;  // a completion of an earlier bind that timed out
    if (Clock::now() >= until) {
      broken_ = true;  // its completion may still come: start over on a reset QP
      mw->rkey = old_rkey;
      fail("verbs: ", what, " a memory window on ", device_->name(), " did not complete in ",
           std::chrono::duration_cast<std::chrono::seconds>(kBindTimeout).count(), " s");
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (wc.status != IBV_WC_SUCCESS) {
    broken_ = true;  // a failed work request moves the QP to the error state
    mw->rkey = old_rkey;  // the provider stepped it when the bind was posted
    fail("verbs: ", what, " a memory window on ", device_->name(), " failed: ", ibv_wc_status_str(wc.status),
         " (vendor error ", wc.vendor_err, ")");
  }
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
