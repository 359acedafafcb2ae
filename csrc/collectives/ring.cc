// Ring reduce-scatter / allgather over the multipath engine.
//
// The buffer is cut into n blocks (one per rank) and each block into G
// segments; a segment is one message. Rank r at reduce-scatter step s sends
// block (r + shift - s) to its right neighbour and receives block
// (r - 1 + shift - s) from its left one; after n-1 steps it holds block
// (r + shift + 1) fully reduced. The allgather phase then circulates the
// reduced blocks, written straight into the peers' buffers.
//
// Pipelining: messages are posted strictly in index order as soon as their
// data is ready, so segment g of step s+1 leaves as soon as segment g of step
// s has been reduced -- and the reduction itself runs chunk by chunk on the
// transport thread that landed the chunk (reduce one chunk while the next
// arrives).
//
// Flow control of the reduce-scatter scratch: the receiver exposes K slots of
// one segment each; message k lands in slot k mod K. The writer holds K
// credits: it may write message k only after the receiver returned credit
// k-K, which it does once message k-K is reduced, and only once its own write
// of k-K is acknowledged (no copy of it is still on the way after a
// failover). Posting in index order and
// reducing into the separate work buffer (never into the slot being
// forwarded) keeps this free of the store-and-forward deadlock.
//
// Tags: message k goes on tag k mod W (W = ringTagWindow(), 1024). A ring
// of up to W messages -- groups of up to 513 ranks -- gives each its own tag
// and expects them all up front. A longer one reuses a tag: the receiver
// takes tag k mod W back for message k only once message k-W was processed
// and its writer said that none of its writes is still on the way (DONE
// k-W, sent when every chunk of it is acknowledged: a copy resent after a
// failover must not count for message k), and then tells the writer (READY
// k), which writes message k only after that. So groups of any size run; the
// two extra control messages per message are paid only beyond W.
//
// Reduce to a root is the same ring with the allgather phase cut short
// (Rabenseifner's reduce-scatter + gather, the gather done along the ring):
// a reduced block travels only until it reaches the root, and the messages
// after that are empty (skipped on both sides). Every rank sends and
// receives at most (n-1)/n of the tensor in each phase, all of it pipelined
// chunk by chunk, so a large reduce costs about what the reduce-scatter
// costs plus the root's intake -- against n-1 whole tensors into the root
// for a direct or tree reduce. Small tensors (up to kDirectReduceBytes),
// where the 2(n-1) sequential steps and not the bytes are the cost, go
// direct instead (reduceDirect: one step, exchange.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "collectives/plan.h"
#include "collectives/staged_buffer.h"
#include "common/config.h"
#include "common/error.h"

