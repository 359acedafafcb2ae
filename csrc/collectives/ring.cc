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
// for a direct or tree reduce. Small tensors, where the 2(n-1) sequential
// steps and not the bytes are the cost, go direct instead (reduceDirect:
// one step, exchange.h), and a small allreduce by recursive doubling
// (recursive_doubling.h): the tuner chooses (tuner.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "collectives/plan.h"
#include "collectives/recursive_doubling.h"
#include "collectives/staged_buffer.h"
#include "collectives/tree_reduce.h"
#include "collectives/tuner.h"
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

// One ring operation on this rank: which message goes where (the index
// arithmetic), the state of every message in both directions, one look at
// all of it per event (step()), and what the operation waits on.
class Ring {
 public:
  Ring(OpContext& ctx, const RingPlan& plan);
  void run();

 private:
  // Control subs beside the reduce-scatter credits (sub = message index).
  static constexpr uint32_t kSubDone = 1u << 30, kSubReady = 1u << 31;

  // Message index k -> (phase, step, segment) and its block on each side.
  bool isRS(uint32_t k) const { return k < rs_steps_ * G_; }
  uint32_t stepOf(uint32_t k) const { return (isRS(k) ? k : k - rs_steps_ * G_) / G_; }
  uint32_t segOf(uint32_t k) const { return k % G_; }
  uint32_t tagOf(uint32_t k) const { return ctx_.tag(k % W_); }
  int sendBlock(uint32_t k) const {
    return mod(r_ + (isRS(k) ? plan_.rs_shift : plan_.ag_shift) - static_cast<int>(stepOf(k)), n_);
  }
  int recvBlock(uint32_t k) const {
    return mod(r_ - 1 + (isRS(k) ? plan_.rs_shift : plan_.ag_shift) - static_cast<int>(stepOf(k)), n_);
  }
  // With ag_root: the block sent at AG step s was reduced on rank r - s and
  // has travelled s hops; it goes on only while the root is further on.
  bool towardsRoot(int sender, uint32_t k) const {
    if (isRS(k) || plan_.ag_root < 0) return true;
    const int s = static_cast<int>(stepOf(k));
    return mod(plan_.ag_root - (sender - s), n_) >= s + 1;
  }
  Span sendSpan(uint32_t k) const {
    Span span = segmentOf(plan_.blocks[sendBlock(k)], seg_, segOf(k));
    if (!towardsRoot(r_, k)) span.bytes = 0;
    return span;
  }
  Span recvSpan(uint32_t k) const {
    Span span = segmentOf(plan_.blocks[recvBlock(k)], seg_, segOf(k));
    if (!towardsRoot(L_, k)) span.bytes = 0;
    return span;
  }

  void markProcessed(uint32_t k);
  // A copy in that fails (a CUDA error) fails the operation on every rank.
  void stagingFailed(const std::exception& e) { ctx_.abort(strcat("could not stage its tensor: ", e.what())); }
  // The span's bytes are in place (staged buffer); otherwise this step waits for them.
  bool staged(const Span& span);
  void expectNow(uint32_t k, const Span& span);
  // Expect message k (an empty one is processed at once).
  void expectMessage(uint32_t k);
  // Windowed: hand message m's tag to message m + W once m is over on both
  // sides; false while its writer has not said DONE.
  bool freeTag(uint32_t m);
  // Our message k may be written now.
  bool ready(uint32_t k);
  // A message just processed: with a staged buffer, report what became final.
  void finalOf(uint32_t k);
  void takeArrivals();
  void postReady();
  bool reportDone();  // true: every write of ours is acknowledged
  bool step1();
  bool step();
  std::string waiting() const;
  std::vector<int> depends() const;

  OpContext& ctx_;
  const RingPlan& plan_;
  multipath::Engine& engine_;
  const int n_, r_, L_, R_;
  const uint32_t rs_steps_, ag_steps_, steps_, W_;
  Segmentation seg_;
  uint32_t G_ = 0, total_ = 0, K_ = 0;
  bool windowed_ = false;  // tags are reused within the operation
  std::vector<RemoteWindow> theirs_;
  uint8_t* work_ = nullptr;
  uint8_t* slots_ = nullptr;

