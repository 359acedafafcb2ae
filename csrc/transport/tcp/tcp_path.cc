#include "transport/tcp/tcp_path.h"

#include <linux/tcp.h>  // struct tcp_info with the byte counters (glibc's copy predates them)
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/net.h"

namespace maestro {
namespace transport {
namespace tcp {
namespace {

// Frames a sender thread puts into one sendmsg() call.
constexpr size_t kMaxBatchFrames = 16;

// sendmsg() until every byte of the iovec array is out. Throws on error.
void sendAll(int fd, iovec* iov, size_t count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || net::isSoftError(errno)) continue;
      fail("send failed: ", net::errnoText(errno));
    }
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

}  // namespace

TcpPath::TcpPath(int fd, int peer, int path, std::string description, CompletionSink* sink,
                 RegionTable* regions)
    : fd_(fd), peer_(peer), path_(path), description_(std::move(description)), sink_(sink), regions_(regions) {
  net::setNoDelay(fd_);
  sender_ = std::thread([this] { sendLoop(); });
  receiver_ = std::thread([this] { recvLoop(); });
}

TcpPath::~TcpPath() {
  stop();
  if (failed()) {
    // A failed path closes with a reset: no TIME_WAIT holds its source port,
    // so a reconnect can reuse it (same 5-tuple, same route).
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  ::close(fd_);
}

PathCounters TcpPath::counters() const {
  PathCounters out;
  out.congestion = net::congestionOf(fd_);
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return out;
  // Fields a kernel older than these headers lacks come back short: skip them.
  if (len >= offsetof(tcp_info, tcpi_bytes_retrans) + sizeof info.tcpi_bytes_retrans) {
    out.counters["tcp_bytes_sent"] = info.tcpi_bytes_sent;  // retransmissions included
    out.counters["tcp_bytes_retrans"] = info.tcpi_bytes_retrans;
  }
  out.counters["tcp_total_retrans"] = info.tcpi_total_retrans;  // segments
  return out;
}

void TcpPath::stop() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_ && !sender_.joinable() && !receiver_.joinable()) return;
    // Let queued control messages (a goodbye) leave first, briefly.
    cv_.wait_for(lock, std::chrono::milliseconds(200),
                 [&] { return failed_ || (control_.empty() && transmitting_ == 0 && !sending_control_); });
    stopping_ = true;
  }
  ::shutdown(fd_, SHUT_RDWR);  // unblocks send/recv in both threads
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) receiver_.join();
}

bool TcpPath::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

bool TcpPath::settled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_ && unacked_.empty() && late_flush_.empty() && queue_.empty();
}

void TcpPath::postWrite(const WriteRequest& req) {
  Outgoing out;
  out.header = writeFrame(req.remote.id, req.remote.key, req.remote_offset, req.length, req.with_imm, req.imm);
  out.payload = req.src;
  out.wr_id = req.wr_id;
  out.is_write = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_ || stopping_) {
    late_flush_.push_back(req.wr_id);  // completes with ok=false on the sender thread
  } else {
    queue_.push_back(std::move(out));
  }
  cv_.notify_all();
}

void TcpPath::postSend(const void* data, size_t length) {
  MAESTRO_CHECK(length <= kMaxControlBytes, "control message of ", length, " bytes exceeds ",
                kMaxControlBytes);
  Outgoing out;
  out.header = sendFrame(length);
  out.owned.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + length);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_ || stopping_) return;  // control messages on a dead path are lost, like SENDs on an errored QP
  control_.push_back(std::move(out));
  cv_.notify_all();
}

void TcpPath::close(const std::string& why) { fail(why); }

void TcpPath::deliverFlush(std::vector<uint64_t>& wr_ids) {
  for (uint64_t wr : wr_ids) sink_->onWriteComplete(peer_, path_, wr, false);
  wr_ids.clear();
}

void TcpPath::fail(const std::string& why) {
  std::vector<uint64_t> flushed;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) {
      // Another thread is failing it: return once the sink has heard, so a
      // replacement's onPathUp never overtakes this connection's error.
      cv_.wait(lock, [&] { return error_raised_; });
      return;
    }
    failed_ = true;
    if (stopping_) {  // shutting down: nobody wants completions
      error_raised_ = true;
      cv_.notify_all();
      return;
    }
    for (auto& o : queue_) flushed.push_back(o.wr_id);
    queue_.clear();
    control_.clear();
    // Writes still inside sendmsg() are flushed by the sender thread once the
    // call returns, so their memory is not released while the kernel reads it.
    size_t settled = unacked_.size() - transmitting_;
    for (size_t i = 0; i < settled; ++i) flushed.push_back(unacked_[i]);
    unacked_.erase(unacked_.begin(), unacked_.begin() + static_cast<long>(settled));
  }
  ::shutdown(fd_, SHUT_RDWR);
  cv_.notify_all();
  MAESTRO_INFO("path ", path_, " to rank ", peer_, " (", description_, ") failed: ", why);
  sink_->onPathError(peer_, path_, why);
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_raised_ = true;
  }
  cv_.notify_all();
  deliverFlush(flushed);
}

