// The c10d op pipeline: every collective and point-to-point call of
// ProcessGroupMaestro takes the same steps (op_pipeline.cpp), as every
// operation of ProcessGroupNCCL goes through its collective() or
// pointToPoint():
//
//   1. stage    an OpStaging for the call: the declaration reads its tensors
//               through it (in / out / inout), so a CUDA tensor's host
//               stand-in is what every later step sees (staging.hpp);
//   2. checks   the declaration checks its arguments; an Error rejects a
//               collective on every rank (reject(): its sequence number is
//               used up, the peers abort it), a point-to-point call raises
//               on this rank alone;
//   3. enqueue  a collective takes the next sequence number and goes to the
//      / post   group's worker; a point-to-point call takes none and is
//               posted at once; either way the Work shows the caller's
//               tensors (torch's flight recorder and profiler read them);
//   4. run      the staging's copies in, then the declaration's run, on the
//               memory strategies it chooses (OpMemory, op_memory.hpp);
//   5. copy back  the strategies' copies back, then the staging's copies out;
//               the Work completes.
//
// An operation is declared once: its entry below (c10d's OpType and one
// name, torch.distributed's, from which its profiling title and its error
// messages both derive) and its override in collective_ops.cpp, which holds
// only what is its own: its checks and its run.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "c10d/op_memory.hpp"
#include "c10d/staging.hpp"
#include "common/clock.h"

namespace maestro {
namespace c10d_glue {

struct OpInfo {
  ::c10d::OpType type;
  const char* name;   // in error messages: "maestro all_reduce #3 rejected on rank 1: ..."
  const char* title;  // "maestro:<name>": the Work's profiling title, in maestro's and torch's flight recorders
};

namespace ops {

// The Work types of the coalesced tensor collectives: their own since torch
// 2.14 (the release pinned in requirements/torch.txt); torch 2.11 has only
// COALESCED for both.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
constexpr auto kAllgatherIntoTensorCoalescedType = ::c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
constexpr auto kReduceScatterTensorCoalescedType = ::c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr auto kAllgatherIntoTensorCoalescedType = ::c10d::OpType::COALESCED;
constexpr auto kReduceScatterTensorCoalescedType = ::c10d::OpType::COALESCED;
#endif

#define MAESTRO_C10D_OP(type, name) OpInfo{type, #name, "maestro:" #name}
using OpType = ::c10d::OpType;
// Reductions.
inline constexpr OpInfo kAllReduce = MAESTRO_C10D_OP(OpType::ALLREDUCE, all_reduce);
inline constexpr OpInfo kAllReduceCoalesced = MAESTRO_C10D_OP(OpType::ALLREDUCE_COALESCED, all_reduce_coalesced);
inline constexpr OpInfo kReduce = MAESTRO_C10D_OP(OpType::REDUCE, reduce);
// Reduce-scatters.
inline constexpr OpInfo kReduceScatter = MAESTRO_C10D_OP(OpType::REDUCE_SCATTER, reduce_scatter);
inline constexpr OpInfo kReduceScatterTensor = MAESTRO_C10D_OP(OpType::_REDUCE_SCATTER_BASE, reduce_scatter_tensor);
inline constexpr OpInfo kReduceScatterTensorCoalesced =
    MAESTRO_C10D_OP(kReduceScatterTensorCoalescedType, reduce_scatter_tensor_coalesced);
// All-gathers.
inline constexpr OpInfo kAllGather = MAESTRO_C10D_OP(OpType::ALLGATHER, all_gather);
inline constexpr OpInfo kAllGatherIntoTensor = MAESTRO_C10D_OP(OpType::_ALLGATHER_BASE, all_gather_into_tensor);
inline constexpr OpInfo kAllGatherCoalesced = MAESTRO_C10D_OP(OpType::ALLGATHER_COALESCED, all_gather_coalesced);
inline constexpr OpInfo kAllGatherIntoTensorCoalesced =
    MAESTRO_C10D_OP(kAllgatherIntoTensorCoalescedType, all_gather_into_tensor_coalesced);
// One root and every rank.
inline constexpr OpInfo kBroadcast = MAESTRO_C10D_OP(OpType::BROADCAST, broadcast);
inline constexpr OpInfo kGather = MAESTRO_C10D_OP(OpType::GATHER, gather);
inline constexpr OpInfo kScatter = MAESTRO_C10D_OP(OpType::SCATTER, scatter);
// Every rank with every rank; no data.
inline constexpr OpInfo kAllToAll = MAESTRO_C10D_OP(OpType::ALLTOALL, all_to_all);
inline constexpr OpInfo kAllToAllSingle = MAESTRO_C10D_OP(OpType::ALLTOALL_BASE, all_to_all_single);
inline constexpr OpInfo kBarrier = MAESTRO_C10D_OP(OpType::BARRIER, barrier);
// Point to point (no sequence number). dist.recv(src=None) is c10d's
// recvAnySource, the name torch's profiler tests look for.
inline constexpr OpInfo kSend = MAESTRO_C10D_OP(OpType::SEND, send);
inline constexpr OpInfo kRecv = MAESTRO_C10D_OP(OpType::RECV, recv);
inline constexpr OpInfo kRecvAnySource = MAESTRO_C10D_OP(OpType::RECVANYSOURCE, recvAnySource);
#undef MAESTRO_C10D_OP

}  // namespace ops

// What an operation's run is given (step 4): on the worker, its sequence
// number and deadline, and the memory its strategies take from.
struct OpRun {
  uint64_t seq;
  Deadline deadline;
  OpMemory& memory;
};
using Run = std::function<void(const OpRun&)>;

// What a collective's declaration hands the pipeline once its checks passed.
struct Call {
  std::vector<at::Tensor> outputs, inputs;  // the caller's tensors, as the Work shows them
  Run run;                                  // on their host stand-ins where the staging made any
};

// A collective's declaration: steps 1 and 2 (its tensors read through
// `staging`, then checked; `name` is its OpInfo's), then its Call.
using Declare = std::function<Call(OpStaging& staging, const char* name)>;

}  // namespace c10d_glue
}  // namespace maestro
