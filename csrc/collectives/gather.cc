// Gather and scatter: the root and every other rank exchange one block
// directly (the "linear" algorithm of MPI libraries), over the handshake with
// every rank and the pairwise exchange of alltoall.cc. A binomial tree would
// cut the root's log-latency for tiny blocks but forwards every block up to
// log n times through intermediate ranks' staging memory; here each block
// crosses the network once, one-sided, from the sender's tensor straight
// into the receiver's (zero copy), and the root's n-1 transfers spread over
// all its paths -- the root's link is the bottleneck of any gather or
// scatter, and this keeps it busy with nothing but payload.
#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "common/error.h"

namespace maestro {
namespace collectives {
namespace {

OpDesc rootedDesc(OpKind kind, uint64_t count, DType dtype, int root) {
  OpDesc desc;
  desc.kind = static_cast<uint8_t>(kind);
  desc.dtype = static_cast<uint8_t>(dtype);
  desc.root = root;
  desc.count = count;
  return desc;
}

// On every rank (an abort), so that no rank waits for one that refused.
void checkRoot(OpContext& ctx, int root, size_t blocks) {
  const int n = ctx.size();
  if (root < 0 || root >= n) ctx.abort(strcat("root ", root, " is not a rank of this group of ", n));
  if (ctx.rank() == root && static_cast<int>(blocks) != n)
    ctx.abort(strcat("the root needs one block per rank (", n, "), got ", blocks));
}

}  // namespace

void gather(multipath::Engine& engine, uint64_t seq, const Window& input, const std::vector<Window>& outputs,
            uint64_t count, DType dtype, int root, Deadline deadline) {
  OpContext ctx(engine, seq, rootedDesc(OpKind::kGather, count, dtype, root), deadline);
  checkRoot(ctx, root, outputs.size());
  const uint64_t bytes = count * dtypeSize(dtype);
  ExchangePlan plan(engine.size());
  plan.send[root] = input;
  plan.send_bytes[root] = bytes;
  if (engine.rank() == root)
    for (int p = 0; p < engine.size(); ++p) {
      plan.recv[p] = outputs[p];
      plan.recv_bytes[p] = bytes;
    }
  exchange(ctx, plan);
}

void scatter(multipath::Engine& engine, uint64_t seq, const std::vector<Window>& inputs, const Window& output,
             uint64_t count, DType dtype, int root, Deadline deadline) {
  OpContext ctx(engine, seq, rootedDesc(OpKind::kScatter, count, dtype, root), deadline);
  checkRoot(ctx, root, inputs.size());
  const uint64_t bytes = count * dtypeSize(dtype);
  ExchangePlan plan(engine.size());
  plan.recv[root] = output;
  plan.recv_bytes[root] = bytes;
  if (engine.rank() == root)
    for (int p = 0; p < engine.size(); ++p) {
      plan.send[p] = inputs[p];
      plan.send_bytes[p] = bytes;
    }
  exchange(ctx, plan);
}

}  // namespace collectives
}  // namespace maestro
