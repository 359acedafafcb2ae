// Allreduce by recursive doubling, for small tensors (the tuner chooses it,
// tuner.h): log2(n) exchanges of the whole tensor instead of the ring's
// 2(n-1) sequential steps. At step k rank r and rank r xor 2^k write their
// partial results into each other's scratch, one-sided, and each combines
// the two; after the last step every rank holds the reduction of all.
//
// A group that is not a power of two folds its extra ranks in first
// (Thakur, Rabenseifner and Gropp 2005): with p the largest power of two
// <= n, rank p + i writes its tensor into rank i's scratch and waits; rank
// i reduces it into its own before the exchanges, and at the end writes the
// result straight into rank p + i's tensor (exposed to it for that). Two
// more steps for those pairs, none for the others.
//
// Every rank ends with the same bits: each combination puts the lower
// ranks' partial first ((lower) op (upper), whichever side computes it), so
// even an operation that is not bitwise commutative (MIN of -0 and +0)
// gives every rank the same answer, as the ring does.
//
// A step's outgoing data is a copy of the partial result in a scratch slot
// of its own, so the next combination never waits for the write to be
// acknowledged; each step's incoming data lands in a slot of its own, so a
// partner a step ahead never overwrites what a step behind still reads.
// The scratch holds 2 log2(p) + 1 tensors, which is small where the tuner
// uses it (MAESTRO_ALGO=recursive_doubling forces it at any size: the
// scratch grows with it). Messages are cut into segments as all-to-all's
// blocks are, each on its own tag.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/plan.h"
#include "collectives/recursive_doubling.h"
#include "common/error.h"

namespace maestro {
namespace collectives {

void allreduceRecursiveDoubling(OpContext& ctx, const Window& tensor, uint64_t count, DType dtype, ReduceOp op,
                                StagedBuffer* staged) {
  multipath::Engine& engine = ctx.engine();
  const int n = ctx.size(), me = ctx.rank();
  const uint64_t bytes = count * dtypeSize(dtype);
  int p = 1, steps = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++steps;
  }
  const bool extra = me >= p;                                      // folded in: sends, then waits
  const int fold = extra ? me - p : (me + p < n ? me + p : -1);   // the pair's other rank, or none
  // Scratch: incoming slots [0, steps), outgoing [steps, 2 steps), the fold's slot 2 steps.
  auto in_slot = [&](int k) { return bytes * k; };
  auto out_slot = [&](int k) { return bytes * (steps + k); };
  const uint64_t fold_slot = bytes * 2 * steps;
  Region scratch;
  if (!extra && bytes > 0) scratch = engine.buffer(kScratchBuffer, bytes * (2 * steps + 1));

  std::vector<OpContext::PeerTerms> terms(n);
  std::vector<int> peers;
  auto partner = [&](int k) { return me ^ (1 << k); };
  const uint64_t moves = bytes;  // every pair exchanges the whole tensor each way
  if (extra) {
    peers.push_back(fold);
    terms[fold] = {moves, moves, bytes ? tensor : Window{}};
  } else {
    for (int k = 0; k < steps; ++k) {
      peers.push_back(partner(k));
      terms[partner(k)] = {moves, moves, bytes ? Window{scratch, in_slot(k)} : Window{}};
    }
    if (fold >= 0) {
      peers.push_back(fold);
      terms[fold] = {moves, moves, bytes ? Window{scratch, fold_slot} : Window{}};
    }
  }
  const std::vector<RemoteWindow> theirs = ctx.handshakeWith(peers, terms);
  if (bytes == 0) return;
  if (staged) {
    try {
      while (!staged->ready(0, bytes) && staged->stageMore()) {
      }
    } catch (const std::exception& e) {
      ctx.abort(strcat("could not stage its tensor: ", e.what()));
    }
  }

