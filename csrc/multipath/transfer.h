// A message in flight: a write (SendOp, cut into ChunkDescs) and an
// expected arrival (RecvOp), as Engine::write() and Engine::expect() return
// them. Their state is the sender's (sender.h) and the engine's (receiver.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "transport/memory.h"

namespace maestro {
namespace multipath {

class SendOp;

class RecvOp {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  uint64_t length() const { return length_; }

 private:
  friend class EngineCore;
  int peer_ = -1;
  uint32_t tag_ = 0;
  uint64_t length_ = 0;
  std::atomic<bool> done_{false};
  int hooks_running_ = 0;  // chunk hooks in progress (peer.mu)
};

// The Decomposer's unit of work: one chunk of one message (paper Table 1:
// WR id, VP id, message id, chunk id).
struct ChunkDesc {
  SendOp* op = nullptr;
  uint32_t index = 0;   // chunk id
  int path = -1;        // virtual path it is posted to
  uint32_t generation = 0;  // which connection of that path
  uint64_t offset = 0;  // within the message
  uint64_t length = 0;
  int attempts = 0;
  Clock::time_point posted{};
};

class SendOp {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  const std::string& error() const { return error_; }  // valid once failed()
  uint64_t length() const { return length_; }

 private:
  friend class Sender;
  int peer_ = -1;
  uint32_t tag_ = 0;
  uint64_t length_ = 0;
  Region src_;
  const uint8_t* src_addr_ = nullptr;
  RemoteRegion dst_;
  uint64_t dst_offset_ = 0;
  std::vector<ChunkDesc> chunks_;
  int window_ = 0;            // chunks of it a path may hold at once, with the others' (0: the path's window)
  uint32_t remaining_ = 0;    // chunks not yet landed (the peer's lock, see sender.h)
  uint32_t outstanding_ = 0;  // chunks posted and not yet completed (the peer's lock)
  std::vector<uint32_t> taken_;  // chunks posted on each path, resends included (the peer's lock)
  std::string error_;
  std::atomic<bool> done_{false};
  std::atomic<bool> failed_{false};
};

}  // namespace multipath
}  // namespace maestro
