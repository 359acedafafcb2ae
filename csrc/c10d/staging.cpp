#include "c10d/staging.hpp"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

#include "common/error.h"

namespace maestro {
namespace c10d_glue {
namespace {

constexpr size_t kMinSlab = size_t(64) << 10;

size_t slabSize(size_t bytes) {
  size_t size = kMinSlab;
  while (size < bytes) size <<= 1;
  return size;
}

// CPU tensors staged on purpose (MAESTRO_STAGING=force): plain copies, done
// when they return.
class HostCopies : public CopyEngine {
 public:
  void start(const Copies&) override {}
  void toHost(const Copies& copies) override {
    for (const auto& [dst, src] : copies) dst.copy_(src);
  }
  void toCaller(const Copies& copies) override {
    for (const auto& [dst, src] : copies) dst.copy_(src);
  }
  void streamWait() override {}
  void hostWait() override {}
  bool done() const override { return true; }
  std::optional<c10::Stream> stream() const override { return std::nullopt; }
};

// Device tensors: asynchronous copies (cudaMemcpyAsync between the device
// and the pinned slab, through torch's copy_) on the backend's side stream,
// ordered after the caller's stream by an event. Written against c10's
// device-generic stream and event interface, so it needs no CUDA headers:
// the build has it whenever torch has CUDA.
class DeviceCopies : public CopyEngine {
 public:
  DeviceCopies(c10::Device device, c10::Stream side)
      : device_(device),
        impl_(device.type()),
        side_(side),
        caller_(device.type()),
        staged_(device.type()),
        back_(device.type()) {}

  void start(const Copies& copies) override {
    caller_.record(impl_.getStream(device_));
    // The copies back go on the same stream, after this wait: a tensor the
    // caller's stream still reads is not overwritten early either.
    caller_.block(side_);
    c10::StreamGuard guard(side_);
    for (const auto& [dst, src] : copies) dst.copy_(src, /*non_blocking=*/true);
    staged_.record(side_);
  }

  void toHost(const Copies&) override {
    staged_.synchronize();  // the worker's thread waits; the caller's does not
  }

  void toCaller(const Copies& copies) override {
    c10::StreamGuard guard(side_);
    for (const auto& [dst, src] : copies) dst.copy_(src, /*non_blocking=*/true);
    back_.record(side_);
    recorded_ = true;
  }

  void streamWait() override {
    if (recorded_) back_.block(impl_.getStream(device_));
  }
  void hostWait() override {
    if (recorded_) back_.synchronize();
  }
  bool done() const override { return !recorded_ || back_.query(); }
  std::optional<c10::Stream> stream() const override { return side_; }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream side_;
  c10::Event caller_, staged_, back_;
  std::atomic<bool> recorded_{false};
};

}  // namespace

StagingMode stagingMode(const std::string& knob) {
  if (knob == "force") return StagingMode::kForce;
  if (knob == "off") return StagingMode::kOff;
  return StagingMode::kAuto;
}

bool stagingHasCuda() {
#ifdef MAESTRO_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// ---------------------------------------------------------------- pool

std::shared_ptr<StagingPool::Slab> StagingPool::acquire(size_t bytes, bool pinned) {
  std::lock_guard<std::mutex> lock(mu_);
  // Cleared: the transport the slabs were registered with is gone.
  if (closed_) fail("maestro: the process group was shut down");
  std::shared_ptr<Slab> best;
  for (const auto& s : slabs_) {
    if (s->busy || s->pinned != pinned || static_cast<size_t>(s->buffer.numel()) < bytes) continue;
    if (s->last && !s->last->done()) continue;  // its copies back still read it
    if (!best || s->buffer.numel() < best->buffer.numel()) best = s;
  }
  if (!best) {
    best = std::make_shared<Slab>();
    const int64_t size = static_cast<int64_t>(slabSize(bytes));
    best->buffer = at::empty({size}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
    best->region = reg_(best->buffer.data_ptr(), static_cast<size_t>(size));
    best->pinned = pinned;
    slabs_.push_back(best);
    ++allocations_;
  }
  best->busy = true;
  best->last.reset();
  best->used = ++clock_;
  return best;
}

void StagingPool::release(const std::shared_ptr<Slab>& slab, std::shared_ptr<CopyEngine> last) {
  std::lock_guard<std::mutex> lock(mu_);
  slab->busy = false;
  slab->last = std::move(last);
  // Keep the idle slabs within keep_bytes_ (always the largest one, which a
  // repeated large operation needs): drop the least recently used beyond it.
  size_t idle = 0, largest = 0;
  for (const auto& s : slabs_)
    if (!s->busy) {
      idle += s->buffer.numel();
      largest = std::max<size_t>(largest, s->buffer.numel());
    }
  const size_t keep = std::max(keep_bytes_, largest);
  while (idle > keep) {
    auto victim = slabs_.end();
    for (auto it = slabs_.begin(); it != slabs_.end(); ++it)
      if (!(*it)->busy && (*it)->buffer.numel() != static_cast<int64_t>(largest) && ((*it)->last == nullptr || (*it)->last->done()) &&
          (victim == slabs_.end() || (*it)->used < (*victim)->used))
        victim = it;
    if (victim == slabs_.end()) break;
    idle -= (*victim)->buffer.numel();
    drop(victim);
  }
}

void StagingPool::drop(std::vector<std::shared_ptr<Slab>>::iterator it) {
  if ((*it)->region.valid()) dereg_((*it)->region);
  (*it)->region = Region{};
  slabs_.erase(it);
}

void StagingPool::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  while (!slabs_.empty()) drop(slabs_.begin());
}

std::optional<Region> StagingPool::regionOf(const void* base) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : slabs_)
    if (s->buffer.data_ptr() == base && s->region.valid()) return s->region;
  return std::nullopt;
}

c10::Stream StagingPool::sideStream(const c10::Device& device) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : streams_)
    if (s.device() == device) return s;
  c10::impl::VirtualGuardImpl impl(device.type());
  streams_.push_back(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false));
  return streams_.back();
}