void TcpPath::sendLoop() {
  std::vector<Outgoing> batch;
  std::vector<iovec> iov;
  std::vector<uint64_t> flush;
  FrameHeader ack;
  for (;;) {
    batch.clear();
    iov.clear();
    bool send_ack = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !late_flush_.empty() ||
               (!failed_ && (!queue_.empty() || !control_.empty() || writes_received_ > acks_sent_));
      });
      if (!late_flush_.empty()) {
        flush.swap(late_flush_);
        lock.unlock();
        if (!stopping_) deliverFlush(flush);
        flush.clear();
        continue;
      }
      if (stopping_) return;
      if (writes_received_ > acks_sent_) {
        ack = ackFrame(writes_received_);
        acks_sent_ = writes_received_;
        send_ack = true;
      }
      // Control messages (credits, descriptors, probes) overtake queued data.
      while (!control_.empty() && batch.size() < kMaxBatchFrames) {
        batch.push_back(std::move(control_.front()));
        control_.pop_front();
      }
      while (!queue_.empty() && batch.size() < kMaxBatchFrames) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
        if (batch.back().is_write) {
          unacked_.push_back(batch.back().wr_id);
          ++transmitting_;
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      sending_control_ = !batch.empty() && !batch.front().is_write;
    }
    if (send_ack) iov.push_back({&ack, sizeof ack});
    for (auto& o : batch) {
      iov.push_back({&o.header, sizeof o.header});
      if (o.header.length > 0)
        iov.push_back({const_cast<void*>(o.is_write ? o.payload : o.owned.data()), o.header.length});
    }
    std::string error;
    try {
      sendAll(fd_, iov.data(), iov.size());
    } catch (const Error& e) {
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      transmitting_ = 0;
      sending_control_ = false;
      cv_.notify_all();
      if (failed_ && !stopping_) {
        // fail() left the entries that were in transmission to us.
        flush.assign(unacked_.begin(), unacked_.end());
        unacked_.clear();
      }
    }
    if (!flush.empty()) deliverFlush(flush);
    if (!error.empty()) fail(error);
  }
}

void TcpPath::handleAck(uint64_t writes_received) {
  std::vector<uint64_t> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (writes_received < writes_acked_ || writes_received - writes_acked_ > unacked_.size()) {
      // Fall through to fail() outside the lock.
    } else {
      uint64_t n = writes_received - writes_acked_;
      for (uint64_t i = 0; i < n; ++i) {
        done.push_back(unacked_.front());
        unacked_.pop_front();
      }
      writes_acked_ = writes_received;
      if (transmitting_ > unacked_.size()) transmitting_ = unacked_.size();
    }
  }
  if (done.empty() && writes_received != writes_acked_) {
    fail(strcat("peer acknowledged ", writes_received, " writes but only ", writes_acked_, " + ",
                unacked_.size(), " were sent"));
    return;
  }
  for (uint64_t wr : done) sink_->onWriteComplete(peer_, path_, wr, true);
}

void TcpPath::drain(uint64_t length) {
  uint8_t sink[16384];
  while (length > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(length, sizeof sink));
    net::readFull(fd_, sink, n);
    length -= n;
  }
}

void TcpPath::recvLoop() {
  std::vector<uint8_t> message;
  for (;;) {
    FrameHeader h;
    std::string error;
    try {
      if (!net::readFull(fd_, &h, sizeof h)) {
        error = "connection closed by the peer";
      } else if (std::string bad = checkHeader(h); !bad.empty()) {
        error = "malformed frame from the peer: " + bad;
      } else {
        switch (static_cast<FrameType>(h.type)) {
          case FrameType::kWrite: {
            std::string why;
            RegionTable::Grant grant;
            RegionTable::Verdict verdict = regions_->grantWrite(h.region, h.key, h.offset, h.length, &grant, &why);
            if (verdict == RegionTable::Verdict::kRejected) {
              error = "rejected a write from the peer: " + why;
              break;
            }
            if (verdict == RegionTable::Verdict::kGranted) {
              // Zero copy: the payload goes straight from the socket to its
              // final place in the registered region.
              if (h.length > 0) net::readFull(fd_, grant.dst(), h.length);
              grant.release();
              if (h.flags & kFlagImm) sink_->onWriteArrived(peer_, path_, h.imm, static_cast<uint32_t>(h.length));
            } else {
              // A late duplicate for an earlier exposure: drain it, ACK it
              // (the sender's copy is accounted for), write nothing.
              drain(h.length);
              MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": dropped a stale write of ", h.length, " bytes");
            }
            {
              std::lock_guard<std::mutex> lock(mu_);
              ++writes_received_;
            }
            cv_.notify_all();
            break;
          }
          case FrameType::kSend:
            message.resize(h.length);
            if (h.length > 0) net::readFull(fd_, message.data(), h.length);
            sink_->onMessage(peer_, path_, message.data(), message.size());
            break;
          case FrameType::kAck:
            handleAck(h.offset);
            break;

        }
      }
    } catch (const Error& e) {
      error = e.what();
    }
    if (!error.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      fail(error);
      return;
    }
  }
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
