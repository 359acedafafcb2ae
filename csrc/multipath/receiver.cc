// The receiver: expect() announces a message's tag and length; its chunks
// land in place (onWriteArrived), the reassembler counts each once, even
// when a failover delivered two copies, and runs the per-chunk hook.
#include "multipath/engine_core.h"
#include "multipath/engine_state.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace maestro {
namespace multipath {
using namespace detail;

// ---------------------------------------------------------------- receiving

std::shared_ptr<RecvOp> EngineCore::expect(int peer, uint32_t tag, uint64_t length, ChunkHook hook, Cut cut) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  auto op = std::make_shared<RecvOp>();
  op->peer_ = peer;
  op->tag_ = tag;
  op->length_ = length;
  auto shared_hook = hook ? std::make_shared<ChunkHook>(std::move(hook)) : nullptr;
  Peer& p = *peers_[peer];
  std::vector<ChunkSpan> early;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    connectLocked(p);
    early = p.reassembler.expect(tag, length, shared_hook, cut);
    p.receiving[tag] = op;
    if (p.reassembler.complete(tag)) op->done_.store(true, std::memory_order_release);
  }
  for (const ChunkSpan& s : early) {  // chunks that landed before we asked
    if (shared_hook) (*shared_hook)(s.offset, s.length);
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.reassembler.processed(tag)) op->done_.store(true, std::memory_order_release);
  }
  return op;
}

void EngineCore::beginOperation(uint64_t seq) {
  const uint32_t epoch = static_cast<uint32_t>(seq & 3);
  // A peer never connected has nothing to forget (its table is not even
  // allocated): the cost is per connected peer, not per rank of the group.
  for (int peer : activePeers()) {
    Peer& p = *peers_[peer];
    std::lock_guard<std::mutex> lock(p.mu);
    p.reassembler.reset(epoch << kEpochShift, 1u << kEpochShift);
  }
  current_epoch_.store(epoch);
}

void EngineCore::release(const std::shared_ptr<RecvOp>& op) {
  Peer& p = *peers_[op->peer_];
  std::unique_lock<std::mutex> lock(p.mu);
  auto it = p.receiving.find(op->tag_);
  if (it != p.receiving.end() && it->second == op) {
    p.receiving.erase(it);
    p.reassembler.release(op->tag_);
  }
  // A hook still running writes into the operation's buffers: wait for it
  // (only an aborted operation releases a message with chunks in flight).
  while (op->hooks_running_ > 0) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
}

void EngineCore::onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) {
  Peer& p = *peers_[peer];
  uint32_t tag = immTag(imm);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> hook;
  std::shared_ptr<RecvOp> op;
  std::string error;
  Reassembler::Landed landed = Reassembler::Landed::kDuplicate;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    int slot_index = slotOf(p, path);
    if (slot_index >= 0) {
      PathSlot& slot = p.paths[slot_index];
      slot.bytes_received += length;
      slot.chunks_received++;
      slot.last_arrival = Clock::now();
    }
    p.heard(Clock::now());
    // Only the current operation's chunks can be legitimate: a peer writes
    // to us only after our descriptor for that operation reached it.
    // Point-to-point messages are not operations: their tags are handed out
    // by this rank and taken back only when the sender is done with them.
    if (isP2PTag(tag) || (tag >> kEpochShift) == current_epoch_.load()) {
      landed = p.reassembler.land(tag, immChunk(imm), length, &span, &hook, &error);
      if (landed == Reassembler::Landed::kError)
          markUnreachable(p, strcat("protocol error from rank ", peer, " on path ", slot_index, ": ", error));
      if (landed == Reassembler::Landed::kNew) {
        auto it = p.receiving.find(tag);
        if (it != p.receiving.end()) {
          op = it->second;
          op->hooks_running_++;
        }
      }
    }
  }
  if (landed == Reassembler::Landed::kNew) {
    if (hook) (*hook)(span.offset, span.length);  // e.g. reduce this chunk while the next arrives
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(p.mu);
      if (op) op->hooks_running_--;
      if (p.reassembler.processed(tag) && op) {
        op->done_.store(true, std::memory_order_release);
        done = true;
      }
    }
    if (done) notify();  // only a finished message is worth waking the collective thread for
  }
}

bool EngineCore::landedAlready(int peer, uint32_t imm) {
  if (peer < 0 || peer >= size_ || peer == rank_) return false;  // onWriteArrived reports it
  Peer& p = *peers_[peer];
  const uint32_t tag = immTag(imm);
  std::lock_guard<std::mutex> lock(p.mu);
  if (!isP2PTag(tag) && (tag >> kEpochShift) != current_epoch_.load()) return false;  // not ours to judge
  return p.reassembler.landed(tag, immChunk(imm));
}

void EngineCore::recycleTag(int peer, uint32_t tag) {
  MAESTRO_CHECK(peer != rank_ && peer >= 0 && peer < size_, "bad peer ", peer);
  MAESTRO_CHECK(tag < kUsedTags, "tag ", tag, " out of range");
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.mu);
  MAESTRO_CHECK(!p.receiving.count(tag), "tag ", tag, " from rank ", peer, " is still expected");
  p.reassembler.reset(tag, 1);
}

}  // namespace multipath
}  // namespace maestro
