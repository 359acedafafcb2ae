#include "c10d/op_memory.hpp"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>

#include "common/error.h"

namespace maestro {
namespace c10d_glue {

collectives::Window MemorySource::window(const at::Tensor& t) const {
  const c10::Storage& storage = t.storage();
  void* base = storage.mutable_data();
  size_t nbytes = storage.nbytes();
  if (nbytes == 0 || base == nullptr) return collectives::Window{};
  const uint64_t offset =
      static_cast<uint64_t>(static_cast<const uint8_t*>(t.data_ptr()) - static_cast<const uint8_t*>(base));
  // A staging slab (a CUDA tensor's host stand-in) is registered already.
  if (auto slab = slabs->regionOf(base)) return collectives::Window{*slab, offset};
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(storage.getWeakStorageImpl());
  Region r = cache->acquire(storage.unsafeGetStorageImpl(), base, nbytes, [weak] { return !weak.expired(); });
  return collectives::Window{r, offset};
}

void MemorySource::release(const at::Tensor& t) const {
  if (t.storage().nbytes() > 0) cache->unpin(t.storage().unsafeGetStorageImpl());
}

Pinned::Pinned(const MemorySource& source, const at::Tensor& t) : source_(source), tensor_(t) {
  window = source_.window(t);
}

Pinned::~Pinned() { source_.release(tensor_); }

collectives::Window OpMemory::inPlace(const at::Tensor& t, Access access) {
  if (!t.is_contiguous()) return packed({t}, access).window;
  pins_.push_back(std::make_unique<Pinned>(source_, t));
  return pins_.back()->window;
}

std::vector<collectives::Window> OpMemory::pinned(const std::vector<at::Tensor>& ts, Access access) {
  std::vector<collectives::Window> windows;
  open();
  for (const auto& t : ts) {
    pins_.push_back(std::make_unique<Pinned>(source_, contiguousOne(t, access)));
    windows.push_back(pins_.back()->window);
  }
  return windows;
}

OpMemory::Staged OpMemory::staged(int64_t numel, const at::TensorOptions& options) {
  // A second block would resize the buffer under the first.
  MAESTRO_CHECK(!staged_, "maestro: internal error: an operation took two blocks of the staging buffer");
  staged_ = true;
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  Region r = source_.engine->buffer(collectives::kStagingBuffer, std::max<size_t>(bytes, 1));
  return Staged{at::from_blob(r.addr, {numel}, options.device(at::kCPU).requires_grad(false)),
                collectives::Window{r, 0}};
}

OpMemory::Staged OpMemory::packed(const std::vector<at::Tensor>& ts, Access access) {
  int64_t total = 0;
  for (const auto& t : ts) total += t.numel();
  Staged block = staged(total, ts.at(0).options());
  pack(ts, block.tensor, access);
  return block;
}

at::Tensor OpMemory::packedLocal(const std::vector<at::Tensor>& ts, Access access) {
  if (access & kRead) {
    std::vector<at::Tensor> flat;
    for (const auto& t : ts) flat.push_back(t.reshape({-1}));
    at::Tensor block = at::cat(flat);
    if (access & kWrite) pack(ts, block, kWrite);
    return block;
  }
  int64_t total = 0;
  for (const auto& t : ts) total += t.numel();
  at::Tensor block = at::empty({total}, ts.at(0).options());
  pack(ts, block, access);
  return block;
}

at::Tensor OpMemory::contiguous(const at::Tensor& t, Access access) {
  open();
  return contiguousOne(t, access);
}

at::Tensor OpMemory::contiguousOne(const at::Tensor& t, Access access) {
  if (t.is_contiguous()) return t;
  at::Tensor copy = access & kRead ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous);
  if (access & kWrite) back(t, copy);
  return copy;
}

void OpMemory::pack(const std::vector<at::Tensor>& ts, const at::Tensor& block, Access access) {
  open();
  int64_t at = 0;
  for (const auto& t : ts) {
    at::Tensor part = block.narrow(0, at, t.numel()).view(t.sizes());
    if (access & kRead) part.copy_(t);
    if (access & kWrite) back(t, part);
    at += t.numel();
  }
}

void OpMemory::copyBack() {
  size_t end = back_.size();
  for (auto start = groups_.rbegin(); start != groups_.rend(); end = *start++)
    for (size_t i = *start; i < end; ++i) back_[i].first.copy_(back_[i].second);
}

}  // namespace c10d_glue
}  // namespace maestro
