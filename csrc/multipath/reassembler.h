// Reassembler (paper §4.3), receiver side of one peer. Chunks land directly
// in their final place (the sender chose the address), so reassembly is only
// bookkeeping: which chunks of which message have landed, each counted once
// (a failover may deliver a chunk twice: same bytes, same place), and when a
// message is complete.
//
// A chunk may land before the receiver announced the message (the sender ran
// ahead); it is remembered and handed back by expect(). Not thread-safe: the
// engine calls it under the peer's lock and runs chunk hooks outside it, then
// reports them with processed().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "multipath/decomposer.h"

namespace maestro {
namespace multipath {

// Runs once per chunk of an expected message, on a transport thread, after
// the chunk's bytes are in place (offset/length within the message). The
// collectives reduce there: one chunk while the next arrives.
using ChunkHook = std::function<void(uint64_t offset, uint64_t length)>;

class Reassembler {
 public:
  enum class Landed { kNew, kEarly, kDuplicate, kError };

  explicit Reassembler(const Chunking& chunking);
  // How this peer's messages are cut (the sender cuts them the same way).
  const Chunking& chunking() const { return chunking_; }

  // Announce message `tag` of `bytes`, cut as `cut` (the sender's). Returns
  // the chunks that landed early (to be run through the hook and reported
  // with processed()). Throws on a tag still in use or early chunks that do
  // not fit the message.
  std::vector<ChunkSpan> expect(uint32_t tag, uint64_t bytes, std::shared_ptr<ChunkHook> hook,
                                Cut cut = Cut::kDefault);
  // A chunk landed. kNew: run *hook_out (may be null) for *span_out, then call
  // processed(). kEarly/kDuplicate: nothing to do. kError: *error says why.
  Landed land(uint32_t tag, uint32_t chunk, uint64_t length, ChunkSpan* span_out,
              std::shared_ptr<ChunkHook>* hook_out, std::string* error);
  // A hook finished; returns true when that completed the message.
  bool processed(uint32_t tag);
  bool complete(uint32_t tag) const;
  // Whether chunk `chunk` of message `tag` is in place already (or the
  // message was released): a copy of it arriving now is a duplicate.
  bool landed(uint32_t tag, uint32_t chunk) const;
  // The receiver is done with the message. Until reset() the tag drops every
  // chunk (a failover's second copy of a chunk that had landed): such a copy
  // must not pass for an early chunk of the tag's next use.
  void release(uint32_t tag);
  // Forget tags [first, first + count): a new operation reuses them.
  void reset(uint32_t first, uint32_t count);
  // Messages announced or partially landed (for tests and diagnostics).
  size_t active() const;

 private:
  struct Message {
    bool expected = false;
    uint64_t bytes = 0;
    Chunking chunking;  // this message's (cutWith)
    uint32_t chunks = 0;
    uint32_t landed = 0;
    uint32_t processed = 0;
    std::vector<uint64_t> bitmap;
    std::vector<std::pair<uint32_t, uint64_t>> early;  // (chunk, length) before expect()
    std::shared_ptr<ChunkHook> hook;
    bool released = false;
    bool inUse() const { return expected || !early.empty(); }
  };
  static bool isSet(const Message& m, uint32_t chunk);
  bool testAndSet(Message& m, uint32_t chunk);
  Message& at(uint32_t tag);

  Chunking chunking_;
  std::vector<Message> messages_;  // indexed by tag; empty until first used
};

}  // namespace multipath
}  // namespace maestro
