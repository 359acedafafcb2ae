// ProcessGroupMaestro: the c10d Backend registered as "maestro".
//
// Gloo's model: every collective call checks its inputs on the calling
// thread (clear errors), takes the next sequence number -- identical on all
// ranks because collectives are called in the same order -- and queues the
// operation for the group's worker thread, which runs operations one at a
// time in sequence order, each with the group timeout as its deadline. The
// returned Work completes with the outputs or with the error. The first error
// of a running operation leaves the group unusable (its peers were aborted in
// the middle of it); later calls fail at once saying so. A call refused by
// the input checks before it ran does not.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
// TORCH_VERSION_*: torch 2.14 keeps them in headeronly/, older releases in the C++ API's include.
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "c10d/flight_recorder.hpp"
#include "c10d/op_memory.hpp"
#include "c10d/op_pipeline.hpp"
#include "c10d/staging.hpp"
#include "c10d/work.hpp"
#include "collectives/collectives.h"
#include "collectives/p2p.h"
#include "multipath/engine.h"
#include "multipath/registration_cache.h"

#ifndef TORCH_VERSION_MINOR
#error "maestro: torch's version header defines no TORCH_VERSION_MINOR"
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
#define MAESTRO_ABORT_HOOKS 1
#else
#define MAESTRO_ABORT_HOOKS 0
#endif

namespace maestro {
namespace c10d_glue {

class ProcessGroupMaestro : public ::c10d::Backend {
 public:
  // `global_ranks`: the default group's rank of each rank of this group;
  // empty for the default group itself. A group made on the default
  // group's ranks sends on the paths the default group opened (each group
  // on a channel of its own) where its path knobs match and
  // MAESTRO_SHARE_PATHS is on; it opens none of its own.
  ProcessGroupMaestro(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout, const std::map<std::string, std::string>& options,
                      const std::vector<int64_t>& global_ranks = {});
  // A group on `parent`'s paths, if it can (the engine decides with every rank).
  ProcessGroupMaestro(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout, const std::map<std::string, std::string>& options,
                      multipath::Engine::Parent parent);
  ~ProcessGroupMaestro() override;

  const std::string getBackendName() const override { return "maestro"; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  // The tensor collectives under their older names (_allgather_base,
  // _reduce_scatter_base, allgather_into_tensor_coalesced,
  // reduce_scatter_tensor_coalesced, alltoall_base): virtual in every torch
  // maestro builds with (2.11 to the pinned 2.14), where torch 2.14's newer
  // names (all_gather_single, ...) forward to them.
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                     const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                         const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  // Coalesced: several tensors in one collective (one message per segment
  // instead of one collective per tensor).
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                     std::vector<int64_t>& outputSplitSizes,
                                                     std::vector<int64_t>& inputSplitSizes,
                                                     const ::c10d::AllToAllOptions& opts) override;

  // Point to point (collectives/p2p.h): beside the collectives, not in
  // their sequence; either side may post first.
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // dist.monitored_barrier: point-to-point tokens to and from rank 0 on
  // maestro's reserved tags; rank 0 names the ranks that did not arrive
  // within the timeout, and tells the ranks that did.
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // Point-to-point tags maestro keeps for itself (as a user's int tag: the
  // 65536 lowest negative numbers); a user's send/recv on them is refused.
  static constexpr uint32_t kReservedTagBase = 0x80000000u;
  static constexpr uint32_t kReservedTags = 1u << 16;