  // Incoming messages: expected up front (the first W of a windowed ring,
  // each later one when its tag is free); early chunks are remembered.
  std::vector<std::shared_ptr<RecvOp>> recv_;
  std::vector<char> processed_;
  uint32_t processed_count_ = 0;
  std::vector<uint32_t> pending_;
  std::vector<uint32_t> to_free_;  // windowed: processed messages whose tag a later one needs
  // Staged buffer: reduce-scatter messages waiting for the bytes they reduce
  // into (their chunks land in the scratch slot meanwhile and are reduced
  // when the message is expected).
  std::vector<uint32_t> deferred_;
  bool waits_for_staging_ = false;  // this step found a message waiting for staged bytes
  std::vector<char> done_heard_;

  std::vector<std::shared_ptr<SendOp>> sends_;
  std::vector<std::shared_ptr<SendOp>> send_of_;  // our write of message k
  std::vector<char> credit_;       // credit for our RS message k returned by R
  std::vector<char> ready_heard_;  // READY k from R
  std::vector<uint32_t> unreported_;  // windowed: our messages whose DONE R still needs
  uint32_t next_ = 0;
};

Ring::Ring(OpContext& ctx, const RingPlan& plan)
    : ctx_(ctx),
      plan_(plan),
      engine_(ctx.engine()),
      n_(ctx.size()),
      r_(ctx.rank()),
      L_(ctx.left()),
      R_(ctx.right()),
      rs_steps_(plan.reduce_scatter ? n_ - 1 : 0),
      ag_steps_(plan.allgather ? n_ - 1 : 0),
      steps_(rs_steps_ + ag_steps_),
      W_(ringTagWindow()) {
  const Config& config = engine_.config();
  const uint64_t target = ringSegmentBytes(largestBlock(plan.blocks), config.segment_size, config.chunk_size,
                                           config.min_chunk_size, engine_.paths(), ringSpansHosts(engine_));
  seg_ = segmentBlocks(plan.blocks, target, std::max<uint32_t>(1, W_ / std::max(1u, steps_)));
  G_ = seg_.per_block;
  total_ = steps_ * G_;
  windowed_ = total_ > W_;
  // Mid-size segments: as many slots per block as the whole-message ring
  // has blocks, so the writer stays as far ahead in bytes.
  K_ = static_cast<uint32_t>(config.scratch_slots) * (target < config.segment_size ? std::max(1u, G_) : 1u);
}

void Ring::markProcessed(uint32_t k) {
  processed_[k] = 1;
  ++processed_count_;
  if (k + W_ < total_) to_free_.push_back(k);
}

bool Ring::staged(const Span& span) {
  try {
    if (!plan_.staged || plan_.staged->ready(span.offset, span.bytes)) return true;
  } catch (const std::exception& e) {
    stagingFailed(e);
  }
  waits_for_staging_ = true;
  return false;
}

void Ring::expectNow(uint32_t k, const Span& span) {
  multipath::ChunkHook hook;
  if (isRS(k)) {
    uint8_t* dst = work_ + span.offset;
    const uint8_t* src = slots_ + static_cast<uint64_t>(k % K_) * seg_.segment_bytes;
    const bool last = stepOf(k) == rs_steps_ - 1;
    const DType dtype = plan_.dtype;
    const ReduceOp op = plan_.op;
    const int n = n_;
    hook = [=](uint64_t off, uint64_t len) {
      reduceInto(dtype, op, dst + off, src + off, len / dtypeSize(dtype));
      if (last && op == ReduceOp::kAvg) finishAvg(dtype, dst + off, len / dtypeSize(dtype), n);
    };
  }
  recv_[k] = engine_.expect(L_, tagOf(k), span.bytes, std::move(hook));
  pending_.push_back(k);
  // Windowed: the writer may now use the tag for message k.
  if (k >= W_) {
    try {
      engine_.sendControl(L_, ControlType::kCredit, ctx_.seq(), kSubReady + k);
    } catch (const Error& e) {
      ctx_.abort(e.what());
    }
  }
}

void Ring::expectMessage(uint32_t k) {
  Span span = recvSpan(k);
  if (span.bytes == 0) {
    markProcessed(k);
    return;
  }
  if (isRS(k) && !staged(span)) {
    deferred_.push_back(k);
    return;
  }
  expectNow(k, span);
}

bool Ring::freeTag(uint32_t m) {
  if (recvSpan(m).bytes > 0) {
    if (!done_heard_[m]) {
      if (!engine_.takeControl(L_, {ControlType::kCredit, ctx_.seq(), kSubDone + m}, nullptr)) return false;
      done_heard_[m] = 1;
    }
    engine_.recycleTag(L_, tagOf(m));
  }
  expectMessage(m + W_);
  return true;
}

