// Reduce by a binomial tree: log2(n) steps, each rank receiving the
// partial results of its subtrees and sending one (the tuner chooses it
// for reduces above the direct one's limit, tuner.h; tree_reduce.cc says how it
// runs).
#pragma once

#include <cstdint>

#include "collectives/op.h"
#include "collectives/reduce.h"

namespace maestro {
namespace collectives {

// The reduction of every rank's `tensor` (count elements) into the root's;
// the other ranks' tensors are read, not modified. ctx's descriptor names
// the algorithm.
void reduceTree(OpContext& ctx, const Window& tensor, uint64_t count, DType dtype, ReduceOp op, int root);

}  // namespace collectives
}  // namespace maestro
