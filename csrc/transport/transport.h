// The transport contract: a small, RDMA-shaped interface that every transport
// (tcp/, verbs/) implements. The multipath layer above it knows nothing else.
//
// Shape (mirrors verbs):
//   * memory is registered first (-> Region: id, key); a peer that learned a
//     region's RemoteRegion may write into it one-sidedly at any offset that
//     stays inside it, presenting the key;
//   * postWrite() is the RDMA WRITE [WITH IMM] verb: non-blocking, it copies
//     (local region, address, length) to (remote region, offset) on one path;
//     the sender later gets onWriteComplete(wr_id) once the bytes have landed
//     in the peer's memory (RC ACK semantics, not "left the socket"); when an
//     immediate is attached, the receiver gets onWriteArrived(imm, length)
//     after the bytes are in place;
//   * postSend() is the two-sided SEND verb for small control messages: the
//     receiver gets onMessage() with a copy of the bytes;
//   * completions of both sides arrive on transport threads through one
//     CompletionSink (the paper's shared completion queue); a sink must not
//     block;
//   * errors are per path: onPathError() is raised once, after which every
//     write still outstanding on that path completes with ok=false (the verbs
//     "flush" semantics), so nothing is lost silently and the multipath layer
//     can move those chunks to another path.
//
// A "path" is one connection (a TCP socket, an RC queue pair) between a local
// vNIC address and a peer's vNIC address. Paths are identified by (peer, path).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace maestro {

// A registered local memory region.
struct Region {
  uint32_t id = 0;      // transport-local handle (TCP region table id)
  uint64_t key = 0;     // remote key: what a peer must present to write (rkey)
  uint32_t lkey = 0;    // local key (verbs) / unused (tcp)
  void* addr = nullptr;
  size_t length = 0;
  bool valid() const { return id != 0; }
};

// What a peer needs to write into one of our regions.
struct RemoteRegion {
  uint32_t id = 0;
  uint64_t key = 0;
  uint64_t addr = 0;    // base virtual address (verbs needs it; tcp ignores it)
  uint64_t length = 0;
};

inline RemoteRegion toRemote(const Region& r) {
  return RemoteRegion{r.id, r.key, reinterpret_cast<uint64_t>(r.addr), r.length};
}

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

// Completions, delivered on transport threads. Implementations must be
// thread-safe and must not block (they may post further work).
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Sender side: the write identified by wr_id has landed (ok) or was flushed
  // because its path failed (!ok).
  virtual void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) = 0;
  // Receiver side: a write with an immediate has landed in our memory.
  virtual void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) = 0;
  // Receiver side: a two-sided control message.
  virtual void onMessage(int peer, int path, const uint8_t* data, size_t length) = 0;
  // The path is dead. Raised once per path and connection, and always
  // before the onPathUp of the connection that replaces it.
  virtual void onPathError(int peer, int path, const std::string& what) = 0;
  // A connection for the path is established (either side; also at
  // start-up, and for a path that failed to connect then): the path is
  // (again) usable.
  virtual void onPathUp(int peer, int path) {}
  // Sender side: the write was taken back by Transport::withdrawWrites()
  // (its path stays open); it completes no other way. By default, as if
  // flushed.
  virtual void onWriteWithdrawn(int peer, int path, uint64_t wr_id) { onWriteComplete(peer, path, wr_id, false); }
};

// Presented by the connecting side of every path and checked by the
// accepting side before anything else is read from the connection.
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
  uint16_t local_port = 0;      // a port from reservePort(), or 0 for any
};

// One route probe: the 5-tuple (local endpoint -> remote endpoint) to probe.
struct RouteProbe {
  std::string local_endpoint;   // "ip:port" (a reserved port, or a listener's)
  std::string remote_endpoint;  // "ip:port"
};

// Largest control message postSend() accepts.
constexpr size_t kMaxControlBytes = 4096;

struct PathCounters {
  std::string congestion;                    // congestion control ("" if none or unknown)
  std::map<std::string, uint64_t> counters;  // name -> count since the connection opened
};

// What the network has acknowledged of a path's bytes, below the writes the
// transport completes (TCP: the kernel's ACKs, from TCP_INFO). A path whose
// bytes have had no acknowledgement for many round trips is dead, whatever
// the peer's process is doing; one whose bytes are being acknowledged is at
// most slow.
struct PathDelivery {
  bool known = false;          // false: the transport cannot tell (verbs: the adapter retries on its own)
  uint32_t unacked = 0;        // segments sent and not yet acknowledged
  double since_ack = 0;        // seconds since the last acknowledgement arrived
  double rtt = 0;              // smoothed round-trip time, seconds
  uint32_t timeouts = 0;       // retransmission timeouts in a row whose resends are not acknowledged yet
  double since_send = 0;       // seconds since the last bytes (new or resent) went out
  double loss = 0;             // share of the connection's segments it had to resend (0: none, or too few sent to tell)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;

  // ---- memory ----------------------------------------------------------
  virtual Region registerMemory(void* addr, size_t length) = 0;
  virtual void deregisterMemory(const Region& region) = 0;
  // Remote writes are accepted into a region only while it is exposed
  // (expose/conceal nest). expose() returns the key peers must present for
  // this exposure: the TCP transport draws a fresh one each time the region
  // goes from concealed to exposed, so a late duplicate of a write meant for
  // an earlier operation is recognised and dropped instead of landing in the
  // buffer of the next one. A transport whose hardware checks keys on its own
  // (verbs) may return the region's key and treat these as no-ops.
  // conceal() returns only when no remote write into the region is in
  // progress.
  virtual uint64_t expose(const Region& region) = 0;
  virtual void conceal(const Region& region) = 0;

