// A buffer that an operation works on while it is still being filled and
// emptied: a device tensor's host stand-in, copied in piece by piece while
// the first pieces are already on the wire, and copied back part by part as
// the operation finishes each (c10d/staging.cpp implements it).
//
// The ring (ring.cc) asks before it sends from or reduces into bytes of its
// buffer whether they are in place, and says when bytes hold their final
// value. Offsets are bytes from the start of the operation's tensor.
#pragma once

#include <cstdint>

namespace maestro {
namespace collectives {

class StagedBuffer {
 public:
  virtual ~StagedBuffer() = default;
  // Whether bytes [offset, offset + bytes) are in place. Never blocks.
  virtual bool ready(uint64_t offset, uint64_t bytes) = 0;
  // Blocks until one more piece is in place (a host copy makes it here);
  // false when every piece already is.
  virtual bool stageMore() = 0;
  // Bytes [offset, offset + bytes) hold the result and will not change
  // again: they may leave (each byte is reported once).
  virtual void final(uint64_t offset, uint64_t bytes) = 0;
};

}  // namespace collectives
}  // namespace maestro
