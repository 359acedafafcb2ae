#include "transport/tcp/tcp_path.h"

#include <linux/tcp.h>  // struct tcp_info with the byte counters (glibc's copy predates them)
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/epoll.h>
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

// Frames put into one sendmsg() batch.
constexpr size_t kMaxBatchFrames = 16;
// Bytes one readiness event may read from a path before the loop moves on
// to the others (level-triggered: the rest is reported again).
constexpr size_t kReceiveBudget = 4u << 20;

}  // namespace

TcpPath::TcpPath(int fd, int peer, int path, std::string description, CompletionSink* sink, RegionTable* regions,
                 EventLoop* loop, bool single_copy, uint64_t connection)
    : fd_(fd),
      connection_(connection),
      peer_(peer),
      path_(path),
      description_(std::move(description)),
      sink_(sink),
      regions_(regions),
      loop_(loop),
      alive_(single_copy ? same_host::newLivenessWord() : nullptr) {
  net::setNoDelay(fd_);
  net::setRtoFloor(fd_);
  int flags = ::fcntl(fd_, F_GETFL, 0);
  MAESTRO_CHECK(flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) == 0, "cannot make path ", path_,
                " to rank ", peer_, " non-blocking: ", net::errnoText(errno));
  batch_.reserve(kMaxBatchFrames);  // iov_ points into it
}

void TcpPath::start() {
  loop_id_ = loop_->add(fd_, shared_from_this(), false);
  if (alive_) {
    same_host::Offer offer = same_host::makeOffer(alive_);
    postControl(offerFrame(), &offer, sizeof offer);
  }
}

void TcpPath::markDead() {
  if (alive_) alive_->store(0);
}

TcpPath::~TcpPath() {
  markDead();
  // Registered paths are held by the loop, so no call of onEvents() is in
  // progress or can follow: the descriptor is ours to close.
  if (failed_) {
    // A failed path closes with a reset: no TIME_WAIT holds its source port,
    // so a reconnect can reuse it (same 5-tuple, same route).
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  } else {
    // A socket closed with bytes unread resets its connection, and a reset
    // discards what it had not sent yet: our goodbye, which stop() handed
    // to the kernel. What the peer sent since stop() is read and dropped, so
    // the close is an orderly one (bounded: a peer that keeps sending gets
    // its reset).
    uint8_t scratch[16384];
    for (int i = 0; i < 64 && ::recv(fd_, scratch, sizeof scratch, MSG_DONTWAIT) > 0; ++i) {
    }
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
  out.counters["writes_dropped_by_fence"] = rx_fenced_drops_.load();
  out.counters["writes_dropped_as_duplicates"] = rx_duplicate_drops_.load();
  if (alive_) {
    std::lock_guard<std::mutex> lock(mu_);
    out.counters["single_copy_bytes_sent"] = reference_bytes_;
  }
  return out;
}

PathDelivery TcpPath::delivery() const {
  constexpr uint8_t kTcpEstablished = 1;  // the kernel's TCP_ESTABLISHED (netinet/tcp.h clashes with linux/tcp.h)
  PathDelivery out;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || info.tcpi_state != kTcpEstablished) return out;
  out.known = true;
  out.unacked = info.tcpi_unacked;
  out.since_ack = info.tcpi_last_ack_recv / 1e3;
  out.rtt = info.tcpi_rtt / 1e6;
  out.timeouts = info.tcpi_retransmits;  // the socket's unanswered timeouts in a row
  out.since_send = info.tcpi_last_data_sent / 1e3;
  // Over at least kLossSample segments: a young connection's few resends
  // say little about its route.
  constexpr double kLossSample = 1000;
  out.loss = info.tcpi_total_retrans / std::max<double>(kLossSample, info.tcpi_segs_out);
  return out;
}