  // ---- connections -----------------------------------------------------
  // Start accepting paths on a local vNIC address; returns the endpoint
  // string peers connect to. Accepted connections must present `secret`.
  virtual std::string listen(const std::string& local_addr) = 0;
  // Open one path as the initiating side (blocking until the peer accepted
  // the hello, or the deadline).
  virtual void connect(const PathSpec& spec, const Hello& hello, Deadline deadline) = 0;
  // Wait until `count` paths were accepted from peers (or the deadline).
  virtual void awaitAccepted(size_t count, Deadline deadline) = 0;
  // Wait until every one of `paths` from `peer` was accepted, or the
  // deadline; returns those that were. Throws if fewer than `at_least` were
  // by then. A pair connected after start-up, while others may connect
  // beside it, waits for its own paths and no count of everyone's.
  virtual std::vector<int> awaitAcceptedFrom(int peer, const std::vector<int>& paths, size_t at_least,
                                             Deadline deadline) = 0;
  // The endpoints every rank published (endpoints[rank][i], "ip:port"): an
  // accepted path `path` from `rank` must come from the address of
  // endpoints[rank][path % size], the vNIC that rank opens it from. Until
  // this is called, hellos with the right secret wait; none is installed.
  virtual void expectPeers(const std::vector<std::vector<std::string>>& endpoints) {}
  // Addresses a path uses, for the path table ("ip:port").
  virtual std::string describePath(int peer, int path) const = 0;
  // The sysfs directory of the NIC port the path runs on, whose congestion
  // and loss counters readNicCounters() reads (nic_counters.h; device-wide:
  // every path on the port shares them). Empty where the transport has none.
  virtual std::string nicPort(int peer, int path) const { return {}; }
  // The path's own congestion and loss counters, of its current connection
  // (TCP: the kernel's TCP_INFO -- bytes sent and retransmitted -- and the
  // congestion control it runs). Empty where the transport keeps none.
  virtual PathCounters pathCounters(int peer, int path) const { return {}; }
  // What the network acknowledged of the path's current connection (the
  // path monitor asks it of a stalled path only). Unknown by default.
  virtual PathDelivery delivery(int peer, int path) const { return {}; }
  // Re-open a failed path this side initiated, from the same local address
  // and, where possible, the same source port (the same 5-tuple, so ECMP
  // puts it on the same route). False if the peer was not reached in time.
  virtual bool reconnect(int peer, int path, Deadline deadline) = 0;
  // Re-open a live path this side initiated from another source port
  // (`local_port` from reservePort(), or 0 for any new one), so that ECMP
  // hashes it onto another route (path hunting). The new connection
  // replaces the old one as a reconnect does: onPathError for the old, then
  // onPathUp. False if the peer was not reached in time: the old connection
  // goes on. A transport that cannot choose a connection's route returns
  // false at once.
  virtual bool reopen(int peer, int path, uint16_t local_port, Deadline deadline) { return false; }
  // ---- route discovery (ECMP) ----
  // Reserve a source port on a local address for a later connect()
  // (PathSpec::local_port), so that a probe and the connection share their
  // 5-tuple. 0: this transport cannot choose ports.
  virtual uint16_t reservePort(const std::string& local_addr) { return 0; }
  virtual void releasePort(const std::string& local_addr, uint16_t port) {}
  // For each probe: the address of the router `ttl` hops out on the route of
  // that exact 5-tuple, from the ICMP time-exceeded answer to a TTL-limited
  // SYN (Paris traceroute, no privileges needed; the SYN dies before the
  // peer); "" where nothing answered before the deadline, or the peer was
  // reached first (no router that far). A transport that cannot probe
  // returns "" everywhere and says why.
  virtual std::vector<std::string> probeRoutes(const std::vector<RouteProbe>& probes, int ttl, Deadline deadline,
                                               std::string* why) = 0;

  // ---- data path (non-blocking) ------------------------------------------
  virtual void postWrite(int peer, int path, const WriteRequest& req) = 0;
  virtual void postSend(int peer, int path, const void* data, size_t length) = 0;
  // Take a path down (e.g. the monitor decided it is blackholed): raises
  // onPathError once and flushes its outstanding writes.
  virtual void closePath(int peer, int path, const std::string& why) = 0;
  // A fence, for a path set aside while it holds writes (it may be dead, or
  // only slow). Sender side: take back every write posted on it and not yet
  // acknowledged -- each completes once, as onWriteWithdrawn -- so that it
  // can be sent again elsewhere while the path stays open. Returns a mark
  // (> 0) for the peer's dropWritesUntil(), which must reach the peer
  // before the writes sent again do; 0 if the path is down (its writes are
  // flushed) or this transport cannot fence (verbs: what the adapter sent
  // lands whatever the sender does later).
  virtual uint64_t withdrawWrites(int peer, int path) { return 0; }
  // A fence, receiver side: the peer withdrew its writes on the path up to
  // `mark`. Those that arrive from now on are dropped (never land); a write
  // landing now stops landing.
  virtual void dropWritesUntil(int peer, int path, uint64_t mark) {}

  // Stop all threads and close every path. Idempotent.
  virtual void shutdown() = 0;
};

}  // namespace transport
}  // namespace maestro
