#include "multipath/channel_mux.h"

#include <cstring>
#include <thread>

#include "common/error.h"

namespace maestro {
namespace multipath {

namespace {

// The shared transport as one group sees it: its ranks, its channel. Memory
// calls pass through; paths are opened, re-opened and moved by the owning
// group only, so those calls are refused and there is no route control. A
// fence passes through, where the shared transport has fences: it takes back
// every group's writes on the path (each group hears of its own through the
// mux) and holds back every group's until the mark.
class ChannelTransport final : public transport::Transport, public transport::Fencing {
 public:
  ChannelTransport(transport::Transport& shared, uint32_t channel, std::vector<int> ranks)
      : t_(shared), fences_(shared.fencing()), channel_(channel), ranks_(std::move(ranks)) {}

  transport::Capabilities capabilities() const override {
    transport::Capabilities c = t_.capabilities();
    c.route_control = false;  // the owner probes and moves the paths
    return c;
  }
  transport::RouteControl* routeControl() override { return nullptr; }
  transport::Fencing* fencing() override { return fences_ ? this : nullptr; }

  Region registerMemory(void* addr, size_t length) override { return t_.registerMemory(addr, length); }
  void deregisterMemory(const Region& region) override { t_.deregisterMemory(region); }
  uint64_t expose(const Region& region) override { return t_.expose(region); }
  void conceal(const Region& region) override { t_.conceal(region); }

  std::string listen(const std::string&) override { refuse("listen"); }
  void expectPeers(const std::vector<std::vector<std::string>>&) override { refuse("expectPeers"); }
  void awaitAccepted(size_t, Deadline) override { refuse("awaitAccepted"); }
  std::vector<int> awaitAcceptedFrom(int, const std::vector<int>&, size_t, Deadline) override {
    refuse("awaitAcceptedFrom");
  }

  void connect(const transport::PathSpec&, const transport::Hello&, Deadline) override { refuse("connect"); }
  bool reconnect(int, int, Deadline) override { return false; }  // the owner re-opens the path
  void postWrite(int peer, int path, const transport::WriteRequest& req) override {
    MAESTRO_CHECK((req.wr_id >> kWrIdChannelShift) == 0, "a write's wr_id has its top byte in use");
    transport::WriteRequest r = req;
    r.wr_id |= static_cast<uint64_t>(channel_) << kWrIdChannelShift;
    r.imm = withChannel(r.imm, channel_);
    t_.postWrite(at(peer), path, r);
  }
  void postSend(int peer, int path, const void* data, size_t length) override {
    MAESTRO_CHECK(length > ChannelMux::kControlChannelByte, "a control message of ", length, " bytes");
    uint8_t copy[transport::kMaxControlBytes];
    MAESTRO_CHECK(length <= sizeof copy, "control message too large");
    std::memcpy(copy, data, length);
    copy[ChannelMux::kControlChannelByte] = static_cast<uint8_t>(channel_);
    t_.postSend(at(peer), path, copy, length);
  }
  void closePath(int peer, int path, const std::string& why) override { t_.closePath(at(peer), path, why); }

  std::string describePath(int peer, int path) const override { return t_.describePath(at(peer), path); }
  transport::PathCounters pathCounters(int peer, int path) const override {
    return t_.pathCounters(at(peer), path);
  }
  transport::PathDelivery delivery(int peer, int path) const override { return t_.delivery(at(peer), path); }

  uint64_t withdrawWrites(int peer, int path) override { return fences_->withdrawWrites(at(peer), path); }
  void dropWritesUntil(int peer, int path, uint64_t mark) override { fences_->dropWritesUntil(at(peer), path, mark); }

  void shutdown() override {}  // the paths outlive the group: the owner shuts them down

 private:
  [[noreturn]] void refuse(const char* what) const {
    throw Error(strcat(what, ": the paths of a group on shared paths are opened by the default group"));
  }
  int at(int peer) const {
    MAESTRO_CHECK(peer >= 0 && peer < static_cast<int>(ranks_.size()), "bad peer ", peer);
    return ranks_[peer];
  }