  auto* acc = static_cast<uint8_t*>(tensor.region.addr) + tensor.base;
  auto* slots = static_cast<uint8_t*>(scratch.addr);
  const Segmentation seg = segmentBlocks({Span{0, bytes}}, engine.config().segment_size, kMessagesPerOp);
  struct Incoming {
    int peer = -1;
    std::vector<std::shared_ptr<multipath::RecvOp>> ops;
    bool done() const {
      for (const auto& op : ops)
        if (!op->done()) return false;
      return true;
    }
  };
  auto expect = [&](int peer) {
    Incoming in{peer, {}};
    for (uint32_t g = 0; g < seg.per_block; ++g)
      in.ops.push_back(engine.expect(peer, ctx.tag(g), segmentOf(Span{0, bytes}, seg, g).bytes));
    return in;
  };
  std::vector<std::shared_ptr<multipath::SendOp>> writes;
  std::vector<int> writing_to;
  auto write = [&](int peer, const Region& src, uint64_t src_base) {
    for (uint32_t g = 0; g < seg.per_block; ++g) {
      const Span span = segmentOf(Span{0, bytes}, seg, g);
      try {
        writes.push_back(engine.write(peer, src, src_base + span.offset, theirs[peer].region,
                                      theirs[peer].base + span.offset, span.bytes, ctx.tag(g)));
        writing_to.push_back(peer);
      } catch (const Error& e) {
        ctx.abort(e.what());
      }
    }
  };
  // Combine a partner's partial (in a slot of ours) with ours, the lower
  // ranks' first. The slot is only read: a copy of a chunk re-sent after a
  // failover may still land in it (the same bytes), so where the partner is
  // the lower its partial is combined in a copy of our own.
  std::vector<uint8_t> lower;
  auto combine = [&](uint64_t slot, int other) {
    const uint8_t* theirs_at = slots + slot;
    if (other > me) {
      reduceInto(dtype, op, acc, theirs_at, count);
    } else {
      lower.assign(theirs_at, theirs_at + bytes);
      reduceInto(dtype, op, lower.data(), acc, count);
      std::memcpy(acc, lower.data(), bytes);
    }
  };

  std::vector<Incoming> incoming;  // the fold's, then step k's (participants)
  struct Release {  // the expected messages are given back however the operation ends
    multipath::Engine& engine;
    std::vector<Incoming>& incoming;
    ~Release() {
      for (auto& in : incoming)
        for (auto& r : in.ops) engine.release(r);
    }
  } release{engine, incoming};
  if (extra) {
    incoming.push_back(expect(fold));
    write(fold, tensor.region, tensor.base);
  } else {
    if (fold >= 0) incoming.push_back(expect(fold));
    for (int k = 0; k < steps; ++k) incoming.push_back(expect(partner(k)));
  }
  size_t next_in = 0;        // the next incoming message to combine (participants)
  int next_step = 0;         // the next step whose partial leaves (participants)
  bool result_sent = false;  // to the folded rank
  bool finished = false;     // AVG's division and the staged report
  auto finish = [&] {
    if (finished) return;
    finished = true;
    if (op == ReduceOp::kAvg && !extra) finishAvg(dtype, acc, count, n);
    if (staged) {
      try {
        staged->final(0, bytes);
      } catch (const std::exception& e) {
        ctx.abort(strcat("could not stage its tensor: ", e.what()));
      }
    }
  };
  auto step = [&]() -> bool {
    for (const auto& w : writes)
      if (w->failed()) ctx.abort(w->error());
    if (extra) {
      if (!incoming[0].done()) return false;
    } else {
      for (;;) {
        const bool folding = fold >= 0 && next_in == 0;
        if (!folding && next_step < steps && next_step + (fold >= 0 ? 1 : 0) == static_cast<int>(next_in)) {
          std::memcpy(slots + out_slot(next_step), acc, bytes);
          write(partner(next_step), scratch, out_slot(next_step));
          ++next_step;
        }
        if (next_in == incoming.size() || !incoming[next_in].done()) break;
        combine(folding ? fold_slot : in_slot(next_step - 1), incoming[next_in].peer);
        ++next_in;
      }
      if (next_in < incoming.size()) return false;
      if (fold >= 0 && !result_sent) {
        finish();
        write(fold, tensor.region, tensor.base);
        result_sent = true;
      }
    }
    finish();
    for (const auto& w : writes)
      if (!w->done()) return false;
    return true;
  };
  auto waiting = [&] {
    std::string what;
    for (size_t i = 0; i < incoming.size(); ++i)
      if (!incoming[i].done()) what += strcat(what.empty() ? "" : ", ", "the partial result of rank ", incoming[i].peer);
    size_t unacked = 0;
    for (const auto& w : writes) unacked += w->done() ? 0 : 1;
    return strcat(what.empty() ? "" : what + "; ", unacked, " unacknowledged writes");
  };
  auto depends = [&] {
    std::vector<char> on(n, 0);
    for (const auto& in : incoming)
      if (!in.done()) on[in.peer] = 1;
    for (size_t i = 0; i < writes.size(); ++i)
      if (!writes[i]->done()) on[writing_to[i]] = 1;
    std::vector<int> out;
    for (int q = 0; q < n; ++q)
      if (on[q]) out.push_back(q);
    return out;
  };
  ctx.run(step, waiting, depends);
}

}  // namespace collectives
}  // namespace maestro
