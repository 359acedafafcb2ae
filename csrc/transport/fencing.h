// Fencing, an optional capability of a transport (transport.h:
// Transport::fencing()): for a path set aside while it holds writes (it may
// be dead, or only slow), taking those writes back so that they can be sent
// again on other paths while the path stays open, and making sure the
// originals never land after the copies.
//
// A transport offers it only where the sender decides what lands (tcp: the
// receiver drops frames behind a mark). A connection that fails is fenced
// for good the same way (CompletionSink::onPathFenced), since its close
// does not take back what the kernel still sends of it. Verbs does not: what the adapter sent
// lands whatever the sender does later, so there the writes of a suspect path
// move once it is closed and flushed.
#pragma once

#include <cstdint>

namespace maestro {
namespace transport {

class Fencing {
 public:
  virtual ~Fencing() = default;
  // Sender side: take back every write posted on the path and not yet
  // acknowledged -- each completes once, as onWriteWithdrawn -- so that it
  // can be sent again elsewhere while the path stays open. Returns a mark
  // (> 0) for the peer's dropWritesUntil(), which must reach the peer before
  // the writes sent again do; 0 if the path is down (its writes are flushed)
  // or has been fenced too often (its writes stay and move when it closes).
  virtual uint64_t withdrawWrites(int peer, int path) = 0;
  // Receiver side: the peer withdrew its writes on the path up to `mark`.
  // Those that arrive from now on are dropped (never land); a write landing
  // now stops landing.
  virtual void dropWritesUntil(int peer, int path, uint64_t mark) = 0;
};

}  // namespace transport
}  // namespace maestro