size_t StagingPool::slabs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slabs_.size();
}

size_t StagingPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : slabs_) n += s->buffer.numel();
  return n;
}

// ---------------------------------------------------------------- one operation

OpStaging::OpStaging(StagingPool& pool, StagingMode mode, std::optional<at::Device> bound, std::string name)
    : pool_(pool), mode_(mode), bound_(bound), name_(std::move(name)) {}

OpStaging::~OpStaging() { finish(); }

at::Tensor OpStaging::map(const at::Tensor& t, bool read, bool write) {
  if (!t.defined()) return t;  // the operation's own checks name it
  const at::Device d = t.device();
  if (d.is_cuda()) {
    if (mode_ == StagingMode::kOff)
      fail(name_, ": a tensor is on ", d.str(), " but MAESTRO_STAGING=off refuses CUDA tensors; set "
           "MAESTRO_STAGING=auto, or route them to NCCL with init_process_group(backend=\"cpu:maestro,cuda:nccl\")");
    if (!stagingHasCuda())
      fail(name_, ": a tensor is on ", d.str(), " but this maestro_torch was built against a torch without CUDA; "
           "rebuild it with a CUDA build of torch (pip install --no-build-isolation -e .)");
    MAESTRO_CHECK(d.has_index(), name_, ": a CUDA tensor without a device index");
    if (bound_ && bound_->is_cuda() && bound_->index() != d.index())
      fail(name_, ": a tensor is on ", d.str(), " but this process group is bound to ", bound_->str(),
           " (init_process_group(device_id=...)); move the tensor there");
  } else if (!d.is_cpu()) {
    fail(name_, ": a tensor is on ", d.str(), "; maestro supports CPU and CUDA tensors");
  }
  if (device_ && *device_ != d)
    fail(name_, ": tensors on ", device_->str(), " and on ", d.str(),
         " in one call; every tensor of a call must be on one device");
  device_ = d;
  if (d.is_cpu() && mode_ != StagingMode::kForce) return t;
  MAESTRO_CHECK(t.layout() == at::kStrided, name_, ": a tensor is ", c10::str(t.layout()),
                "; maestro supports dense (strided) tensors only");
  if (t.numel() == 0) return at::empty(t.sizes(), t.options().device(at::kCPU));  // nothing to move
  if (!copies_) {
    if (d.is_cpu()) copies_ = std::make_shared<HostCopies>();
    else copies_ = std::make_shared<DeviceCopies>(d, pool_.sideStream(d));
  }
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  std::shared_ptr<StagingPool::Slab> slab;
  try {
    slab = pool_.acquire(bytes, !d.is_cpu());
  } catch (const c10::Error& e) {  // torch's allocator (pinned memory): refused on every rank like any bad input
    fail(name_, ": no host memory to stage ", bytes, " bytes of a tensor on ", d.str(), ": ",
         e.what_without_backtrace());
  }
  slabs_.push_back(slab);
  at::Tensor host = slab->buffer.narrow(0, 0, static_cast<int64_t>(bytes)).view(t.scalar_type()).view(t.sizes());
  if (!d.is_cpu()) t.record_stream(*copies_->stream());
  if (read) in_.emplace_back(host, t);
  if (write) out_.emplace_back(t, host);
  return host;
}

std::vector<at::Tensor> OpStaging::map(const std::vector<at::Tensor>& ts, bool read, bool write) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(map(t, read, write));
  return out;
}

std::vector<c10::Device> OpStaging::devices() const {
  if (device_ && !device_->is_cpu()) return {*device_};
  return {};
}

void OpStaging::called() {
  if (copies_) copies_->start(in_);
}

void OpStaging::copyIn() {
  if (copies_) copies_->toHost(in_);
}

void OpStaging::copyOut() {
  if (copies_) copies_->toCaller(out_);
}

void OpStaging::finish() {
  if (finished_) return;
  finished_ = true;
  for (const auto& s : slabs_) pool_.release(s, copies_);
  in_.clear();
}

}  // namespace c10d_glue
}  // namespace maestro