void TcpPath::stop() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return;
    // Let queued control messages (a goodbye) leave first, briefly, and the
    // ACK of every write that landed: the peer's operation may still wait on
    // one of them although ours, which the write completed, is over. The
    // loop sends them (it cannot wait for itself).
    if (!loop_->inLoopThread()) {
      if (!failed_ && writes_received_ > acks_sent_) (void)pushLocked();  // an error: the peer is gone anyway
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
        return failed_ || (control_.empty() && iov_next_ == iov_.size() && acks_sent_ == writes_received_);
      });
    }
    stopping_ = true;
    markDead();  // our memory may go away now: the peer must not read it
  }
  loop_->remove(loop_id_, fd_);
  ::shutdown(fd_, SHUT_RDWR);
  cv_.notify_all();
  if (loop_->inLoopThread()) {
    resetReceive();
  } else {
    loop_->post([self = shared_from_this()] { self->resetReceive(); });
  }
}

bool TcpPath::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

bool TcpPath::settled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_ && unacked_.empty() && late_.empty() && queue_.empty();
}

void TcpPath::postWrite(const WriteRequest& req) {
  Outgoing out;
  out.header = writeFrame(req.remote.id, req.remote.key, req.remote_offset, req.length, req.with_imm, req.imm);
  out.payload = req.src;
  out.wr_id = req.wr_id;
  out.is_write = true;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || stopping_) {
      late_.push_back({req.wr_id, false});  // completes with ok=false on the loop
      completeLater();
      return;
    }
    if (by_reference_ && req.length > 0) {
      out.header.flags |= kFlagByReference;
      out.reference = reinterpret_cast<uint64_t>(req.src);
      reference_bytes_ += req.length;
    }
    queue_.push_back(std::move(out));
    error = pushLocked();
  }
  if (!error.empty()) failLater(error);
}

void TcpPath::postSend(const void* data, size_t length) {
  MAESTRO_CHECK(length <= kMaxControlBytes, "control message of ", length, " bytes exceeds ",
                kMaxControlBytes);
  postControl(sendFrame(length), data, length);
}

void TcpPath::postControl(const FrameHeader& header, const void* data, size_t length) {
  Outgoing out;
  out.header = header;
  if (length > 0) out.owned.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + length);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || stopping_) return;  // control messages on a dead path are lost, like SENDs on an errored QP
    control_.push_back(std::move(out));
    error = pushLocked();
  }
  if (!error.empty()) failLater(error);
}

void TcpPath::close(const std::string& why) { fail(why); }

std::string TcpPath::pushLocked() {
  if (failed_ || stopping_) return {};
  for (;;) {
    if (iov_next_ == iov_.size()) {
      // The last batch is out: start the next one. An ACK and control
      // messages (credits, descriptors, probes) overtake queued data.
      batch_.clear();
      iov_.clear();
      iov_next_ = 0;
      if (writes_received_ > acks_sent_) {
        ack_ = ackFrame(writes_received_);
        acks_sent_ = writes_received_;
        iov_.push_back({&ack_, sizeof ack_});
      }
      while (!control_.empty() && batch_.size() < kMaxBatchFrames) {
        batch_.push_back(std::move(control_.front()));
        control_.pop_front();
      }
      while (!queue_.empty() && batch_.size() < kMaxBatchFrames) {
        batch_.push_back(std::move(queue_.front()));
        queue_.pop_front();
        unacked_.push_back({batch_.back().wr_id, false});
      }
      for (auto& o : batch_) {
        iov_.push_back({&o.header, sizeof o.header});
        if (o.header.flags & kFlagByReference)
          iov_.push_back({&o.reference, sizeof o.reference});
        else if (o.header.length > 0)
          iov_.push_back({const_cast<void*>(o.is_write ? o.payload : o.owned.data()), o.header.length});
      }
      if (iov_.empty()) break;
    }
    msghdr msg{};
    msg.msg_iov = iov_.data() + iov_next_;
    msg.msg_iovlen = iov_.size() - iov_next_;
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || net::isSoftError(errno)) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!want_write_) {
          want_write_ = true;
          loop_->modify(loop_id_, fd_, true);
        }
        return {};
      }
      return strcat("send failed: ", net::errnoText(errno));
    }
    size_t left = static_cast<size_t>(n);
    while (iov_next_ < iov_.size() && left >= iov_[iov_next_].iov_len) {
      left -= iov_[iov_next_].iov_len;
      ++iov_next_;
    }
    if (iov_next_ < iov_.size()) {
      iov_[iov_next_].iov_base = static_cast<uint8_t*>(iov_[iov_next_].iov_base) + left;
      iov_[iov_next_].iov_len -= left;
    }
  }
  if (want_write_) {
    want_write_ = false;
    loop_->modify(loop_id_, fd_, false);
  }
  cv_.notify_all();  // stop() waits for the control queue to drain
  return {};
}