bool Ring::ready(uint32_t k) {
  uint32_t s = stepOf(k), g = segOf(k);
  if (windowed_ && k >= W_ && !ready_heard_[k] && sendSpan(k).bytes > 0) {
    if (!engine_.takeControl(R_, {ControlType::kCredit, ctx_.seq(), kSubReady + k}, nullptr)) return false;
    ready_heard_[k] = 1;
  }
  if (isRS(k)) {
    if (s > 0 && !processed_[(s - 1) * G_ + g]) return false;
    // Step 0 sends this rank's own bytes (later steps, bytes it reduced into).
    if (s == 0 && !staged(sendSpan(k))) return false;
    if (k >= K_) {
      uint32_t j = k - K_;  // the message that used this slot before
      if (sendSpan(j).bytes > 0 && !credit_[j]) {
        if (!engine_.takeControl(R_, {ControlType::kCredit, ctx_.seq(), j}, nullptr)) return false;
        credit_[j] = 1;
      }
      // The credit says R has every chunk of j; our write of j must be
      // acknowledged too: after a failover, a second copy of a chunk of j
      // (its first copy landed, its ACK was lost) would otherwise land in
      // the slot after message k took it.
      if (send_of_[j] && !send_of_[j]->done()) return false;
    }
    return true;
  }
  if (s == 0) return rs_steps_ == 0 || processed_[(rs_steps_ - 1) * G_ + g] != 0;
  return processed_[rs_steps_ * G_ + (s - 1) * G_ + g] != 0;
}

void Ring::finalOf(uint32_t k) {
  if (!plan_.staged || plan_.ag_root >= 0) return;
  if ((isRS(k) && stepOf(k) == rs_steps_ - 1 && plan_.allgather) || !isRS(k)) {
    const Span span = recvSpan(k);
    if (span.bytes == 0) return;
    try {
      plan_.staged->final(span.offset, span.bytes);
    } catch (const std::exception& e) {
      ctx_.abort(strcat("could not copy its result back: ", e.what()));
    }
  }
}

