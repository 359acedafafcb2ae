// Allreduce by recursive doubling: log2(n) exchanges of the whole tensor,
// for tensors small enough that steps, not bytes, are the cost (the tuner
// chooses it, tuner.h; recursive_doubling.cc says how it runs).
#pragma once

#include <cstdint>

#include "collectives/op.h"
#include "collectives/reduce.h"
#include "collectives/staged_buffer.h"

namespace maestro {
namespace collectives {

// In place on `tensor` (count elements), on every rank of ctx's group;
// `staged`: the tensor is still being copied in (it is waited for whole)
// and is reported final whole. ctx's descriptor names the algorithm.
void allreduceRecursiveDoubling(OpContext& ctx, const Window& tensor, uint64_t count, DType dtype, ReduceOp op,
                                StagedBuffer* staged);

}  // namespace collectives
}  // namespace maestro