namespace maestro {
namespace collectives {
namespace {

using multipath::ControlType;
using multipath::RecvOp;
using multipath::SendOp;

struct RingPlan {
  Window work;               // n blocks, offsets relative to work.base
  std::vector<Span> blocks;  // n blocks
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool reduce_scatter = false;
  int rs_shift = 0;  // RS step s: rank r sends block (r + rs_shift - s)
  bool allgather = false;
  int ag_shift = 0;  // AG step s: rank r sends block (r + ag_shift - s)
  int ag_root = -1;  // >= 0: the allgather phase only carries blocks towards this rank (reduce)
  // An allreduce's buffer still being copied in and out (a device tensor's
  // stand-in): a reduce-scatter message is sent from, or expected into,
  // bytes only once they are in place, and every part is reported final as
  // soon as it is (its reduce-scatter's last step, or its allgather message).
  StagedBuffer* staged = nullptr;
};

int mod(int a, int n) { return ((a % n) + n) % n; }

void runRing(OpContext& ctx, const RingPlan& plan) {
  multipath::Engine& engine = ctx.engine();
  const int n = ctx.size(), r = ctx.rank();
  const int L = ctx.left(), R = ctx.right();
  const uint32_t rs_steps = plan.reduce_scatter ? n - 1 : 0;
  const uint32_t ag_steps = plan.allgather ? n - 1 : 0;
  const uint32_t steps = rs_steps + ag_steps;
  const uint32_t W = ringTagWindow();
  const Segmentation seg =
      segmentBlocks(plan.blocks, engine.config().segment_size, std::max<uint32_t>(1, W / std::max(1u, steps)));
  const uint32_t G = seg.per_block;
  const uint32_t total = steps * G;
  const bool windowed = total > W;  // tags are reused within the operation
  auto tagOf = [&](uint32_t k) { return ctx.tag(k % W); };
  // Control subs beside the reduce-scatter credits (sub = message index).
  constexpr uint32_t kSubDone = 1u << 30, kSubReady = 1u << 31;
  const uint32_t K = static_cast<uint32_t>(scratchSlots(engine.config(), n));

  std::vector<Window> mine = {plan.work};
  Region scratch;
  if (plan.reduce_scatter) {
    scratch = engine.buffer(kScratchBuffer, K * seg.segment_bytes);
    mine.push_back(Window{scratch, 0});
  }
  std::vector<RemoteWindow> theirs = ctx.handshake(mine);
  if (total == 0) return;  // empty tensors: the handshake was the whole operation
  auto* work = static_cast<uint8_t*>(plan.work.region.addr) + plan.work.base;
  auto* slots = static_cast<uint8_t*>(scratch.addr);

  // Message index k -> (phase, step, segment) and its block on each side.
  auto isRS = [&](uint32_t k) { return k < rs_steps * G; };
  auto stepOf = [&](uint32_t k) { return (isRS(k) ? k : k - rs_steps * G) / G; };
  auto segOf = [&](uint32_t k) { return k % G; };
  auto sendBlock = [&](uint32_t k) {
    return mod(r + (isRS(k) ? plan.rs_shift : plan.ag_shift) - static_cast<int>(stepOf(k)), n);
  };
  auto recvBlock = [&](uint32_t k) {
    return mod(r - 1 + (isRS(k) ? plan.rs_shift : plan.ag_shift) - static_cast<int>(stepOf(k)), n);
  };
  // With ag_root: the block sent at AG step s was reduced on rank r - s and
  // has travelled s hops; it goes on only while the root is further on.
  auto towardsRoot = [&](int sender, uint32_t k) {
    if (isRS(k) || plan.ag_root < 0) return true;
    const int s = static_cast<int>(stepOf(k));
    return mod(plan.ag_root - (sender - s), n) >= s + 1;
  };
  auto sendSpan = [&](uint32_t k) {
    Span span = segmentOf(plan.blocks[sendBlock(k)], seg, segOf(k));
    if (!towardsRoot(r, k)) span.bytes = 0;
    return span;
  };
  auto recvSpan = [&](uint32_t k) {
    Span span = segmentOf(plan.blocks[recvBlock(k)], seg, segOf(k));
    if (!towardsRoot(L, k)) span.bytes = 0;
    return span;
  };

  // Incoming messages: expected up front (the first W of a windowed ring,
  // each later one when its tag is free); early chunks are remembered.
  std::vector<std::shared_ptr<RecvOp>> recv(total);
  std::vector<char> processed(total, 0);
  uint32_t processed_count = 0;
  std::vector<uint32_t> pending;
  std::vector<uint32_t> to_free;  // windowed: processed messages whose tag a later one needs
  auto markProcessed = [&](uint32_t k) {
    processed[k] = 1;
    ++processed_count;
    if (k + W < total) to_free.push_back(k);
  };
  // Staged buffer: reduce-scatter messages waiting for the bytes they reduce
  // into (their chunks land in the scratch slot meanwhile and are reduced
  // when the message is expected).
  std::vector<uint32_t> deferred;
  bool waits_for_staging = false;  // this step found a message waiting for staged bytes
  // A copy in that fails (a CUDA error) fails the operation on every rank.
  auto stagingFailed = [&](const std::exception& e) {
    ctx.abort(strcat("could not stage its tensor: ", e.what()));
  };
  auto staged = [&](const Span& span) {
    try {
      if (!plan.staged || plan.staged->ready(span.offset, span.bytes)) return true;
    } catch (const std::exception& e) {
      stagingFailed(e);
    }
    waits_for_staging = true;
    return false;
  };
  auto expectNow = [&](uint32_t k, const Span& span) {
    multipath::ChunkHook hook;
    if (isRS(k)) {
      uint8_t* dst = work + span.offset;
      const uint8_t* src = slots + static_cast<uint64_t>(k % K) * seg.segment_bytes;
      const bool last = stepOf(k) == rs_steps - 1;
      const DType dtype = plan.dtype;
      const ReduceOp op = plan.op;
      hook = [=](uint64_t off, uint64_t len) {
        reduceInto(dtype, op, dst + off, src + off, len / dtypeSize(dtype));
        if (last && op == ReduceOp::kAvg) finishAvg(dtype, dst + off, len / dtypeSize(dtype), n);
      };
    }
    recv[k] = engine.expect(L, tagOf(k), span.bytes, std::move(hook));
    pending.push_back(k);
    // Windowed: the writer may now use the tag for message k.
    if (k >= W) {
      try {
        engine.sendControl(L, ControlType::kCredit, ctx.seq(), kSubReady + k);
      } catch (const Error& e) {
        ctx.abort(e.what());
      }
    }
  };
  // Expect message k (an empty one is processed at once).
  auto expectMessage = [&](uint32_t k) {
    Span span = recvSpan(k);
    if (span.bytes == 0) {
      markProcessed(k);
      return;
    }
    if (isRS(k) && !staged(span)) {
      deferred.push_back(k);
      return;
    }
    expectNow(k, span);
  };
  for (uint32_t k = 0; k < std::min(total, W); ++k) expectMessage(k);
  // Windowed: hand message m's tag to message m + W once m is over on both
  // sides; false while its writer has not said DONE.
  std::vector<char> done_heard(windowed ? total : 0, 0);
  auto freeTag = [&](uint32_t m) -> bool {
    if (recvSpan(m).bytes > 0) {
      if (!done_heard[m]) {
        if (!engine.takeControl(L, {ControlType::kCredit, ctx.seq(), kSubDone + m}, nullptr)) return false;
        done_heard[m] = 1;
      }
      engine.recycleTag(L, tagOf(m));
    }
    expectMessage(m + W);
    return true;
  };

  std::vector<std::shared_ptr<SendOp>> sends;
  std::vector<std::shared_ptr<SendOp>> send_of(total);  // our write of message k
  std::vector<char> credit(total, 0);  // credit for our RS message k returned by R
  std::vector<char> ready_heard(windowed ? total : 0, 0);  // READY k from R
  std::vector<uint32_t> unreported;  // windowed: our messages whose DONE R still needs
  uint32_t next = 0;

  auto ready = [&](uint32_t k) {
    uint32_t s = stepOf(k), g = segOf(k);
    if (windowed && k >= W && !ready_heard[k] && sendSpan(k).bytes > 0) {
      if (!engine.takeControl(R, {ControlType::kCredit, ctx.seq(), kSubReady + k}, nullptr)) return false;
      ready_heard[k] = 1;
    }
    if (isRS(k)) {
      if (s > 0 && !processed[(s - 1) * G + g]) return false;
      // Step 0 sends this rank's own bytes (later steps, bytes it reduced into).
      if (s == 0 && !staged(sendSpan(k))) return false;
      if (k >= K) {
        uint32_t j = k - K;  // the message that used this slot before
        if (sendSpan(j).bytes > 0 && !credit[j]) {
          if (!engine.takeControl(R, {ControlType::kCredit, ctx.seq(), j}, nullptr)) return false;
          credit[j] = 1;
        }
        // The credit says R has every chunk of j; our write of j must be
        // acknowledged too: after a failover, a second copy of a chunk of j
        // (its first copy landed, its ACK was lost) would otherwise land in
        // the slot after message k took it.
        if (send_of[j] && !send_of[j]->done()) return false;
      }
      return true;
    }
    if (s == 0) return rs_steps == 0 || processed[(rs_steps - 1) * G + g] != 0;
    return processed[rs_steps * G + (s - 1) * G + g] != 0;
  };

  // A message just processed: with a staged buffer, report what became final.
  auto finalOf = [&](uint32_t k) {
    if (!plan.staged || plan.ag_root >= 0) return;
    if ((isRS(k) && stepOf(k) == rs_steps - 1 && plan.allgather) || !isRS(k)) {
      const Span span = recvSpan(k);
      if (span.bytes == 0) return;
      try {
        plan.staged->final(span.offset, span.bytes);
      } catch (const std::exception& e) {
        ctx.abort(strcat("could not copy its result back: ", e.what()));
      }
    }
  };
  auto step1 = [&]() -> bool {
    waits_for_staging = false;
    for (size_t i = 0; i < deferred.size();) {
      const uint32_t k = deferred[i];
      const Span span = recvSpan(k);
      if (!staged(span)) {
        ++i;
        continue;
      }
      deferred.erase(deferred.begin() + static_cast<std::ptrdiff_t>(i));
      expectNow(k, span);
    }
    for (size_t i = 0; i < pending.size();) {
      uint32_t k = pending[i];
      if (!recv[k]->done()) {
        ++i;
        continue;
      }
      engine.release(recv[k]);
      recv[k].reset();
      markProcessed(k);
      finalOf(k);
      if (isRS(k)) {
        // Best effort: the writer waits for its credits and fails on its own
        // if it cannot get them; our progress does not depend on this.
        try {
          engine.sendControl(L, ControlType::kCredit, ctx.seq(), k);
        } catch (const Error&) {
        }
      }
      pending[i] = pending.back();
      pending.pop_back();
    }
    // Freeing a tag may expect an empty message, whose tag frees at once.
    for (bool freed = true; freed && !to_free.empty();) {
      freed = false;
      std::vector<uint32_t> waiting;
      waiting.swap(to_free);
      for (uint32_t m : waiting) {
        if (freeTag(m)) freed = true;
        else to_free.push_back(m);
      }
    }
    while (next < total && ready(next)) {
      Span span = sendSpan(next);
      if (span.bytes > 0) {
        const RemoteWindow& dst = isRS(next) ? theirs[1] : theirs[0];
        uint64_t dst_off = isRS(next) ? static_cast<uint64_t>(next % K) * seg.segment_bytes : dst.base + span.offset;
        try {
          sends.push_back(engine.write(R, plan.work.region, plan.work.base + span.offset, dst.region, dst_off,
                                       span.bytes, tagOf(next)));
          send_of[next] = sends.back();
          if (next + W < total) unreported.push_back(next);
        } catch (const Error& e) {
          ctx.abort(e.what());
        }
      }
      ++next;
    }
    bool sent = true;
    for (const auto& s : sends) {
      if (s->failed()) ctx.abort(s->error());
      sent = sent && s->done();
    }
    // Windowed: R may reuse the tag of a message of ours once every chunk
    // of it is acknowledged.
    for (size_t i = 0; i < unreported.size();) {
      const uint32_t m = unreported[i];
      if (!send_of[m]->done()) {
        ++i;
        continue;
      }
      try {
        engine.sendControl(R, ControlType::kCredit, ctx.seq(), kSubDone + m);
      } catch (const Error& e) {
        ctx.abort(e.what());
      }
      unreported[i] = unreported.back();
      unreported.pop_back();
    }
    return next == total && processed_count == total && sent;
  };
  // With a staged buffer, a step that found a message waiting for its bytes
  // waits for the next staged piece and goes on (no transport event would
  // wake it for that); everything the transport did meanwhile is seen then.
  auto step = [&]() -> bool {
    for (;;) {
      if (step1()) return true;
      if (!waits_for_staging) return false;
      try {
        if (!plan.staged->stageMore()) return false;
      } catch (const std::exception& e) {
        stagingFailed(e);
      }
    }
  };
  auto waiting = [&]() {
    size_t unsent = 0;
    for (const auto& s : sends) unsent += s->done() ? 0 : 1;
    return strcat(total - processed_count, " of ", total, " messages from rank ", L, ", ", unsent,
                  " unacknowledged writes to rank ", R, ", ", total - next, " messages not yet posted");
  };
  // We depend on the left neighbour while its messages are missing, on the
  // right one while we still write to it (or wait for its credits).
  auto depends = [&]() {
    std::vector<int> peers;
    if (processed_count < total) peers.push_back(L);
    bool writing = next < total;
    for (const auto& s : sends) writing = writing || !s->done();
    if (writing) peers.push_back(R);
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

// Allreduce in place on `work`: reduce-scatter, then allgather.
RingPlan allreducePlan(const Window& work, uint64_t count, DType dtype, ReduceOp op, int n) {
  RingPlan plan;
  plan.work = work;
  plan.blocks = balancedBlocks(count, dtypeSize(dtype), n);
  plan.dtype = dtype;
  plan.op = op;
  plan.reduce_scatter = true;
  plan.rs_shift = 0;
  plan.allgather = true;
  plan.ag_shift = 1;  // RS leaves rank r with block r+1
  return plan;
}

}  // namespace

void allreduce(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype,
               ReduceOp op, Deadline deadline, StagedBuffer* staged) {
  OpContext ctx(engine, seq, opDesc(OpKind::kAllreduce, dtype, count, op), deadline);
  if (engine.size() == 1) return;
  RingPlan plan = allreducePlan(tensor, count, dtype, op, engine.size());
  plan.staged = staged;
  runRing(ctx, plan);
}

void reduce(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype, ReduceOp op,
            int root, Deadline deadline) {
  OpContext ctx(engine, seq, opDesc(OpKind::kReduce, dtype, count, op, root), deadline);
  const int n = engine.size();
  if (root < 0 || root >= n) ctx.abort(strcat("root ", root, " is not a rank of this group of ", n));
  if (n == 1) return;
  const uint64_t bytes = count * dtypeSize(dtype);
  if (bytes <= kDirectReduceBytes) {
    reduceDirect(ctx, tensor, count, dtype, op, root);
    return;
  }
  Window work = tensor;
  if (engine.rank() != root) {
    // Reduce in a working copy: only the root's tensor changes.
    Region copy = engine.buffer(kWorkBuffer, std::max<uint64_t>(bytes, 1));
    if (bytes) std::memcpy(copy.addr, static_cast<const uint8_t*>(tensor.region.addr) + tensor.base, bytes);
    work = Window{copy, 0};
  }
  RingPlan plan = allreducePlan(work, count, dtype, op, n);
  plan.ag_root = root;
  runRing(ctx, plan);
}

void reduceScatter(multipath::Engine& engine, uint64_t seq, const void* input, void* output, uint64_t count,
                   DType dtype, ReduceOp op, Deadline deadline) {
  OpContext ctx(engine, seq, opDesc(OpKind::kReduceScatter, dtype, count, op), deadline);
  const int n = engine.size();
  const uint64_t block = count * dtypeSize(dtype);
  if (n == 1) {
    if (block) std::memmove(output, input, block);
    if (op == ReduceOp::kAvg) finishAvg(dtype, output, count, 1);
    return;
  }
  // Reduce in a working copy so the caller's input stays untouched.
  Region work = engine.buffer(kWorkBuffer, std::max<uint64_t>(block * n, 1));
  if (block) std::memcpy(work.addr, input, block * n);
  RingPlan plan;
  plan.work = Window{work, 0};
  plan.blocks = equalBlocks(block, n);
  plan.dtype = dtype;
  plan.op = op;
  plan.reduce_scatter = true;
  plan.rs_shift = -1;  // RS leaves rank r with block r
  runRing(ctx, plan);
  if (block) std::memcpy(output, static_cast<uint8_t*>(work.addr) + block * engine.rank(), block);
}

void allgather(multipath::Engine& engine, uint64_t seq, const void* input, const Window& output, uint64_t count,
               DType dtype, Deadline deadline) {
  OpContext ctx(engine, seq, opDesc(OpKind::kAllgather, dtype, count), deadline);
  const uint64_t block = count * dtypeSize(dtype);
  auto* out = static_cast<uint8_t*>(output.region.addr) + output.base;
  if (block) std::memmove(out + block * engine.rank(), input, block);
  if (engine.size() == 1) return;
  RingPlan plan;
  plan.work = output;
  plan.blocks = equalBlocks(block, engine.size());
  plan.dtype = dtype;
  plan.allgather = true;
  plan.ag_shift = 0;
  runRing(ctx, plan);
}

}  // namespace collectives
}  // namespace maestro
