// Gather and scatter: the root and every other rank exchange one block
// directly (the "linear" algorithm of MPI libraries), over the handshake with
// every rank and the pairwise exchange of alltoall.cc. A binomial tree would
// cut the root's log-latency for tiny blocks but forwards every block up to
// log n times through intermediate ranks' staging memory; here each block
// crosses the network once, one-sided, from the sender's tensor straight
// into the receiver's (zero copy), and the root's n-1 transfers spread over
// all its paths -- the root's link is the bottleneck of any gather or
// scatter, and this keeps it busy with nothing but payload. The direct
// reduce (MAESTRO_ALGO=reduce:direct; the tuner takes the tree,
// tree_reduce.cc) is the same gather, into the root's scratch, reduced
// there.
#include <algorithm>

#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "common/error.h"

namespace maestro {
namespace collectives {
namespace {

// The root exchanges one block of `count` elements with every rank: it
// receives them (gather: `own` is the block each rank sends, `root_blocks`
// where the root takes them in) or sends them (scatter: `own` is where each
// rank takes its block in, `root_blocks` what the root sends). root_blocks
// matters on the root only.
void rooted(multipath::Engine& engine, uint64_t seq, OpKind kind, const Window& own,
            const std::vector<Window>& root_blocks, uint64_t count, DType dtype, int root, Deadline deadline) {
  OpContext ctx(engine, seq, opDesc(kind, dtype, count, ReduceOp{}, root), deadline);
  // Checked on every rank (an abort), so that no rank waits for one that refused.
  const int n = engine.size();
  if (root < 0 || root >= n) ctx.abort(strcat("root ", root, " is not a rank of this group of ", n));
  if (engine.rank() == root && static_cast<int>(root_blocks.size()) != n)
    ctx.abort(strcat("the root needs one block per rank (", n, "), got ", root_blocks.size()));
  const bool to_root = kind == OpKind::kGather;
  const uint64_t bytes = count * dtypeSize(dtype);
  ExchangePlan plan(n);
  (to_root ? plan.send : plan.recv)[root] = own;
  (to_root ? plan.send_bytes : plan.recv_bytes)[root] = bytes;
  if (engine.rank() == root)
    for (int p = 0; p < n; ++p) {
      (to_root ? plan.recv : plan.send)[p] = root_blocks[p];
      (to_root ? plan.recv_bytes : plan.send_bytes)[p] = bytes;
    }
  exchange(ctx, plan);
}

}  // namespace

void reduceDirect(OpContext& ctx, const Window& tensor, uint64_t count, DType dtype, ReduceOp op, int root) {
  multipath::Engine& engine = ctx.engine();
  const int n = ctx.size(), me = ctx.rank();
  const uint64_t bytes = count * dtypeSize(dtype);
  ExchangePlan plan(n);
  Region slots;
  if (me == root) {
    slots = engine.buffer(kScratchBuffer, std::max<uint64_t>(bytes * n, 1));
    for (int p = 0; p < n; ++p)
      if (p != root) {
        plan.recv[p] = Window{slots, bytes * p};
        plan.recv_bytes[p] = bytes;
      }
  } else {
    plan.send[root] = tensor;  // read in place: a non-root's tensor is not modified
    plan.send_bytes[root] = bytes;
  }
  exchange(ctx, plan);
  if (me != root || bytes == 0) return;
  auto* acc = static_cast<uint8_t*>(tensor.region.addr) + tensor.base;
  for (int p = 0; p < n; ++p)
    if (p != root) reduceInto(dtype, op, acc, static_cast<const uint8_t*>(slots.addr) + bytes * p, count);
  if (op == ReduceOp::kAvg) finishAvg(dtype, acc, count, n);
}

void gather(multipath::Engine& engine, uint64_t seq, const Window& input, const std::vector<Window>& outputs,
            uint64_t count, DType dtype, int root, Deadline deadline) {
  rooted(engine, seq, OpKind::kGather, input, outputs, count, dtype, root, deadline);
}

void scatter(multipath::Engine& engine, uint64_t seq, const std::vector<Window>& inputs, const Window& output,
             uint64_t count, DType dtype, int root, Deadline deadline) {
  rooted(engine, seq, OpKind::kScatter, output, inputs, count, dtype, root, deadline);
}

}  // namespace collectives
}  // namespace maestro
