// One RDMA device as the transport uses it: the paper's QP manager resources
// (SOSR'21 §4.1) that every path on the device shares.
//
//   * one protection domain, so a buffer registered once can be the source
//     or target of a write on any path (no per-QP re-registration);
//   * one completion queue for the send and receive queues of every QP, so a
//     single progress thread sees all completions in one place;
//   * optionally a completion channel, so that thread can sleep in the kernel
//     instead of spinning when the transport is idle.
//
// The ibv_context itself belongs to librdmacm: rdma_cm binds every cm_id to
// one of the contexts it opened (rdma_get_devices), and a QP must be created
// on that same context, so the transport never opens devices on its own.
#pragma once

#include <infiniband/verbs.h>

#include <mutex>
#include <string>

namespace maestro {
namespace transport {
namespace verbs {

class Device {
 public:
  // `with_channel`: create a completion channel (event mode); without it the
  // CQ can only be busy-polled.
  Device(ibv_context* context, bool with_channel);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }
  ibv_comp_channel* channel() const { return channel_; }
  const std::string& name() const { return name_; }
  const ibv_device_attr& attr() const { return attr_; }

  // Makes room in the shared CQ for `entries` more work requests (the send
  // plus receive depth of a new QP). A CQ that overflows is a fatal
  // asynchronous error for every QP on it, so this runs before each QP is
  // created; it grows the CQ with ibv_resize_cq (safe while another thread
  // polls it: providers take the CQ lock in both).
  void reserveCq(int entries);
  // Gives the room back when a QP is destroyed.
  void releaseCq(int entries);

  // Event mode: arm the CQ for the next completion event.
  void armCq();
  // Event mode: consume one completion event from the channel (non-blocking
  // fd); returns false when none was pending. Events are acknowledged in
  // batches, and all of them before the CQ is destroyed.
  bool takeCqEvent();

 private:
  ibv_context* context_;
  std::string name_;
  ibv_device_attr attr_{};
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;

  std::mutex cq_mu_;      // guards the CQ sizing below
  int cq_capacity_ = 0;   // entries the CQ has
  int cq_reserved_ = 0;   // entries promised to live QPs
  unsigned unacked_events_ = 0;  // only touched by the progress thread
};

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