  uint64_t getSequenceNumberForGroup() override {
    std::lock_guard<std::mutex> lock(mu_);
    return seq_;
  }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  // Splitting (ProcessGroup::splitGroup: dist.split_group, DeviceMesh on a
  // group bound to a device): the ranks listed (this group's ranks, in the
  // new group's order) form a new maestro group over the store given, with
  // this group's knobs and the options' timeout; a rank not listed gets
  // nullptr and takes no part. The new group has its own engine; it sends
  // on this group's paths as a group made by new_group does.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<::c10d::Backend::Options>& opts) override;
  // What splitGroup() hands a child: the backend's name and its timeout
  // (the knobs are the group's own and go to split() directly).
  c10::intrusive_ptr<::c10d::Backend::Options> getBackendOptions() override;
  // Shrinking (dist.shrink_group): the ranks not excluded form a new maestro
  // group on this group's paths (as split() does), meeting in this group's
  // store under a key of their own -- so the store must outlive the excluded
  // ranks (torchrun's agent hosts it). It works after this group failed on
  // the excluded ranks' account; SHRINK_ABORT first aborts this group (its
  // running operation fails), the new group keeps the paths.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                             const c10::intrusive_ptr<::c10d::Backend::Options>& opts) override;
  void shutdown() override;
  void abort() override;
  // Abort hooks (ProcessGroup.register_abort_hook): each runs once, before
  // the group is given up -- on abort() (on the caller's thread), or when an
  // operation fails or times out and leaves the group unusable (on the
  // worker, before that operation's Work completes with the error). Not on
  // shutdown(). A hook that raises is logged and the others still run.
  // c10d has them since torch 2.14 (the release pinned); built against an
  // older torch, the group has none (and torch offers no way to add one).
#if MAESTRO_ABORT_HOOKS
  void registerAbortHook(int64_t hook_id, ::c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hook_id) override;
#endif
  // At the interpreter's exit (maestro_torch registers it with atexit):
  // aborts every group of this process still alive, so its peers get a
  // goodbye on every path -- a script that ends without
  // destroy_process_group is not taken for a crash. Returns how many.
  static int abortAllAtExit();

  // Introspection for maestro_torch.path_stats() and the INFO log.
  // After shutdown() they raise "the process group was shut down".
  std::vector<multipath::PathStats> pathStats() const { return live("path_stats")->pathStats(); }
  // The set-up, the knobs, the paths, then the tuner's choices for this group.
  std::string describe() const;
  std::string transportName() const { return live("transport")->transportName(); }
  int paths() const { return live("paths")->paths(); }
  // The group's channel on the paths it shares with its parent group; 0
  // where it sends on paths of its own.
  int channel() const { return static_cast<int>(live("channel")->channel()); }
  std::map<std::string, double> cacheStats() const;
  std::map<std::string, double> stagingStats() const {
    return {{"slabs", static_cast<double>(staging_pool_->slabs())},
            {"bytes", static_cast<double>(staging_pool_->bytes())},
            {"allocations", static_cast<double>(staging_pool_->allocations())},
            {"pipelined_ops", static_cast<double>(staging_pool_->pipelinedOps())},
            {"pipelined_pieces", static_cast<double>(staging_pool_->pipelinedPieces())}};
  }
  std::vector<double> chunkTimes(bool clear) { return live("chunk_times")->chunkTimes(clear); }
  // The flight record (maestro_torch.dump()): FlightRecorder::json.
  std::string dumpJson() const;

 private:
  struct Pending {
    uint64_t seq;
    c10::intrusive_ptr<MaestroWork> work;
    Run run;
    std::chrono::milliseconds timeout = ::c10d::kUnsetTimeout;  // unset: the group's
    std::shared_ptr<OpStaging> staging;  // null, or the host stand-ins it copies in and out
  };