void TcpPath::onEvents(uint32_t events) {
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) receive();
  if (events & EPOLLOUT) {
    std::string error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      error = pushLocked();
    }
    if (!error.empty()) failSending(error);
  }
}

void TcpPath::receive() {
  uint8_t scratch[16384];  // stale payloads are read into it and dropped
  size_t budget = kReceiveBudget;
  std::string error;
  rx_landed_ = false;
  while (budget > 0 && error.empty()) {
    void* dst;
    size_t want;
    if (rx_ == Rx::kHeader) {
      dst = reinterpret_cast<uint8_t*>(&rx_header_) + rx_have_;
      want = sizeof rx_header_ - rx_have_;
    } else if (rx_ == Rx::kDrain) {
      dst = scratch;
      want = static_cast<size_t>(std::min<uint64_t>(rx_left_, sizeof scratch));
    } else {
      // Zero copy: the payload goes straight from the socket to its final
      // place in the registered region.
      dst = rx_dst_;
      want = static_cast<size_t>(std::min<uint64_t>(rx_left_, budget));
    }
    ssize_t n = ::recv(fd_, dst, want, MSG_DONTWAIT);
    if (n == 0) {
      error = (rx_ == Rx::kHeader && rx_have_ == 0) ? "connection closed by the peer"
                                                    : "connection closed by the peer in the middle of a frame";
      break;
    }
    if (n < 0) {
      if (errno == EINTR || net::isSoftError(errno)) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      error = strcat("receive failed: ", net::errnoText(errno));
      break;
    }
    budget -= std::min(budget, static_cast<size_t>(n));
    if (rx_ == Rx::kHeader) {
      rx_have_ += static_cast<size_t>(n);
      if (rx_have_ < sizeof rx_header_) continue;
    } else {
      rx_left_ -= static_cast<uint64_t>(n);
      if (rx_ != Rx::kDrain) rx_dst_ += n;
      if (rx_left_ > 0) continue;
    }
    finishFrame(&error);
    budget -= std::min(budget, rx_copied_);  // payloads copied by reference count too
    rx_copied_ = 0;
  }
  if (!error.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    fail(error);
    return;
  }
  if (rx_landed_) {  // acknowledge what landed (the sender's window waits for it)
    std::lock_guard<std::mutex> lock(mu_);
    error = pushLocked();
  }
  if (!error.empty()) fail(error);
}

void TcpPath::countLanded() {
  std::lock_guard<std::mutex> lock(mu_);
  ++writes_received_;
  rx_landed_ = true;
}

