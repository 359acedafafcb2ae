// Single copy between processes of one host (cross-memory attach).
//
// On a path whose two ends are processes of the same host, a WRITE's payload
// need not cross the TCP stack (two copies and the protocol's work on both
// sides): the frame carries the payload's address in the sender's memory
// instead, and the receiver reads it straight into the granted place of its
// region with process_vm_readv(2) -- one copy, done by the receiver, after
// the same key and bounds checks as a payload that came on the socket.
//
// Who may be read. Each side of a connection offers (OFFER frame) its pid,
// the address and value of a random cookie in its memory, and the address
// of the connection's liveness word. The receiver accepts the offer only if
// it can read that cookie from that pid and finds the value it was told --
// which holds only for a process of this host that the kernel lets it read
// (same user; Yama's ptrace_scope may forbid it) -- and the process runs in
// the receiver's own network namespace: a peer in another namespace is
// reached through a network someone built (veth, shaping, a container's
// bridge), which the path then keeps honouring. Only after the receiver's
// ACCEPT frame does the sender send writes by reference.
//
// Never a stale byte. A by-reference write is read when the receiver gets
// to it, not when it was sent. If the sender's connection fails, its writes
// complete as flushed and are sent again elsewhere; once those copies land,
// the sender's operation may finish and its buffer be reused. So the sender
// clears the connection's liveness word before it flushes anything, and the
// receiver reads that word before the payload: a write whose connection is
// dead is dropped unread. Between the two reads the receiver's event loop
// does nothing else, and it alone lands this process's writes (one loop per
// process), so the resent copy cannot have landed -- nor the buffer been
// reused -- in between.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace maestro {
namespace transport {
namespace tcp {
namespace same_host {

// The payload of an OFFER frame (a wire format, little-endian).
struct Offer {
  uint64_t pid = 0;
  uint64_t cookie_addr = 0;  // where the cookie lies in the offering process
  uint64_t alive_addr = 0;   // the connection's liveness word there
  uint8_t cookie[16] = {};
};
static_assert(sizeof(Offer) == 40, "same_host::Offer is a wire format");

// A liveness word for one connection: 1 while it is live; the connection
// stores 0 before it flushes its writes. Words are never freed (a peer may
// read one after the connection is gone): 8 bytes per connection opened.
std::atomic<uint64_t>* newLivenessWord();

// This process's offer for a connection with the given liveness word.
Offer makeOffer(const std::atomic<uint64_t>* alive);

// Receiver: "" when the offering process may be read (see above), else why
// not (for the log; the path then carries payloads on the socket).
std::string verify(const Offer& offer);

enum class Read { kCopied, kSenderGone, kFailed };
// Receiver: copy `length` bytes at `src` in the verified peer's memory to
// `dst`, unless the peer's connection is no longer live (kSenderGone:
// nothing is written). kFailed: `why` says what the kernel refused.
Read read(const Offer& peer, uint64_t src, void* dst, size_t length, std::string* why);

}  // namespace same_host
}  // namespace tcp
}  // namespace transport
}  // namespace maestro