  // The op pipeline (op_pipeline.hpp, op_pipeline.cpp). A collective: stage
  // and check (`declare`), then queue its run under the next sequence
  // number.
  c10::intrusive_ptr<::c10d::Work> collective(const OpInfo& op, std::chrono::milliseconds timeout,
                                              const Declare& declare);
  // A point-to-point call: stage and check, then post it (peer -1: any
  // source, a recv only).
  c10::intrusive_ptr<::c10d::Work> pointToPoint(const OpInfo& op, bool send, std::vector<at::Tensor>& tensors,
                                                int peer, int tag);
  // The Work of a call that passed its checks, showing the caller's
  // `outputs` and `inputs`; an active `staging`'s copies in start.
  c10::intrusive_ptr<MaestroWork> workOf(const OpInfo& op, uint64_t seq, std::vector<at::Tensor> outputs,
                                         std::vector<at::Tensor> inputs, OpStaging* staging);
  // An input check failed on this rank: abort the operation it would have
  // been on every rank (so no peer waits for it), then throw. The sequence
  // number is used up, so the ranks stay in step; this rank stays usable.
  [[noreturn]] void reject(const OpInfo& op, const std::string& why);
  // On the worker: steps 4 and 5 of a queued operation.
  void runQueued(Pending& p);
  // What the memory strategies register with: the group's now (under mu_,
  // but on the worker, as engine_ and cache_ are).
  MemorySource memorySource() const { return {cache_.get(), staging_pool_.get(), engine_.get()}; }

  // gather (`gathers`) or scatter: `ones`, this rank's tensor (one), and
  // on the root `lists` (one list of a tensor per rank).
  c10::intrusive_ptr<::c10d::Work> rooted(bool gathers, std::vector<at::Tensor>& ones,
                                          std::vector<std::vector<at::Tensor>>& lists, int64_t root_rank,
                                          std::chrono::milliseconds timeout);
  // The one tensor of a broadcast or a reduce, staged as the call `reads`
  // and `writes` it, checked with its root.
  at::Tensor rootedOne(OpStaging& st, std::vector<at::Tensor>& tensors, int64_t root, int64_t root_tensor, bool reads,
                       bool writes, const char* name);
  // Allgather of several tensors as one: `inputs` packed into one block per
  // rank, which lands on `blocks` (rank by rank, input by input; views of
  // the outputs, filled by the copy back).
  void allgatherBlocks(const OpRun& r, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& blocks);
  void workerLoop();
  void stopWorker(bool drain);
  // The engine, or an error naming `what` once the group was shut down
  // (the caller's copy keeps it alive through a concurrent shutdown).
  std::shared_ptr<multipath::Engine> live(const char* what) const;

  const std::map<std::string, std::string> knobs_;  // as given at construction (split() passes them on)
  std::shared_ptr<multipath::Engine> engine_;  // guarded by mu_ for threads other than the worker
  std::unique_ptr<collectives::PointToPoint> p2p_;
  std::atomic<uint32_t> monitored_barriers_{0};  // calls so far: each one's tag  // stopped before the cache and the engine go
  std::shared_ptr<multipath::RegistrationCache> cache_;
  StagingMode staging_mode_;
  uint64_t staging_piece_ = 0;  // MAESTRO_STAGING_PIECE (read at construction: the engine goes at shutdown)
  std::shared_ptr<StagingPool> staging_pool_;
  std::atomic<std::chrono::milliseconds> timeout_;
  const c10::intrusive_ptr<::c10d::Store> store_;  // where shrink()'s survivors meet
  std::atomic<uint64_t> shrinks_{0};

  std::mutex stop_mu_;  // one stopWorker() at a time: a second waits, then finds nothing to stop
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool running_ = false;             // the worker is inside an operation
  std::condition_variable idle_cv_;  // queue_ empty and !running_
  // How long shutdown() lets queued operations finish before it fails them.
  static constexpr std::chrono::seconds kShutdownGrace{10};
  // How often an idle worker drops registrations of tensors that died.
  static constexpr std::chrono::milliseconds kSweepInterval{500};
  uint64_t seq_ = 0;
  bool stopping_ = false;
  std::exception_ptr broken_;  // the first failure
  std::string broken_what_;
  void runAbortHooks(const std::string& why);  // once per group
  void writeDump();                             // MAESTRO_DUMP, at the group's first failure
  FlightRecorder recorder_;
  std::mutex hooks_mu_;
#if MAESTRO_ABORT_HOOKS
  std::map<int64_t, ::c10d::AbortHook> abort_hooks_;
#endif
  bool hooks_ran_ = false;
  std::thread worker_;
};

}  // namespace c10d_glue
}  // namespace maestro