bool TcpPath::finishFrame(std::string* error) {
  switch (rx_) {
    case Rx::kHeader: {
      rx_have_ = 0;
      const FrameHeader& h = rx_header_;
      if (std::string bad = checkHeader(h); !bad.empty()) {
        *error = "malformed frame from the peer: " + bad;
        return false;
      }
      switch (static_cast<FrameType>(h.type)) {
        case FrameType::kWrite: {
          const bool by_reference = (h.flags & kFlagByReference) != 0;
          if (by_reference && peer_offer_.pid == 0) {
            *error = "a write by reference from a peer whose single-copy offer was not accepted";
            return false;
          }
          std::string why;
          RegionTable::Grant grant;
          RegionTable::Verdict verdict = regions_->grantWrite(h.region, h.key, h.offset, h.length, &grant, &why);
          if (verdict == RegionTable::Verdict::kRejected) {
            *error = "rejected a write from the peer: " + why;
            return false;
          }
          // Fenced: the sender took this write back and sent it again on
          // another path, which may land first and be followed by a write
          // into the same place; so it is dropped, like a stale one.
          if (dropping()) {
            rx_fenced_drops_.fetch_add(1, std::memory_order_relaxed);
            MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": dropped a write of ", h.length,
                          " bytes its sender withdrew");
            grant.release();
            verdict = RegionTable::Verdict::kStale;
          }
          // A failover's second copy of a chunk that has landed already:
          // dropped unwritten, like a stale one (written again, its bytes
          // would race the reader of the complete message's slot). A
          // reference is asked once, just before its copy (finishReference).
          if (!by_reference && verdict == RegionTable::Verdict::kGranted && (h.flags & kFlagImm) &&
              sink_->landedAlready(peer_, h.imm)) {
            rx_duplicate_drops_.fetch_add(1, std::memory_order_relaxed);
            MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": dropped a second copy of a chunk that has landed");
            grant.release();
            verdict = RegionTable::Verdict::kStale;
          }
          // Not granted: a late duplicate for an earlier exposure.
          if (verdict == RegionTable::Verdict::kGranted) {
            rx_grant_ = std::move(grant);
            rx_grant_id_.store(static_cast<uint64_t>(++rx_grants_) << 32 | h.region);
          }
          if (by_reference) {
            // The payload stays in the peer's memory: read its address.
            rx_dst_ = reinterpret_cast<uint8_t*>(&rx_reference_);
            rx_left_ = sizeof rx_reference_;
            rx_ = Rx::kReference;
            return true;
          }
          rx_left_ = h.length;
          if (rx_grant_) {
            rx_dst_ = rx_grant_.dst();
            rx_ = Rx::kPayload;
          } else {
            // A late duplicate for an earlier exposure: drain it, ACK it
            // (the sender's copy is accounted for), write nothing.
            rx_ = Rx::kDrain;
          }
          if (h.length == 0) return finishFrame(error);
          return true;
        }
        case FrameType::kSend:
        case FrameType::kOffer:
          rx_message_.resize(h.length);
          rx_dst_ = rx_message_.data();
          rx_left_ = h.length;
          rx_ = Rx::kMessage;
          if (h.length == 0) return finishFrame(error);
          return true;
        case FrameType::kAck:
          handleAck(h.offset);
          return true;
        case FrameType::kMark:
          if (sameConnection(h.offset, connection_)) rx_marks_ = std::max(rx_marks_, h.offset);
          return true;
        case FrameType::kAccept: {
          std::lock_guard<std::mutex> lock(mu_);
          by_reference_ = alive_ != nullptr;  // an ACCEPT we did not ask for changes nothing
          return true;
        }
      }
      *error = "malformed frame from the peer: unknown type";  // checkHeader() let it through
      return false;
    }
    case Rx::kPayload:
      rx_ = Rx::kHeader;
      releaseGrant();
      // Counted for the ACK before the sink hears of it: the arrival may
      // complete an operation, whose rank may then stop this path at once
      // (destroy_process_group), and stop() sends the ACKs it owes.
      countLanded();
      if (rx_header_.flags & kFlagImm)
        sink_->onWriteArrived(peer_, path_, rx_header_.imm, static_cast<uint32_t>(rx_header_.length));
      return true;
    case Rx::kDrain:
      rx_ = Rx::kHeader;
      MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": dropped a stale write of ", rx_header_.length, " bytes");
      countLanded();
      return true;
    case Rx::kMessage:
      rx_ = Rx::kHeader;
      if (static_cast<FrameType>(rx_header_.type) == FrameType::kOffer)
        handleOffer();
      else
        sink_->onMessage(peer_, path_, rx_message_.data(), rx_message_.size());
      return true;
    case Rx::kReference:
      return finishReference(error);
  }
  return true;
}

