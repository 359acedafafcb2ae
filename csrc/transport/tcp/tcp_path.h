// One TCP path: a connected socket between a local vNIC and a peer's vNIC,
// with the paper's "one worker per QP": a sender thread draining this path's
// work queue and a receiver thread that lands incoming WRITE payloads
// directly in registered memory (no staging copy).
//
// Completions follow RC semantics: a write completes when the peer ACKs it
// (its bytes are in the peer's memory), in posting order. When the path
// fails, onPathError is raised once and every write that was not ACKed
// completes with ok=false -- including writes posted later -- so the layer
// above can resend them elsewhere.
//
// The receiver thread never blocks on a socket write (ACKs are handed to the
// sender thread), so two paths sending to each other cannot deadlock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"
#include "transport/transport.h"

namespace maestro {
namespace transport {
namespace tcp {

class TcpPath {
 public:
  TcpPath(int fd, int peer, int path, std::string description, CompletionSink* sink, RegionTable* regions);
  ~TcpPath();
  TcpPath(const TcpPath&) = delete;
  TcpPath& operator=(const TcpPath&) = delete;

  void postWrite(const WriteRequest& req);
  void postSend(const void* data, size_t length);
  void close(const std::string& why);
  // Stop both threads without raising completions (transport shutdown).
  void stop();

  bool failed() const;
  // Failed, and every write it held has been completed (flushed): nothing
  // is left for its sender thread to deliver.
  bool settled() const;
  const std::string& description() const { return description_; }
  // TCP_INFO's byte counts of this connection and its congestion control.
  PathCounters counters() const;


 private:
  struct Outgoing {
    FrameHeader header;
    const void* payload = nullptr;      // WRITE: registered memory
    std::vector<uint8_t> owned;         // SEND: a copy of the message
    uint64_t wr_id = 0;
    bool is_write = false;
  };

  void sendLoop();
  void recvLoop();
  void handleAck(uint64_t writes_received);
  void drain(uint64_t length);
  void fail(const std::string& why);
  void deliverFlush(std::vector<uint64_t>& wr_ids);

  const int fd_;
  const int peer_;
  const int path_;
  const std::string description_;
  CompletionSink* const sink_;
  RegionTable* const regions_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Outgoing> control_;       // SENDs, sent ahead of queued writes
  std::deque<Outgoing> queue_;         // writes not yet on the wire
  std::deque<uint64_t> unacked_;       // WRITEs on the wire, oldest first
  size_t transmitting_ = 0;            // entries at the back of unacked_ inside sendmsg()
  bool sending_control_ = false;       // a batch with control messages is inside sendmsg()
  std::vector<uint64_t> late_flush_;   // writes to complete with ok=false (sender thread delivers)
  uint64_t writes_acked_ = 0;          // ACKs processed (sender side)
  uint64_t writes_received_ = 0;       // WRITE frames landed (receiver side)
  uint64_t acks_sent_ = 0;             // last cumulative count we ACKed
  bool failed_ = false;
  bool error_raised_ = false;          // onPathError has returned (or was skipped at shutdown)
  bool stopping_ = false;

  std::thread sender_;
  std::thread receiver_;
};

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
