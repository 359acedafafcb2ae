// A path's fences: its writes taken back to be sent again on other paths
// (withdraw(), behind a MARK frame), and on the receiving side the originals
// that still arrive on the old path dropped up to that mark (dropUntil()).
#include "transport/tcp/tcp_path.h"

#include <algorithm>

namespace maestro {
namespace transport {
namespace tcp {

uint64_t TcpPath::withdraw() {
  uint64_t mark = 0;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || stopping_) return 0;
    // So many fences on one connection: its writes stay, and move when it
    // is closed. (Checked before any is taken back: nothing else would
    // complete them.)
    if (fences_ + 1 >= kClosedFence) return 0;
    for (Unacked& u : unacked_) {  // oldest first
      if (u.withdrawn) continue;
      u.withdrawn = true;  // its bytes may still be leaving: the MARK follows them
      late_.push_back({u.wr_id, true});
    }
    for (const Outgoing& o : queue_) late_.push_back({o.wr_id, true});
    queue_.clear();
    mark = markOf(connection_, ++fences_);
    Outgoing out;
    out.header = markFrame(mark);
    control_.push_back(std::move(out));
    completeLater();
    error = pushLocked();
  }
  if (!error.empty()) failLater(error);
  return mark;
}

void TcpPath::dropUntil(uint64_t mark) {
  if (!loop_->inLoopThread()) {
    loop_->post([self = shared_from_this(), mark] { self->dropUntil(mark); });
    loop_->quiesce();  // in effect when this returns
    return;
  }
  if (!sameConnection(mark, connection_)) return;  // for a connection this one replaced
  rx_drop_until_ = std::max(rx_drop_until_, mark);
  if (!dropping()) return;
  // A payload landing now is dropped from here on: its first bytes are
  // those of a copy that is on its way elsewhere (same bytes, same place).
  if (rx_ == Rx::kPayload) {
    rx_fenced_drops_.fetch_add(1, std::memory_order_relaxed);
    releaseGrant();
    rx_ = Rx::kDrain;
  } else if (rx_ == Rx::kReference && rx_grant_) {
    rx_fenced_drops_.fetch_add(1, std::memory_order_relaxed);
    releaseGrant();  // its address is still read; nothing is copied
  }
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
