// Broadcast: a pipelined chain root -> root+1 -> ... through the ring. Each
// rank forwards a segment to the next one as soon as it has landed, straight
// into the next rank's tensor.
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/plan.h"
#include "common/error.h"

namespace maestro {
namespace collectives {

void broadcast(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype, int root,
               Deadline deadline) {
  OpContext ctx(engine, seq, opDesc(OpKind::kBroadcast, dtype, count, ReduceOp{}, root), deadline);
  const int n = engine.size();
  MAESTRO_CHECK(root >= 0 && root < n, "broadcast root ", root, " is not a rank of this group of ", n);
  if (n == 1) return;
  std::vector<RemoteWindow> theirs = ctx.handshake({tensor});
  const int pos = (ctx.rank() - root + n) % n;  // position in the chain
  const bool receives = pos > 0, forwards = pos < n - 1;
  const uint64_t bytes = count * dtypeSize(dtype);
  const Segmentation seg = segmentBlocks({Span{0, bytes}}, engine.config().segment_size, kMessagesPerOp);
  const uint32_t G = seg.per_block;

  std::vector<std::shared_ptr<multipath::RecvOp>> recv(G);
  std::vector<char> landed(G, !receives);
  size_t waiting_recv = 0;
  if (receives)
    for (uint32_t g = 0; g < G; ++g) {
      recv[g] = engine.expect(ctx.left(), ctx.tag(g), segmentOf(Span{0, bytes}, seg, g).bytes);
      ++waiting_recv;
    }
  std::vector<std::shared_ptr<multipath::SendOp>> sends;
  uint32_t next = forwards ? 0 : G;

  auto step = [&]() -> bool {
    for (uint32_t g = 0; g < G && waiting_recv > 0; ++g) {
      if (landed[g] || !recv[g]->done()) continue;
      landed[g] = 1;
      engine.release(recv[g]);
      --waiting_recv;
    }
    while (next < G && landed[next]) {
      Span span = segmentOf(Span{0, bytes}, seg, next);
      try {
        sends.push_back(engine.write(ctx.right(), tensor.region, tensor.base + span.offset, theirs[0].region,
                                     theirs[0].base + span.offset, span.bytes, ctx.tag(next)));
      } catch (const Error& e) {
        ctx.abort(e.what());
      }
      ++next;
    }
    bool sent = true;
    for (const auto& s : sends) {
      if (s->failed()) ctx.abort(s->error());
      sent = sent && s->done();
    }
    return waiting_recv == 0 && next == G && sent;
  };
  auto waiting = [&]() {
    return strcat(waiting_recv, " of ", G, " segments from rank ", ctx.left(), ", ", G - next,
                  " segments not yet forwarded to rank ", ctx.right());
  };
  auto depends = [&]() {
    std::vector<int> peers;
    if (waiting_recv > 0) peers.push_back(ctx.left());
    bool writing = next < G;
    for (const auto& s : sends) writing = writing || !s->done();
    if (writing) peers.push_back(ctx.right());
    return peers;
  };
  try {
    ctx.run(step, waiting, depends);
  } catch (...) {
    for (auto& op : recv)
      if (op) engine.release(op);
    throw;
  }
}

}  // namespace collectives
}  // namespace maestro