bool TcpPath::finishReference(std::string* error) {
  rx_ = Rx::kHeader;
  const FrameHeader& h = rx_header_;
  bool arrived = false;
  if (rx_grant_ && (h.flags & kFlagImm) && sink_->landedAlready(peer_, h.imm)) {
    rx_duplicate_drops_.fetch_add(1, std::memory_order_relaxed);
    releaseGrant();  // its other copy has landed: nothing is copied
  }
  if (rx_grant_) {
    std::string why;
    same_host::Read read = same_host::read(peer_offer_, rx_reference_, rx_grant_.dst(), h.length, &why);
    releaseGrant();
    if (read == same_host::Read::kFailed) {
      *error = strcat("cannot copy a write of ", h.length, " bytes from the peer's memory: ", why);
      return false;
    }
    arrived = read == same_host::Read::kCopied;
    if (arrived)
      rx_copied_ += h.length;
    else  // its connection failed on the sender's side: the write was (or will be) sent again
      MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": dropped a write of ", h.length,
                    " bytes whose sender's connection is gone");
  } else {
    MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": dropped a stale write of ", h.length, " bytes");
  }
  countLanded();  // ACKed in every case, as a stale write is
  if (arrived && (h.flags & kFlagImm)) sink_->onWriteArrived(peer_, path_, h.imm, static_cast<uint32_t>(h.length));
  return true;
}

void TcpPath::handleOffer() {
  if (!alive_) return;  // single copy is off here: payloads stay on the socket both ways
  same_host::Offer offer;
  std::memcpy(&offer, rx_message_.data(), sizeof offer);  // checkHeader() pinned the length
  std::string why = same_host::verify(offer);
  static std::atomic<bool> told{false};  // once per process at INFO, the rest at TRACE
  const bool tell = !told.exchange(true);
  if (!why.empty()) {
    if (tell) MAESTRO_INFO("single copy is not used with rank ", peer_, ", whose payloads stay on the socket: ", why);
    else MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": no single copy: ", why);
    return;
  }
  if (tell)
    MAESTRO_INFO("single copy: rank ", peer_, " is a process of this host, so its payloads are copied straight "
                 "from its memory (cross-memory attach; MAESTRO_TCP_SINGLE_COPY=off keeps them on the socket)");
  peer_offer_ = offer;  // verified: its pid is not 0
  postControl(acceptFrame(), nullptr, 0);
}

void TcpPath::revoke(uint32_t region) {
  const uint64_t grant = rx_grant_id_.load();
  if (static_cast<uint32_t>(grant) != region) return;
  if (loop_->inLoopThread()) dropGrant(grant);
  else loop_->post([self = shared_from_this(), grant] { self->dropGrant(grant); });
}

void TcpPath::dropGrant(uint64_t grant) {
  if (rx_grant_id_.load() != grant) return;  // that write finished meanwhile
  const uint32_t region = static_cast<uint32_t>(grant);
  if (rx_ == Rx::kReference) {
    releaseGrant();  // the address is still read; nothing is copied
    return;
  }
  if (rx_ != Rx::kPayload) return;
  MAESTRO_TRACE("path ", path_, " from rank ", peer_, ": region ", region, " closed with ", rx_left_,
                " bytes of a write still to come; they are drained");
  releaseGrant();
  rx_ = Rx::kDrain;  // the rest is read and dropped; the write is ACKed like a stale one
}

void TcpPath::releaseGrant() {
  rx_grant_id_.store(0);
  rx_grant_.release();
}

void TcpPath::resetReceive() {
  releaseGrant();
  rx_ = Rx::kHeader;
  rx_have_ = 0;
  rx_left_ = 0;
  rx_dst_ = nullptr;
}

void TcpPath::deliverFlush(std::vector<uint64_t>& wr_ids) {
  for (uint64_t wr : wr_ids) sink_->onWriteComplete(peer_, path_, wr, false);
  wr_ids.clear();
}

