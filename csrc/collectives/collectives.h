// The collectives, on top of the multipath engine (no torch here).
//
// Every function is called on every rank with the same seq (identical across
// ranks) and blocks until the operation is complete on this rank, or throws
// maestro::Error on every rank. Buffers are registered windows (see Window);
// the c10d layer handles tensors, registration and non-contiguity.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/op.h"
#include "collectives/reduce.h"
#include "collectives/staged_buffer.h"
#include "multipath/engine.h"

namespace maestro {
namespace collectives {

// Engine buffer slots the collectives use.
constexpr int kScratchBuffer = 0;  // reduce-scatter receive slots; a small reduce's slots at the root
constexpr int kWorkBuffer = 1;     // reduce_scatter's working copy of the input
constexpr int kStagingBuffer = 2;  // the caller's staging of a tensor it must copy (c10d glue)

// Ring allreduce, in place: reduce-scatter then allgather, segment-pipelined;
// the allgather phase writes straight into the peers' tensors. `staged`: the
// tensor is still being copied in and out (staged_buffer.h); null: it is in
// place.
void allreduce(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype,
               ReduceOp op, Deadline deadline, StagedBuffer* staged = nullptr);
// input: size*count elements; output (count elements) gets this rank's
// reduced block. The input is not modified.
void reduceScatter(multipath::Engine& engine, uint64_t seq, const void* input, void* output, uint64_t count,
                   DType dtype, ReduceOp op, Deadline deadline);
// output: size*count elements, written in place by the peers; block `rank`
// is copied from input (input may alias it).
void allgather(multipath::Engine& engine, uint64_t seq, const void* input, const Window& output, uint64_t count,
               DType dtype, Deadline deadline);
// Reduce to `root`, in place on the root; the other ranks' tensors are not
// modified (they reduce in a working copy). Ring reduce-scatter, then each
// reduced block travels the ring until it reaches the root.
void reduce(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype, ReduceOp op,
            int root, Deadline deadline);
// Every rank's input (count elements) lands in the root's outputs[rank]
// (outputs: on the root one window per rank, elsewhere ignored).
void gather(multipath::Engine& engine, uint64_t seq, const Window& input, const std::vector<Window>& outputs,
            uint64_t count, DType dtype, int root, Deadline deadline);
// The root's inputs[rank] (count elements) lands in that rank's output
// (inputs: on the root one window per rank, elsewhere ignored).
void scatter(multipath::Engine& engine, uint64_t seq, const std::vector<Window>& inputs, const Window& output,
             uint64_t count, DType dtype, int root, Deadline deadline);
// inputs[p] (send_counts[p] elements) lands in rank p's outputs[rank]; rank
// p must expect as many (recv_counts[rank] there) -- any mismatch fails on
// every rank. Pairwise exchange, zero copy.
void alltoall(multipath::Engine& engine, uint64_t seq, const std::vector<Window>& inputs,
              const std::vector<uint64_t>& send_counts, const std::vector<Window>& outputs,
              const std::vector<uint64_t>& recv_counts, DType dtype, Deadline deadline);
// Pipelined chain from root through the ring, in place.
void broadcast(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype,
               int root, Deadline deadline);
// Dissemination barrier over control messages.
void barrier(multipath::Engine& engine, uint64_t seq, Deadline deadline);

}  // namespace collectives
}  // namespace maestro
