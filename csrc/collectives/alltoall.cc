// All-to-all as a pairwise exchange (the long-message algorithm of MPICH and
// Open MPI, Thakur et al. 2005): in step k = 1..n-1 rank r writes its block
// for rank r+k while rank r-k writes into it. Every step is a permutation, so
// each rank has exactly one writer and one reader at a time and no receiver
// is flooded by n-1 senders at once (incast), which matters on shallow
// switch buffers; unlike the Bruck algorithm it moves every byte once, which
// is what large and uneven (mixture-of-experts) exchanges need. The data goes
// one-sided, zero copy: each block is written straight from the sender's
// tensor into the receiver's, in the smallest chunks to another host (tuner.h,
// kExchangeCut). Every step is in flight at once (every pair at
// a time), each path holding at most the tuner's exchange window of chunks
// of them (tuner.h, exchangeWindow): steps cross the
// core unevenly (on two leaves of two hosts each, step 2 crosses with both
// ranks of a leaf where steps 1 and 3 cross with one), and a rank that waits
// for a step to land before it starts the next leaves the core links idle
// while the slowest path of a step drains. MAESTRO_ALLTOALL_WINDOW bounds the
// steps in flight (a step starts when the one that many steps before it has
// been written), for switches too shallow for n-1 writers per receiver.
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "collectives/plan.h"
#include "collectives/tuner.h"
#include "common/error.h"

namespace maestro {
namespace collectives {
namespace {

uint8_t* addressOf(const Window& w) { return static_cast<uint8_t*>(w.region.addr) + w.base; }

}  // namespace

void exchange(OpContext& ctx, const ExchangePlan& plan) {
  multipath::Engine& engine = ctx.engine();
  const int n = ctx.size(), me = ctx.rank();
  if (plan.send_bytes[me] != plan.recv_bytes[me])
    ctx.abort(strcat("this rank sends ", plan.send_bytes[me], " bytes to itself but expects ", plan.recv_bytes[me]));
  if (plan.send_bytes[me] > 0) std::memmove(addressOf(plan.recv[me]), addressOf(plan.send[me]), plan.send_bytes[me]);
  if (n == 1) return;
  std::vector<OpContext::PeerTerms> terms(n);
  for (int p = 0; p < n; ++p)
    if (p != me) terms[p] = {plan.send_bytes[p], plan.recv_bytes[p], plan.recv_bytes[p] ? plan.recv[p] : Window{}};
  const std::vector<RemoteWindow> theirs = ctx.handshakeAll(terms);

  // A block is cut into messages like broadcast's segments (both sides
  // derive the same cut from the agreed size; the tags are per peer).
  const uint64_t target = engine.config().segment_size;
  auto cut = [&](uint64_t bytes) { return segmentBlocks({Span{0, bytes}}, target, kMessagesPerOp); };

  struct Incoming {
    int peer;
    std::shared_ptr<multipath::RecvOp> op;
  };
  std::vector<Incoming> pending;
  for (int k = 1; k < n; ++k) {
    const int p = (me + n - k) % n;  // step k's writer
    const uint64_t bytes = plan.recv_bytes[p];
    if (bytes == 0) continue;
    const Segmentation seg = cut(bytes);
    for (uint32_t g = 0; g < seg.per_block; ++g)
      pending.push_back({p, engine.expect(p, ctx.tag(g), segmentOf(Span{0, bytes}, seg, g).bytes, nullptr, kExchangeCut)});
  }

  std::vector<std::vector<std::shared_ptr<multipath::SendOp>>> writes(n);  // by step
  const int window = exchangeWindow(engine);
  const int in_flight = engine.config().alltoall_window;  // settled: 1..n-1
  int next_step = 1;
  auto stepWritten = [&](int k) {
    for (const auto& w : writes[k])
      if (!w->done()) return false;
    return true;
  };
  auto post = [&](int k) {
    const int p = (me + k) % n;
    const uint64_t bytes = plan.send_bytes[p];
    if (bytes == 0) return;
    const Segmentation seg = cut(bytes);
    for (uint32_t g = 0; g < seg.per_block; ++g) {
      Span span = segmentOf(Span{0, bytes}, seg, g);
      try {
        writes[k].push_back(engine.write(p, plan.send[p].region, plan.send[p].base + span.offset, theirs[p].region,
                                         theirs[p].base + span.offset, span.bytes, ctx.tag(g), window,
                                         kExchangeCut));
      } catch (const Error& e) {
        ctx.abort(e.what());
      }
    }
  };
  auto step = [&]() -> bool {
    for (size_t i = 0; i < pending.size();) {
      if (!pending[i].op->done()) {
        ++i;
        continue;
      }
      engine.release(pending[i].op);
      pending[i] = pending.back();
      pending.pop_back();
    }
    while (next_step < n && (next_step <= in_flight || stepWritten(next_step - in_flight)))
      post(next_step++);
    bool sent = next_step == n;
    for (int k = 1; k < next_step; ++k)
      for (const auto& w : writes[k]) {
        if (w->failed()) ctx.abort(w->error());
        sent = sent && w->done();
      }
    return pending.empty() && sent;
  };
  auto waiting = [&]() {
    size_t unsent = 0;
    for (int k = 1; k < next_step; ++k)
      for (const auto& w : writes[k]) unsent += w->done() ? 0 : 1;
    return strcat(pending.size(), " messages from other ranks, ", unsent, " unacknowledged writes, ", n - next_step,
                  " steps not yet started");
  };
  auto depends = [&]() {
    std::vector<char> on(n, 0);
    for (const auto& in : pending) on[in.peer] = 1;
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (k >= next_step) {
        on[p] = on[p] || plan.send_bytes[p] > 0;
        continue;
      }
      for (const auto& w : writes[k]) on[p] = on[p] || !w->done();
    }
    std::vector<int> peers;
    for (int p = 0; p < n; ++p)
      if (on[p]) peers.push_back(p);
    return peers;
  };
  try {
    ctx.run(step, waiting, depends);
  } catch (...) {
    for (auto& in : pending) engine.release(in.op);
    throw;
  }
}

void alltoall(multipath::Engine& engine, uint64_t seq, const std::vector<Window>& inputs,
              const std::vector<uint64_t>& send_counts, const std::vector<Window>& outputs,
              const std::vector<uint64_t>& recv_counts, DType dtype, Deadline deadline) {
  OpContext ctx(engine, seq, opDesc(OpKind::kAlltoall, dtype, 0), deadline);
  const int n = engine.size();
  MAESTRO_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(send_counts.size()) == n &&
                    static_cast<int>(outputs.size()) == n && static_cast<int>(recv_counts.size()) == n,
                "all_to_all takes one input and one output block per rank");
  ExchangePlan plan(n);
  const size_t elem = dtypeSize(dtype);
  for (int p = 0; p < n; ++p) {
    plan.send[p] = inputs[p];
    plan.send_bytes[p] = send_counts[p] * elem;
    plan.recv[p] = outputs[p];
    plan.recv_bytes[p] = recv_counts[p] * elem;
  }
  exchange(ctx, plan);
}

}  // namespace collectives
}  // namespace maestro
