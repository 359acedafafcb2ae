// Completions, the transport's answers to the layer above (transport.h):
// they arrive on transport threads through one CompletionSink (the paper's
// shared completion queue).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace maestro {
namespace transport {

// Implementations must be thread-safe and must not block (they may post
// further work).
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Sender side: the write identified by wr_id has landed (ok) or was flushed
  // because its path failed (!ok).
  virtual void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) = 0;
  // Receiver side: a write with an immediate has landed in our memory.
  virtual void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) = 0;
  // Receiver side, asked before a write with an immediate is placed: whether
  // the chunk it carries has landed already (a failover's second copy,
  // arriving after the first). The transport then drops it unwritten and
  // ACKs it as a stale write: written again, its bytes would race the
  // reader of a slot whose message is complete (same bytes, but nothing
  // orders the late copy against that read).
  virtual bool landedAlready(int peer, uint32_t imm) { return false; }
  // Receiver side: a two-sided control message.
  virtual void onMessage(int peer, int path, const uint8_t* data, size_t length) = 0;
  // The path is dead. Raised once per path and connection, and always
  // before the onPathUp of the connection that replaces it.
  virtual void onPathError(int peer, int path, const std::string& what) = 0;
  // A connection for the path is established (either side; also at
  // start-up, and for a path that failed to connect then): the path is
  // (again) usable.
  virtual void onPathUp(int peer, int path) {}
  // Sender side: the write was taken back by Fencing::withdrawWrites() (its
  // path stays open); it completes no other way. Only a transport that
  // fences (fencing.h) raises it. By default, as if flushed.
  virtual void onWriteWithdrawn(int peer, int path, uint64_t wr_id) { onWriteComplete(peer, path, wr_id, false); }
  // Sender side, a transport that fences (fencing.h): the path's connection
  // failed, and what it had not yet delivered is flushed to be sent again
  // elsewhere. A close does not take back what is already on the way (the
  // kernel still sends what it queued, a route that swallowed it may
  // deliver it late), so the peer must drop whatever of that connection
  // still arrives -- Fencing::dropWritesUntil(mark), which no MARK of the
  // connection reaches -- before any flushed write is sent again: otherwise
  // an original can land after the copy, when its place holds the next
  // message. Raised once, just before the path's onPathError.
  virtual void onPathFenced(int peer, int path, uint64_t mark) {}
};

}  // namespace transport
}  // namespace maestro
