// Staging: how an operation on device (CUDA) tensors runs on maestro's host
// transports.
//
// maestro's paths move host memory (a TCP socket, or an RDMA WRITE from a
// host MR). A device tensor therefore travels through a host stand-in: a
// contiguous tensor carved from a slab of the group's StagingPool -- pinned
// host memory, allocated once and registered with the transport once, by
// the pool itself, for as long as the slab lives -- reused by every later
// operation. The operation itself runs
// unchanged on the stand-ins, so every collective, p2p op and failure path
// the CPU path has, the device path has too.
//
// Stream semantics follow ProcessGroupNCCL's:
//   - at the call, an event is recorded on the caller's current stream: the
//     copies wait for it (an event, never a device sync);
//   - the copies run on a side stream of the backend: device -> slab from the
//     call on (so an operation's copy in overlaps the transfer of the ones
//     queued before it, e.g. DDP's gradient buckets), slab -> device as soon
//     as the operation's data is there;
//   - an allreduce's copies are cut into pieces (inoutPipelined): the ring
//     sends and reduces each piece as soon as it is in place, while the next
//     ones are still being copied, and copies each part back as soon as it
//     is final -- so only about one piece each way is not hidden behind the
//     transfer;
//   - Work.wait() makes the caller's current stream wait for the copy back;
//     Work.synchronize() blocks the host until it is done;
//   - the caller's tensors are record_stream'ed on the side stream, so the
//     caching allocator does not hand their memory out before the copies end.
// The reduction happens on the host, over the staged bytes, as it does for a
// CPU tensor: the data arrives there anyway, and reducing on the GPU after
// the copy back would copy every peer's block to the device separately.
//
// MAESTRO_STAGING: auto (device tensors staged, CPU tensors used in place),
// force (CPU tensors staged too, through the same slabs and steps, with plain
// host copies: how the device path's machinery is tested without a GPU),
// off (device tensors refused with a clear error).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "collectives/staged_buffer.h"
#include "transport/memory.h"

namespace maestro {
namespace c10d_glue {

enum class StagingMode { kAuto, kForce, kOff };
StagingMode stagingMode(const std::string& knob);

// Whether this extension stages CUDA tensors (built against a torch with CUDA).
bool stagingHasCuda();

// Moves one operation's bytes between the caller's tensors and their host
// stand-ins. Two implementations: host copies (CPU tensors, forced staging)
// and device copies (a side stream and events).
class CopyEngine {
 public:
  using Copies = std::vector<std::pair<at::Tensor, at::Tensor>>;  // (destination, source)
  virtual ~CopyEngine() = default;
  // At the call, on the caller's thread: the caller's work so far is what
  // the copies wait for. Device copies into the stand-ins start here, in
  // order, so they run while the operations queued before this one are on
  // the wire.
  virtual void start(const Copies& copies) = 0;
  // On the worker, never blocking: how many of the copies (a prefix, at
  // least `from`, which are known complete) are complete.
  virtual size_t staged(const Copies& copies, size_t from) = 0;
  // On the worker: copy i is complete when it returns (a host copy is made
  // here; the copies before it are complete already).
  virtual void stageOne(const Copies& copies, size_t i) = 0;
  // On the worker: the copies into the host stand-ins before `end` (all by
  // default) are complete when it returns.
  void toHost(const Copies& copies, size_t end = SIZE_MAX) {
    end = std::min(end, copies.size());
    for (size_t i = staged(copies, 0); i < end; ++i) stageOne(copies, i);
  }
  // Copies back into the caller's tensors; does not wait for them.
  virtual void toCaller(const Copies& copies) = 0;
  // Work.wait(): the calling thread's current stream waits for toCaller's copies.
  virtual void streamWait() = 0;
  // Work.synchronize(): the host waits for them.
  virtual void hostWait() = 0;
  // Whether every copy made so far is done (a slab they use may then be reused).
  virtual bool done() const = 0;
  // The stream the copies back run on (the Work's future records its events
  // there); none for host copies.
  virtual std::optional<c10::Stream> stream() const = 0;
};

// The group's slabs of host memory (pinned when they serve a device), each
// registered with the transport once, when it is made, for as long as it
// lives (not through the registration cache, whose idle bound would drop it
// between operations).
class StagingPool {
 public:
  using Register = std::function<Region(void*, size_t)>;
  using Deregister = std::function<void(const Region&)>;
  struct Slab {
    at::Tensor buffer;  // uint8, its whole storage
    Region region;      // its registration
    bool pinned = false;
    bool busy = false;
    std::shared_ptr<CopyEngine> last;  // the copies that last read it
    uint64_t used = 0;                 // when it was last handed out (a counter)
  };
  // Idle slabs are kept up to this many bytes (or the largest slab).
  StagingPool(Register reg, Deregister dereg, size_t keep_bytes = size_t(256) << 20)
      : reg_(std::move(reg)), dereg_(std::move(dereg)), keep_bytes_(keep_bytes) {}
  ~StagingPool() { clear(); }
  // A slab of at least `bytes`: a free one whose last copies are done, else a new one.
  std::shared_ptr<Slab> acquire(size_t bytes, bool pinned);
  void release(const std::shared_ptr<Slab>& slab, std::shared_ptr<CopyEngine> last);
  // The side stream of `device`: one per pool and device.
  c10::Stream sideStream(const c10::Device& device);
  // The registration of the slab whose memory starts at `base`, if one does.
  std::optional<Region> regionOf(const void* base) const;
  // Drops every slab and its registration (before the transport goes);
  // acquire() fails from then on.
  void clear();