  transport::Transport& t_;
  transport::Fencing* const fences_;  // the shared transport's, or null
  const uint32_t channel_;
  const std::vector<int> ranks_;
};

}  // namespace

ChannelMux::ChannelMux(ChannelSink* owner) { channels_[0].sink.store(owner); }

uint32_t ChannelMux::freeChannels() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t mask = 0;
  for (uint32_t c = 1; c < kMaxChannels; ++c)
    if (!channels_[c].sink.load()) mask |= 1u << c;
  return mask;
}

bool ChannelMux::attach(uint32_t channel, ChannelSink* sink, const std::vector<int>& ranks) {
  MAESTRO_CHECK(channel > 0 && channel < kMaxChannels, "bad channel ", channel);
  std::lock_guard<std::mutex> lock(mu_);
  Channel& ch = channels_[channel];
  if (ch.sink.load()) return false;
  int most = -1;
  for (int r : ranks) most = std::max(most, r);
  ch.group_rank.assign(most + 1, -1);
  for (size_t r = 0; r < ranks.size(); ++r) ch.group_rank[ranks[r]] = static_cast<int>(r);
  ch.sink.store(sink);
  return true;
}

void ChannelMux::detach(uint32_t channel) {
  MAESTRO_CHECK(channel > 0 && channel < kMaxChannels, "bad channel ", channel);
  std::lock_guard<std::mutex> lock(mu_);
  Channel& ch = channels_[channel];
  ch.sink.store(nullptr);
  while (ch.delivering.load() > 0) std::this_thread::yield();
}

std::unique_ptr<transport::Transport> ChannelMux::channelTransport(uint32_t channel, const std::vector<int>& ranks) {
  MAESTRO_CHECK(transport_, "the shared paths have no transport yet");
  return std::make_unique<ChannelTransport>(*transport_, channel, ranks);
}

template <typename Fn>
void ChannelMux::deliver(uint32_t channel, int peer, Fn&& fn) {
  if (channel >= kMaxChannels) return;
  Channel& ch = channels_[channel];
  ch.delivering.fetch_add(1);
  ChannelSink* sink = ch.sink.load();
  if (sink) {
    if (channel == 0) {
      fn(sink, peer);
    } else if (peer >= 0 && peer < static_cast<int>(ch.group_rank.size()) && ch.group_rank[peer] >= 0) {
      fn(sink, ch.group_rank[peer]);
    }
  }
  ch.delivering.fetch_sub(1);
}

namespace {
// A wr_id as the mux sees it: the channel in its top byte, the group's own id below.
uint32_t channelOf(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> kWrIdChannelShift); }
uint64_t groupWrId(uint64_t wr_id) { return wr_id & ((uint64_t{1} << kWrIdChannelShift) - 1); }
}  // namespace

void ChannelMux::onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) {
  deliver(channelOf(wr_id), peer, [&](ChannelSink* s, int r) { s->onWriteComplete(r, path, groupWrId(wr_id), ok); });
}

void ChannelMux::onWriteWithdrawn(int peer, int path, uint64_t wr_id) {
  deliver(channelOf(wr_id), peer, [&](ChannelSink* s, int r) { s->onWriteWithdrawn(r, path, groupWrId(wr_id)); });
}

void ChannelMux::onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) {
  deliver(immChannel(imm), peer,
          [&](ChannelSink* s, int r) { s->onWriteArrived(r, path, withChannel(imm, 0), length); });
}

bool ChannelMux::landedAlready(int peer, uint32_t imm) {
  bool landed = false;
  deliver(immChannel(imm), peer, [&](ChannelSink* s, int r) { landed = s->landedAlready(r, withChannel(imm, 0)); });
  return landed;
}

void ChannelMux::onMessage(int peer, int path, const uint8_t* data, size_t length) {
  // Too short to name a channel: the owner reports the protocol error.
  const uint32_t channel = length > kControlChannelByte ? data[kControlChannelByte] : 0;
  deliver(channel, peer, [&](ChannelSink* s, int r) { s->onMessage(r, path, data, length); });
}

void ChannelMux::pairUp(int peer) {
  for (uint32_t c = 1; c < kMaxChannels; ++c) deliver(c, peer, [&](ChannelSink* s, int r) { s->onPairUp(r); });
}

void ChannelMux::pairFailed(int peer, const std::string& why) {
  for (uint32_t c = 1; c < kMaxChannels; ++c)
    deliver(c, peer, [&](ChannelSink* s, int r) { s->onPairFailed(r, why); });
}

void ChannelMux::pathMoving(int peer, int path, bool moving, const std::string& route) {
  for (uint32_t c = 1; c < kMaxChannels; ++c)
    deliver(c, peer, [&](ChannelSink* s, int r) { s->onPathMoving(r, path, moving, route); });
}

int ChannelMux::inflight(int peer, int path) {
  int n = 0;
  for (uint32_t c = 1; c < kMaxChannels; ++c) deliver(c, peer, [&](ChannelSink* s, int r) { n += s->inflightOn(r, path); });
  return n;
}

void ChannelMux::onPathError(int peer, int path, const std::string& what) {
  for (uint32_t c = 0; c < kMaxChannels; ++c)
    deliver(c, peer, [&](ChannelSink* s, int r) { s->onPathError(r, path, what); });
}

void ChannelMux::onPathFenced(int peer, int path, uint64_t mark) {
  for (uint32_t c = 0; c < kMaxChannels; ++c)
    deliver(c, peer, [&](ChannelSink* s, int r) { s->onPathFenced(r, path, mark); });
}

void ChannelMux::onPathUp(int peer, int path) {
  for (uint32_t c = 0; c < kMaxChannels; ++c)
    deliver(c, peer, [&](ChannelSink* s, int r) { s->onPathUp(r, path); });
}

}  // namespace multipath
}  // namespace maestro
