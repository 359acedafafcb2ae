// Where an operation's bytes are while its collective runs: the memory
// strategies the c10d operations choose from (the run step of the op
// pipeline, op_pipeline.hpp).
//
//   in place    a tensor's own memory, registered, when it is contiguous;
//               else a copy in the engine's staging buffer
//   pinned      each tensor of a list in its own registered memory (zero
//               copy); a non-contiguous one through a contiguous copy of its
//               own, registered too
//   staged      a block of the engine's staging buffer (registered once,
//               reused by every operation, shrunk when unused)
//   packed      a list, one tensor after another, in one block: in the staging
//               buffer (a window the peers read or write), or local (a
//               temporary the collective reads or writes by address)
//   contiguous  a tensor itself, or a contiguous temporary, by address
//
// Each strategy says whether the collective reads the tensors (their bytes
// are copied in) or writes them (copyBack(), the pipeline's copy-back step,
// copies the results into them), or both. An operation takes at most one
// block of the staging buffer (staged, packed, or in place of a
// non-contiguous tensor). Registrations stay pinned in the registration
// cache for as long as the OpMemory lives.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "c10d/staging.hpp"
#include "collectives/collectives.h"
#include "multipath/engine.h"
#include "multipath/registration_cache.h"

namespace maestro {
namespace c10d_glue {

// What the strategies register with: the group's registration cache (the
// callers' tensors), its staging slabs (a CUDA tensor's host stand-ins,
// registered already) and its engine (the staging buffer).
struct MemorySource {
  multipath::RegistrationCache* cache = nullptr;
  const StagingPool* slabs = nullptr;
  multipath::Engine* engine = nullptr;

  // A registered window over a CPU tensor's memory (empty for an empty one);
  // its storage stays pinned in the cache until release().
  collectives::Window window(const at::Tensor& t) const;
  void release(const at::Tensor& t) const;
};

// A registered window over a contiguous CPU tensor, pinned for the scope of
// the object. Empty tensors get an empty window.
class Pinned {
 public:
  Pinned(const MemorySource& source, const at::Tensor& t);
  ~Pinned();
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;

  collectives::Window window;

 private:
  MemorySource source_;
  at::Tensor tensor_;
};

// One operation's memory, on the thread that runs it.
class OpMemory {
 public:
  enum Access : unsigned { kRead = 1, kWrite = 2, kReadWrite = kRead | kWrite };
  // A contiguous CPU tensor and its registered window.
  struct Staged {
    at::Tensor tensor;
    collectives::Window window;
  };

  explicit OpMemory(const MemorySource& source) : source_(source) {}
  OpMemory(const OpMemory&) = delete;
  OpMemory& operator=(const OpMemory&) = delete;

  collectives::Window inPlace(const at::Tensor& t, Access access);
  std::vector<collectives::Window> pinned(const std::vector<at::Tensor>& ts, Access access);
  // `numel` elements of the staging buffer, as they are (nothing copied).
  Staged staged(int64_t numel, const at::TensorOptions& options);
  Staged packed(const std::vector<at::Tensor>& ts, Access access);
  at::Tensor packedLocal(const std::vector<at::Tensor>& ts, Access access);
  at::Tensor contiguous(const at::Tensor& t, Access access);

  // The copy-back step: every copy the collective wrote goes into the tensor
  // it stands for: the copies of one strategy's tensors in their order, the
  // strategy chosen last first (a packed list of views into a contiguous
  // temporary goes back before the temporary does).
  void copyBack();

 private:
  // Opens the copies back of one strategy's tensors; back() adds to them.
  void open() { groups_.push_back(back_.size()); }
  void back(const at::Tensor& tensor, const at::Tensor& copy) { back_.emplace_back(tensor, copy); }
  // One after another in `block`, each tensor's elements: copied in when
  // read, back when written.
  void pack(const std::vector<at::Tensor>& ts, const at::Tensor& block, Access access);
  at::Tensor contiguousOne(const at::Tensor& t, Access access);

  MemorySource source_;
  bool staged_ = false;  // the staging buffer's block is taken
  std::vector<std::unique_ptr<Pinned>> pins_;
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (tensor, its copy)
  std::vector<size_t> groups_;                           // where each strategy's copies start in back_
};

}  // namespace c10d_glue
}  // namespace maestro