  size_t slabs() const;
  size_t bytes() const;
  uint64_t allocations() const { return allocations_; }
  // Operations whose copies were pipelined, and their pieces.
  void notePipelined(size_t pieces) {
    pipelined_ops_.fetch_add(1);
    pipelined_pieces_.fetch_add(pieces);
  }
  uint64_t pipelinedOps() const { return pipelined_ops_.load(); }
  uint64_t pipelinedPieces() const { return pipelined_pieces_.load(); }

 private:
  void drop(std::vector<std::shared_ptr<Slab>>::iterator it);  // mu_ held

  Register reg_;
  Deregister dereg_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Slab>> slabs_;
  std::vector<c10::Stream> streams_;
  size_t keep_bytes_;
  uint64_t clock_ = 0;
  bool closed_ = false;
  uint64_t allocations_ = 0;
  std::atomic<uint64_t> pipelined_ops_{0}, pipelined_pieces_{0};
};

// One operation's stand-ins: built at the call (where a bad mix of devices
// is refused), copied in and out by the worker, released at the end.
class OpStaging {
 public:
  OpStaging(StagingPool& pool, StagingMode mode, std::optional<at::Device> bound, std::string name);
  ~OpStaging();

  // The tensor the operation uses for `t`: `t` itself when it is not staged,
  // else its host stand-in. in: the operation reads it (copied in);
  // out: writes it (copied back); inout: both.
  at::Tensor in(const at::Tensor& t) { return map(t, true, false); }
  at::Tensor out(const at::Tensor& t) { return map(t, false, true); }
  at::Tensor inout(const at::Tensor& t) { return map(t, true, true); }
  std::vector<at::Tensor> in(const std::vector<at::Tensor>& ts) { return map(ts, true, false); }
  std::vector<at::Tensor> out(const std::vector<at::Tensor>& ts) { return map(ts, false, true); }
  std::vector<at::Tensor> inout(const std::vector<at::Tensor>& ts) { return map(ts, true, true); }
  // inout(t) for an operation that works on t in place piece by piece (a
  // ring allreduce): the copy in is cut into `order` (byte spans of t, whole
  // elements, covering it once) that the operation takes one by one as they
  // land, and each part it finishes is copied back at once (pipeline()).
  // Whole copies where t is not staged, not contiguous, or too small to cut.
  at::Tensor inoutPipelined(const at::Tensor& t, const std::vector<collectives::Span>& order);
  // What the operation asks about its pipelined tensor; null when there is none.
  collectives::StagedBuffer* pipeline();

  // Whether any tensor is staged.
  bool active() const { return !slabs_.empty(); }
  // The devices of the caller's tensors (for the Work's future): empty on the CPU.
  std::vector<c10::Device> devices() const;
  // End of the call, on the caller's thread.
  void called();
  // On the worker: before the operation, after it (success only).
  void copyIn();
  void copyOut();
  // Hands the slabs back (after copyOut, or after a failure).
  void finish();
  std::shared_ptr<CopyEngine> copies() const { return copies_; }

 private:
  class Pipeline;
  at::Tensor map(const at::Tensor& t, bool read, bool write);
  std::vector<at::Tensor> map(const std::vector<at::Tensor>& ts, bool read, bool write);

  StagingPool& pool_;
  StagingMode mode_;
  std::optional<at::Device> bound_;
  std::string name_;
  std::optional<at::Device> device_;  // where the caller's tensors are (once one was seen)
  std::shared_ptr<CopyEngine> copies_;
  std::vector<std::shared_ptr<StagingPool::Slab>> slabs_;
  CopyEngine::Copies in_, out_;  // (host, caller), (caller, host)
  std::unique_ptr<Pipeline> pipeline_;
  bool finished_ = false;
};

}  // namespace c10d_glue
}  // namespace maestro