void TcpPath::completeLater() {
  if (late_scheduled_) return;
  late_scheduled_ = true;
  loop_->post([self = shared_from_this()] {
    std::vector<Late> late;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      late.swap(self->late_);
      self->late_scheduled_ = false;
      stopping = self->stopping_;
    }
    if (stopping) return;
    for (const Late& l : late) {
      if (l.withdrawn) self->sink_->onWriteWithdrawn(self->peer_, self->path_, l.wr_id);
      else self->sink_->onWriteComplete(self->peer_, self->path_, l.wr_id, false);
    }
  });
}

void TcpPath::failLater(const std::string& why) {
  loop_->post([self = shared_from_this(), why] { self->failSending(why); });
}

void TcpPath::failSending(const std::string& why) {
  // A send fails on the peer's reset, which may follow its last frames (a
  // goodbye, an ACK) into our receive queue: the kernel keeps them readable.
  // They are read first, in order, so a peer that left is not taken for one
  // that crashed. The read's own error, if it meets one, is the path's.
  bool live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live = !failed_ && !stopping_;
  }
  if (live) receive();
  fail(why);
}

void TcpPath::fail(const std::string& why) {
  std::vector<uint64_t> flushed;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) {
      // Another thread is failing it: return once the sink has heard, so a
      // replacement's onPathUp never overtakes this connection's error. The
      // loop does not wait (it would hold up every other path meanwhile).
      if (!loop_->inLoopThread()) cv_.wait(lock, [&] { return error_raised_; });
      return;
    }
    failed_ = true;
    markDead();  // before any write is flushed (and sent again elsewhere): see same_host.h
    if (!stopping_) {
      // Nothing reads the payloads of the batch after this (every sendmsg()
      // runs under mu_), so every write not yet ACKed completes now.
      for (auto& o : queue_) flushed.push_back(o.wr_id);
      for (const Unacked& u : unacked_)
        if (!u.withdrawn) flushed.push_back(u.wr_id);
      for (const Late& l : late_)  // the withdrawn ones are the loop task's still
        if (!l.withdrawn) flushed.push_back(l.wr_id);
      late_.erase(std::remove_if(late_.begin(), late_.end(), [](const Late& l) { return !l.withdrawn; }),
                  late_.end());
    }
    queue_.clear();
    control_.clear();
    unacked_.clear();
    if (stopping_) late_.clear();  // nobody wants completions
    batch_.clear();
    iov_.clear();
    iov_next_ = 0;
  }
  loop_->remove(loop_id_, fd_);
  ::shutdown(fd_, SHUT_RDWR);
  if (loop_->inLoopThread()) {
    resetReceive();
  } else {
    loop_->post([self = shared_from_this()] { self->resetReceive(); });
  }
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = stopping_;
  }
  if (!stopping) {  // shutting down: nobody wants completions
    MAESTRO_INFO("path ", path_, " to rank ", peer_, " (", description_, ") failed: ", why);
    // The shutdown above lets the kernel still send what it queued: the
    // peer drops it (it may arrive after the copies of the flushed writes).
    sink_->onPathFenced(peer_, path_, markOf(connection_, kClosedFence));
    sink_->onPathError(peer_, path_, why);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_raised_ = true;
  }
  cv_.notify_all();
  deliverFlush(flushed);
}

void TcpPath::handleAck(uint64_t writes_received) {
  std::vector<uint64_t> done;
  bool bad = false;
  size_t unacked = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unacked = unacked_.size();
    if (writes_received < writes_acked_ || writes_received - writes_acked_ > unacked_.size()) {
      bad = !failed_;  // a failed path flushed them already
    } else {
      uint64_t n = writes_received - writes_acked_;
      for (uint64_t i = 0; i < n; ++i) {
        if (!unacked_.front().withdrawn) done.push_back(unacked_.front().wr_id);
        unacked_.pop_front();
      }
      writes_acked_ = writes_received;
    }
  }
  if (bad) {
    fail(strcat("peer acknowledged ", writes_received, " writes but only ", writes_acked_, " + ", unacked,
                " were sent"));
    return;
  }
  for (uint64_t wr : done) sink_->onWriteComplete(peer_, path_, wr, true);
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
