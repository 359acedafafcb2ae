// Paths, the core of the transport contract (transport.h): opening one,
// opening it again after it failed, posting on it, taking it down.
//
// A "path" is one connection (a TCP socket, an RC queue pair) between a local
// vNIC address and a peer's vNIC address. Paths are identified by (peer, path).
//
//   * postWrite() is the RDMA WRITE [WITH IMM] verb: non-blocking, it copies
//     (local region, address, length) to (remote region, offset) on one path;
//     the sender later gets onWriteComplete(wr_id) once the bytes have landed
//     in the peer's memory (RC ACK semantics, not "left the socket"); when an
//     immediate is attached, the receiver gets onWriteArrived(imm, length)
//     after the bytes are in place;
//   * postSend() is the two-sided SEND verb for small control messages: the
//     receiver gets onMessage() with a copy of the bytes;
//   * errors are per path: onPathError() is raised once, after which every
//     write still outstanding on that path completes with ok=false (the verbs
//     "flush" semantics), so nothing is lost silently and the multipath layer
//     can move those chunks to another path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "transport/memory.h"

namespace maestro {
namespace transport {

// One one-sided write. `src` must lie inside `local`.
struct WriteRequest {
  Region local;
  const void* src = nullptr;
  size_t length = 0;
  RemoteRegion remote;
  uint64_t remote_offset = 0;
  bool with_imm = false;
  uint32_t imm = 0;
  uint64_t wr_id = 0;  // opaque to the transport; echoed in onWriteComplete
};

// Largest control message postSend() accepts.
constexpr size_t kMaxControlBytes = 4096;

// Presented by the connecting side of every path and checked by the
// accepting side (acceptor.h) before anything else is read from the
// connection.
struct Hello {
  static constexpr size_t kSecretBytes = 32;
  uint8_t secret[kSecretBytes] = {};
  int32_t rank = -1;   // the connecting rank
  int32_t path = -1;   // path index
};

// Where one path runs: local vNIC address -> peer's published endpoint.
struct PathSpec {
  int peer = -1;
  int path = -1;
  std::string local_addr;       // IP literal of the local vNIC
  std::string remote_endpoint;  // what the peer's listen() returned
  uint16_t local_port = 0;      // a port from RouteControl::reservePort(), or 0 for any
};

class Paths {
 public:
  virtual ~Paths() = default;
  // Open one path as the initiating side (blocking until the peer accepted
  // the hello, or the deadline).
  virtual void connect(const PathSpec& spec, const Hello& hello, Deadline deadline) = 0;
  // Re-open a failed path this side initiated, from the same local address
  // and, where possible, the same source port (the same 5-tuple, so ECMP
  // puts it on the same route). False if the peer was not reached in time.
  virtual bool reconnect(int peer, int path, Deadline deadline) = 0;
  // Non-blocking; completions arrive through the CompletionSink.
  virtual void postWrite(int peer, int path, const WriteRequest& req) = 0;
  virtual void postSend(int peer, int path, const void* data, size_t length) = 0;
  // Take a path down (e.g. the monitor decided it is blackholed): raises
  // onPathError once and flushes its outstanding writes.
  virtual void closePath(int peer, int path, const std::string& why) = 0;
};

}  // namespace transport
}  // namespace maestro
