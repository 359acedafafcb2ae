// Reduce by a binomial tree, for reduces of 16 to 64 KiB (the tuner
// chooses it, tuner.h). The direct reduce (gather.cc) has every rank write
// into the root at once: one step, but the root takes n-1 tensors through
// its one link and reduces them all itself. Here, numbering the ranks from
// the root (v = (rank - root) mod n), rank v takes the partial results of
// ranks v + 2^k for every k below its lowest set bit (every k for the root)
// that exist, combines them into its own, and writes the result to rank
// v - (its lowest set bit). The root takes log2(n) tensors, and every rank
// does at most that many combinations, in log2(n) steps.
//
// A rank combines in the order its children finish (nearest first, v + 1,
// v + 2, v + 4 ...), always its own partial first: (own) op (child's). A
// rank with children combines in a scratch copy of its tensor, never in
// the tensor (only the root's changes); a leaf writes its tensor as it is.
// Each child's partial lands in a scratch slot of its own, which is only
// read: a copy of a chunk re-sent after a failover may still land in it.
// Messages are cut into segments as all-to-all's blocks are, each on its
// own tag.
#include "collectives/tree_reduce.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/plan.h"
#include "common/error.h"

namespace maestro {
namespace collectives {

void reduceTree(OpContext& ctx, const Window& tensor, uint64_t count, DType dtype, ReduceOp op, int root) {
  multipath::Engine& engine = ctx.engine();
  const int n = ctx.size(), me = ctx.rank();
  const uint64_t bytes = count * dtypeSize(dtype);
  const int v = (me - root + n) % n;
  auto rankOf = [&](int relative) { return (relative + root) % n; };
  std::vector<int> children;  // nearest first
  for (int64_t step = 1; step < n && !(v & step); step <<= 1)
    if (v + step < n) children.push_back(rankOf(static_cast<int>(v + step)));
  const int parent = v == 0 ? -1 : rankOf(v - (v & -v));
  const int kids = static_cast<int>(children.size());

  // Scratch: a slot per child, then (a rank with children but the root) the
  // partial it combines in.
  Region scratch;
  if (kids > 0 && bytes > 0) scratch = engine.buffer(kScratchBuffer, bytes * (kids + (parent >= 0 ? 1 : 0)));
  std::vector<OpContext::PeerTerms> terms(n);
  for (int i = 0; i < kids; ++i) terms[children[i]] = {0, bytes, bytes ? Window{scratch, bytes * i} : Window{}};
  if (parent >= 0) terms[parent] = {bytes, 0, Window{}};
  // The descriptor goes to every rank, not only to the tree's partners: the
  // root is in it, and ranks that disagree on it build different trees, in
  // which some rank would wait for a partner that never comes. Compared by
  // every pair, a different root fails every rank at once.
  const std::vector<RemoteWindow> theirs = ctx.handshakeAll(terms);
  if (bytes == 0) return;

  // Where this rank's partial is combined: the root's tensor, a scratch
  // copy of the tensor (a rank with children), or nowhere (a leaf).
  uint8_t* acc = nullptr;
  Window result = tensor;
  if (parent < 0) {
    acc = static_cast<uint8_t*>(tensor.region.addr) + tensor.base;
  } else if (kids > 0) {
    result = Window{scratch, bytes * kids};
    acc = static_cast<uint8_t*>(scratch.addr) + result.base;
    std::memcpy(acc, static_cast<const uint8_t*>(tensor.region.addr) + tensor.base, bytes);
  }

  const Segmentation seg = segmentBlocks({Span{0, bytes}}, engine.config().segment_size, kMessagesPerOp);
  std::vector<std::vector<std::shared_ptr<multipath::RecvOp>>> incoming;  // per child
  struct Release {  // the expected messages are given back however the operation ends
    multipath::Engine& engine;
    std::vector<std::vector<std::shared_ptr<multipath::RecvOp>>>& incoming;
    ~Release() {
      for (auto& ops : incoming)
        for (auto& r : ops) engine.release(r);
    }
  } release{engine, incoming};
  for (int child : children) {
    incoming.emplace_back();
    for (uint32_t g = 0; g < seg.per_block; ++g)
      incoming.back().push_back(engine.expect(child, ctx.tag(g), segmentOf(Span{0, bytes}, seg, g).bytes));
  }
  auto landed = [&](int i) {
    for (const auto& r : incoming[i])
      if (!r->done()) return false;
    return true;
  };
  std::vector<std::shared_ptr<multipath::SendOp>> writes;

  int combined = 0;  // children combined so far
  bool sent = false;
  auto step = [&]() -> bool {
    for (const auto& w : writes)
      if (w->failed()) ctx.abort(w->error());
    while (combined < kids && landed(combined)) {
      reduceInto(dtype, op, acc, static_cast<const uint8_t*>(scratch.addr) + bytes * combined, count);
      ++combined;
    }
    if (combined < kids) return false;
    if (!sent) {
      sent = true;
      if (parent < 0) {
        if (op == ReduceOp::kAvg) finishAvg(dtype, acc, count, n);
      } else {
        for (uint32_t g = 0; g < seg.per_block; ++g) {
          const Span span = segmentOf(Span{0, bytes}, seg, g);
          try {
            writes.push_back(engine.write(parent, result.region, result.base + span.offset, theirs[parent].region,
                                          theirs[parent].base + span.offset, span.bytes, ctx.tag(g)));
          } catch (const Error& e) {
            ctx.abort(e.what());
          }
        }
      }
    }
    for (const auto& w : writes)
      if (!w->done()) return false;
    return true;
  };
  auto waiting = [&] {
    std::string what;
    for (int i = combined; i < kids; ++i)
      if (!landed(i)) what += strcat(what.empty() ? "" : ", ", "the partial result of rank ", children[i]);
    size_t unacked = 0;
    for (const auto& w : writes) unacked += w->done() ? 0 : 1;
    if (unacked) what += strcat(what.empty() ? "" : "; ", unacked, " unacknowledged writes to rank ", parent);
    return what;
  };
  auto depends = [&] {
    std::vector<int> on;
    for (int i = combined; i < kids; ++i)
      if (!landed(i)) on.push_back(children[i]);
    for (const auto& w : writes)
      if (!w->done()) {
        on.push_back(parent);
        break;
      }
    std::sort(on.begin(), on.end());
    return on;
  };
  ctx.run(step, waiting, depends);
}

}  // namespace collectives
}  // namespace maestro
