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
  size_t staged(const Copies&, size_t) override { return made_; }
  void stageOne(const Copies& copies, size_t i) override {
    for (; made_ <= i; ++made_) copies[made_].first.copy_(copies[made_].second);
  }
  void toCaller(const Copies& copies) override {
    for (const auto& [dst, src] : copies) dst.copy_(src);
  }
  void streamWait() override {}
  void hostWait() override {}
  bool done() const override { return true; }
  std::optional<c10::Stream> stream() const override { return std::nullopt; }

 private:
  size_t made_ = 0;  // the copies in made so far (in order)
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
        back_(device.type()) {}

  void start(const Copies& copies) override {
    caller_.record(impl_.getStream(device_));
    // The copies back go on the same stream, after this wait: a tensor the
    // caller's stream still reads is not overwritten early either.
    caller_.block(side_);
    c10::StreamGuard guard(side_);
    // An event after each copy: the worker takes each as soon as it is in.
    for (const auto& [dst, src] : copies) {
      dst.copy_(src, /*non_blocking=*/true);
      staged_.push_back(std::make_unique<c10::Event>(device_.type()));
      staged_.back()->record(side_);
    }
  }

  size_t staged(const Copies&, size_t from) override {
    size_t i = std::max(from, known_);
    while (i < staged_.size() && staged_[i]->query()) ++i;
    return known_ = i;
  }

  void stageOne(const Copies&, size_t i) override {
    staged_[i]->synchronize();  // the worker's thread waits; the caller's does not
    known_ = std::max(known_, i + 1);
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
  // The side stream runs its copies in order: the last event recorded
  // covers every copy before it.
  bool done() const override {
    if (recorded_) return back_.query();
    return staged_.empty() || staged_.back()->query();
  }
  std::optional<c10::Stream> stream() const override { return side_; }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream side_;
  c10::Event caller_, back_;
  std::vector<std::unique_ptr<c10::Event>> staged_;  // one per copy in, in order (fixed by start())
  size_t known_ = 0;                                 // the copies in known complete (the worker's)
  std::atomic<bool> recorded_{false};
};

// Bytes of a contiguous tensor, as a flat uint8 view of the same memory.
at::Tensor bytesOf(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

}  // namespace

// The pipelined tensor of an operation: which of its pieces are in place,
// and the copy back of each part the operation reports final.
class OpStaging::Pipeline : public collectives::StagedBuffer {
 public:
  Pipeline(OpStaging& op, const at::Tensor& caller, const at::Tensor& host, size_t first,
           std::vector<collectives::Span> pieces)
      : op_(op), caller_(bytesOf(caller)), host_(bytesOf(host)), first_(first), pieces_(std::move(pieces)) {}

  bool ready(uint64_t offset, uint64_t bytes) override {
    if (bytes == 0) return true;
    staged_ = op_.copies_->staged(op_.in_, staged_);
    for (size_t j = 0; j < pieces_.size(); ++j) {
      const collectives::Span& p = pieces_[j];
      if (p.offset < offset + bytes && offset < p.offset + p.bytes && first_ + j >= staged_) return false;
    }
    return true;
  }

  bool stageMore() override {
    staged_ = op_.copies_->staged(op_.in_, staged_);
    if (staged_ >= first_ + pieces_.size()) return false;
    op_.copies_->stageOne(op_.in_, staged_);
    ++staged_;
    return true;
  }

  void final(uint64_t offset, uint64_t bytes) override {
    const auto off = static_cast<int64_t>(offset), len = static_cast<int64_t>(bytes);
    op_.copies_->toCaller({{caller_.narrow(0, off, len), host_.narrow(0, off, len)}});
    final_bytes_ += bytes;
  }

  // Its first piece in op_.in_ (the entries before it are copied whole).
  size_t first() const { return first_; }
  // Whether every byte was reported final (and copied back).
  bool complete() const { return final_bytes_ == static_cast<uint64_t>(caller_.numel()); }
  // The whole tensor back, where the operation did not report it (a group of one).
  void copyBackWhole() {
    op_.copies_->toHost(op_.in_);
    op_.copies_->toCaller({{caller_, host_}});
  }

 private:
  OpStaging& op_;
  at::Tensor caller_, host_;  // flat bytes
  size_t first_;              // its first piece in op_.in_
  std::vector<collectives::Span> pieces_;
  size_t staged_ = 0;  // op_.in_ entries known in place
  uint64_t final_bytes_ = 0;
};

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

at::Tensor OpStaging::inoutPipelined(const at::Tensor& t, const std::vector<collectives::Span>& order) {
  if (!t.defined() || !t.is_contiguous() || order.size() < 2 || pipeline_) return inout(t);
  at::Tensor host = map(t, false, false);
  if (host.is_same(t) || host.numel() == 0) return host;  // not staged, or nothing to move
  const at::Tensor caller = bytesOf(t), staged = bytesOf(host);
  const size_t first = in_.size();
  for (const auto& p : order) {
    const auto off = static_cast<int64_t>(p.offset), len = static_cast<int64_t>(p.bytes);
    in_.emplace_back(staged.narrow(0, off, len), caller.narrow(0, off, len));
  }
  pipeline_ = std::make_unique<Pipeline>(*this, t, host, first, order);
  pool_.notePipelined(order.size());
  return host;
}

collectives::StagedBuffer* OpStaging::pipeline() { return pipeline_.get(); }

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
  // The pipelined tensor's pieces are taken by the operation as they land.
  if (copies_) copies_->toHost(in_, pipeline_ ? pipeline_->first() : in_.size());
}

void OpStaging::copyOut() {
  if (!copies_) return;
  if (pipeline_ && !pipeline_->complete()) pipeline_->copyBackWhole();
  copies_->toCaller(out_);
}

void OpStaging::finish() {
  if (finished_) return;
  finished_ = true;
  for (const auto& s : slabs_) pool_.release(s, copies_);
  in_.clear();
}

}  // namespace c10d_glue
}  // namespace maestro