// Messages whose bytes are now in place are expected; those fully landed
// are processed (credited back, their tags freed for later messages).
void Ring::takeArrivals() {
  for (size_t i = 0; i < deferred_.size();) {
    const uint32_t k = deferred_[i];
    const Span span = recvSpan(k);
    if (!staged(span)) {
      ++i;
      continue;
    }
    deferred_.erase(deferred_.begin() + static_cast<std::ptrdiff_t>(i));
    expectNow(k, span);
  }
  for (size_t i = 0; i < pending_.size();) {
    uint32_t k = pending_[i];
    if (!recv_[k]->done()) {
      ++i;
      continue;
    }
    engine_.release(recv_[k]);
    recv_[k].reset();
    markProcessed(k);
    finalOf(k);
    if (isRS(k)) {
      // Best effort: the writer waits for its credits and fails on its own
      // if it cannot get them; our progress does not depend on this.
      try {
        engine_.sendControl(L_, ControlType::kCredit, ctx_.seq(), k);
      } catch (const Error&) {
      }
    }
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
  // Freeing a tag may expect an empty message, whose tag frees at once.
  for (bool freed = true; freed && !to_free_.empty();) {
    freed = false;
    std::vector<uint32_t> waiting;
    waiting.swap(to_free_);
    for (uint32_t m : waiting) {
      if (freeTag(m)) freed = true;
      else to_free_.push_back(m);
    }
  }
}

// Our messages that are ready go out, strictly in index order.
void Ring::postReady() {
  while (next_ < total_ && ready(next_)) {
    Span span = sendSpan(next_);
    if (span.bytes > 0) {
      const RemoteWindow& dst = isRS(next_) ? theirs_[1] : theirs_[0];
      uint64_t dst_off = isRS(next_) ? static_cast<uint64_t>(next_ % K_) * seg_.segment_bytes : dst.base + span.offset;
      try {
        sends_.push_back(engine_.write(R_, plan_.work.region, plan_.work.base + span.offset, dst.region, dst_off,
                                       span.bytes, tagOf(next_)));
        send_of_[next_] = sends_.back();
        if (next_ + W_ < total_) unreported_.push_back(next_);
      } catch (const Error& e) {
        ctx_.abort(e.what());
      }
    }
    ++next_;
  }
}

bool Ring::reportDone() {
  bool sent = true;
  for (const auto& s : sends_) {
    if (s->failed()) ctx_.abort(s->error());
    sent = sent && s->done();
  }
  // Windowed: R may reuse the tag of a message of ours once every chunk
  // of it is acknowledged.
  for (size_t i = 0; i < unreported_.size();) {
    const uint32_t m = unreported_[i];
    if (!send_of_[m]->done()) {
      ++i;
      continue;
    }
    try {
      engine_.sendControl(R_, ControlType::kCredit, ctx_.seq(), kSubDone + m);
    } catch (const Error& e) {
      ctx_.abort(e.what());
    }
    unreported_[i] = unreported_.back();
    unreported_.pop_back();
  }
  return sent;
}

bool Ring::step1() {
  waits_for_staging_ = false;
  takeArrivals();
  postReady();
  const bool sent = reportDone();
  return next_ == total_ && processed_count_ == total_ && sent;
}

// With a staged buffer, a step that found a message waiting for its bytes
// waits for the next staged piece and goes on (no transport event would
// wake it for that); everything the transport did meanwhile is seen then.
bool Ring::step() {
  for (;;) {
    if (step1()) return true;
    if (!waits_for_staging_) return false;
    try {
      if (!plan_.staged->stageMore()) return false;
    } catch (const std::exception& e) {
      stagingFailed(e);
    }
  }
}

std::string Ring::waiting() const {
  size_t unsent = 0;
  for (const auto& s : sends_) unsent += s->done() ? 0 : 1;
  return strcat(total_ - processed_count_, " of ", total_, " messages from rank ", L_, ", ", unsent,
                " unacknowledged writes to rank ", R_, ", ", total_ - next_, " messages not yet posted");
}

// We depend on the left neighbour while its messages are missing, on the
// right one while we still write to it (or wait for its credits).
std::vector<int> Ring::depends() const {
  std::vector<int> peers;
  if (processed_count_ < total_) peers.push_back(L_);
  bool writing = next_ < total_;
  for (const auto& s : sends_) writing = writing || !s->done();
  if (writing) peers.push_back(R_);
  return peers;
}

void Ring::run() {
  std::vector<Window> mine = {plan_.work};
  Region scratch;
  if (plan_.reduce_scatter) {
    scratch = engine_.buffer(kScratchBuffer, K_ * seg_.segment_bytes);
    mine.push_back(Window{scratch, 0});
  }
  theirs_ = ctx_.handshake(mine);
  if (total_ == 0) return;  // empty tensors: the handshake was the whole operation
  work_ = static_cast<uint8_t*>(plan_.work.region.addr) + plan_.work.base;
  slots_ = static_cast<uint8_t*>(scratch.addr);
  recv_.resize(total_);
  processed_.assign(total_, 0);
  done_heard_.assign(windowed_ ? total_ : 0, 0);
  send_of_.resize(total_);
  credit_.assign(total_, 0);
  ready_heard_.assign(windowed_ ? total_ : 0, 0);
  for (uint32_t k = 0; k < std::min(total_, W_); ++k) expectMessage(k);
  try {
    ctx_.run([this] { return step(); }, [this] { return waiting(); }, [this] { return depends(); });
  } catch (...) {
    for (auto& op : recv_)
      if (op) engine_.release(op);
    throw;
  }
}

void runRing(OpContext& ctx, const RingPlan& plan) { Ring(ctx, plan).run(); }

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
  const Algorithm algorithm = choose(engine, OpKind::kAllreduce, count * dtypeSize(dtype)).algorithm;
  OpContext ctx(engine, seq, opDesc(OpKind::kAllreduce, dtype, count, op, -1, algorithm), deadline);
  if (engine.size() == 1) return;
  if (algorithm == Algorithm::kRecursiveDoubling) {
    allreduceRecursiveDoubling(ctx, tensor, count, dtype, op, staged);
    return;
  }
  RingPlan plan = allreducePlan(tensor, count, dtype, op, engine.size());
  plan.staged = staged;
  runRing(ctx, plan);
}

void reduce(multipath::Engine& engine, uint64_t seq, const Window& tensor, uint64_t count, DType dtype, ReduceOp op,
            int root, Deadline deadline) {
  const uint64_t bytes = count * dtypeSize(dtype);
  const Algorithm algorithm = choose(engine, OpKind::kReduce, bytes).algorithm;
  OpContext ctx(engine, seq, opDesc(OpKind::kReduce, dtype, count, op, root, algorithm), deadline);
  const int n = engine.size();
  if (root < 0 || root >= n) ctx.abort(strcat("root ", root, " is not a rank of this group of ", n));
  if (n == 1) return;
  if (algorithm == Algorithm::kDirect) {
    reduceDirect(ctx, tensor, count, dtype, op, root);
    return;
  }
  if (algorithm == Algorithm::kTree) {
    reduceTree(ctx, tensor, count, dtype, op, root);
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
