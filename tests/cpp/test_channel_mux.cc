// The channel mux on its own: two real TCP transports over loopback, each
// with a mux as its sink; groups on channels send through their channel
// transports, and every completion must reach the sink of the channel it
// carries, with the peer renamed to that group's rank -- or nobody's.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/error.h"
#include "common/net.h"
#include "multipath/channel_mux.h"
#include "test_util.h"
#include "transport/factory.h"

namespace maestro {
namespace multipath {
namespace {

using testing::after;

// Records what reaches one channel, as (peer, value) pairs.
class Recorder : public ChannelSink {
 public:
  struct Record {
    std::vector<std::pair<int, uint64_t>> completed;     // (peer, wr_id)
    std::vector<std::pair<int, uint32_t>> arrived;       // (peer, imm)
    std::vector<std::pair<int, std::string>> messages;  // (peer, bytes)
    std::vector<std::pair<int, int>> errors, ups;        // (peer, path)
    std::vector<int> pairs_up;
    std::vector<std::pair<int, int>> moving;  // (peer, path) being re-opened by the owner
    size_t total() const { return completed.size() + arrived.size() + messages.size() + errors.size() + ups.size(); }
  };
  void onWriteComplete(int peer, int, uint64_t wr_id, bool) override { add([&] { r_.completed.emplace_back(peer, wr_id); }); }
  void onWriteArrived(int peer, int, uint32_t imm, uint32_t) override { add([&] { r_.arrived.emplace_back(peer, imm); }); }
  void onMessage(int peer, int, const uint8_t* data, size_t length) override {
    add([&] { r_.messages.emplace_back(peer, std::string(reinterpret_cast<const char*>(data), length)); });
  }
  void onPathError(int peer, int path, const std::string&) override { add([&] { r_.errors.emplace_back(peer, path); }); }
  void onPathUp(int peer, int path) override { add([&] { r_.ups.emplace_back(peer, path); }); }
  void onPairUp(int peer) override { add([&] { r_.pairs_up.push_back(peer); }); }
  void onPairFailed(int, const std::string&) override {}
  void onPathMoving(int peer, int path, bool moving, const std::string&) override {
    if (moving) add([&] { r_.moving.emplace_back(peer, path); });
  }
  int inflightOn(int, int) override { return 0; }

  template <typename Pred>
  bool waitFor(Pred pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, after(20), [&] { return pred(static_cast<const Record&>(r_)); });
  }
  Record now() {
    std::lock_guard<std::mutex> lock(mu_);
    return r_;
  }

 private:
  template <typename Fn>
  void add(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    fn();
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  Record r_;
};

// Ranks 0 and 1, one TCP path between them, a mux on each side; the
// owners (channel 0) record too.
class ChannelMuxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 2; ++r) {
      mux_[r] = std::make_unique<ChannelMux>(&owner_[r]);
      transport::TransportOptions o;
      o.rank = r;
      o.world_size = 2;
      for (size_t i = 0; i < o.secret.size(); ++i) o.secret[i] = static_cast<uint8_t>(i + 3);
      o.sink = mux_[r].get();
      t_[r] = transport::makeTransport("tcp", o);
      mux_[r]->setTransport(t_[r].get());
      secret_ = o.secret;
    }
    const std::string endpoint = t_[1]->listen("127.0.0.1");
    t_[1]->expectPeers({{net::parseAddress("127.0.0.1", 1).str()}, {endpoint}});
    transport::Hello hello;
    std::memcpy(hello.secret, secret_.data(), secret_.size());
    hello.rank = 0;
    hello.path = 0;
    t_[0]->connect(transport::PathSpec{1, 0, "127.0.0.1", endpoint}, hello, after(20));
    t_[1]->awaitAccepted(1, after(20));
  }
  void TearDown() override {
    for (auto& t : t_) t->shutdown();
  }

  // A write of `bytes` from rank 0's buffer to rank 1's, through `t`
  // (rank 0's side), to `peer` (in t's group).
  void write(transport::Transport& t, int peer, uint32_t imm, uint64_t wr_id) {
    transport::WriteRequest w;
    w.local = src_region_;
    w.src = src_.data();
    w.length = src_.size();
    w.remote = dst_remote_;
    w.with_imm = true;
    w.imm = imm;
    w.wr_id = wr_id;
    t.postWrite(peer, 0, w);
  }
  void registerBuffers() {
    src_.assign(4096, 7);
    dst_.assign(4096, 0);
    src_region_ = t_[0]->registerMemory(src_.data(), src_.size());
    Region dst = t_[1]->registerMemory(dst_.data(), dst_.size());
    dst_remote_ = toRemote(dst);
    dst_remote_.key = t_[1]->expose(dst);
  }

  Recorder owner_[2];
  std::unique_ptr<ChannelMux> mux_[2];
  std::unique_ptr<transport::Transport> t_[2];
  std::array<uint8_t, transport::Hello::kSecretBytes> secret_{};
  std::vector<uint8_t> src_, dst_;
  Region src_region_;
  RemoteRegion dst_remote_;
};

TEST_F(ChannelMuxTest, EachCompletionReachesItsChannelWithThePeerInItsGroupsRanks) {
  registerBuffers();
  // A group of the two ranks in reverse order: its rank 0 is transport
  // rank 1, so each side's peer is group rank 0 or 1 the other way round.
  Recorder group[2];
  const std::vector<int> ranks = {1, 0};
  ASSERT_TRUE(mux_[0]->attach(3, &group[0], ranks));
  ASSERT_TRUE(mux_[1]->attach(3, &group[1], ranks));
  EXPECT_FALSE(mux_[0]->attach(3, &group[0], ranks)) << "a channel is given once";
  EXPECT_EQ(0u, mux_[0]->freeChannels() & (1u << 3));
  auto ct = mux_[0]->channelTransport(3, ranks);

  // Rank 0 is group rank 1; its peer, transport rank 1, is group rank 0.
  write(*ct, 0, encodeImm(5, 9), 77);
  ASSERT_TRUE(group[1].waitFor([](const auto& r) { return r.arrived.size() == 1; }));
  ASSERT_TRUE(group[0].waitFor([](const auto& r) { return r.completed.size() == 1; }));
  EXPECT_EQ(std::make_pair(1, encodeImm(5, 9)), group[1].now().arrived[0]) << "channel bits stripped, peer renamed";
  EXPECT_EQ(std::make_pair(0, uint64_t{77}), group[0].now().completed[0]) << "wr_id's channel byte stripped";
  EXPECT_EQ(std::vector<uint8_t>(4096, 7), dst_);

  // A control message carries the channel in its second byte.
  uint8_t msg[16] = {4, 0, 0, 0, 1, 2, 3, 4};
  ct->postSend(0, 0, msg, sizeof msg);
  ASSERT_TRUE(group[1].waitFor([](const auto& r) { return r.messages.size() == 1; }));
  EXPECT_EQ(1, group[1].now().messages[0].first);
  EXPECT_EQ(3, group[1].now().messages[0].second[1]);
  EXPECT_EQ(0, msg[1]) << "the caller's bytes are not changed";

  // The owners' traffic stays on channel 0, peers as the transport names them.
  write(*t_[0], 1, encodeImm(6, 1), 88);
  ASSERT_TRUE(owner_[1].waitFor([](const auto& r) { return r.arrived.size() == 1; }));
  ASSERT_TRUE(owner_[0].waitFor([](const auto& r) { return r.completed.size() == 1; }));
  EXPECT_EQ(std::make_pair(0, encodeImm(6, 1)), owner_[1].now().arrived[0]);
  EXPECT_EQ(1u, group[1].now().arrived.size()) << "the owner's write reached the group";

  // A channel nobody listens on: dropped on arrival, on either side of it.
  auto stray = mux_[0]->channelTransport(9, ranks);
  stray->postSend(0, 0, msg, sizeof msg);
  mux_[1]->detach(3);
  ct->postSend(0, 0, msg, sizeof msg);
  // Ordered on the path: once the owner's message behind them arrived, they
  // were delivered or dropped.
  uint8_t mine[16] = {4};
  t_[0]->postSend(1, 0, mine, sizeof mine);
  ASSERT_TRUE(owner_[1].waitFor([](const auto& r) { return r.messages.size() == 1; }));
  EXPECT_EQ(1u, group[1].now().messages.size()) << "a message reached a detached channel";
  EXPECT_EQ(1u, owner_[1].now().messages.size());
  EXPECT_NE(0u, mux_[1]->freeChannels() & (1u << 3)) << "a detached channel is free again";

  // A path's failure reaches every channel that has the peer.
  t_[0]->closePath(1, 0, "closed by the test");
  ASSERT_TRUE(owner_[0].waitFor([](const auto& r) { return r.errors.size() == 1; }));
  ASSERT_TRUE(group[0].waitFor([](const auto& r) { return r.errors.size() == 1; }));
  EXPECT_EQ(std::make_pair(1, 0), owner_[0].now().errors[0]);
  EXPECT_EQ(std::make_pair(0, 0), group[0].now().errors[0]);
  mux_[0]->detach(3);
}

TEST_F(ChannelMuxTest, AGroupWithoutThePeerHearsNothingOfIt) {
  Recorder solo, other;
  // Rank 1's group holds rank 1 alone; rank 0 sends on the same channel as
  // if it were in it.
  ASSERT_TRUE(mux_[1]->attach(2, &solo, {1}));
  auto ct = mux_[0]->channelTransport(2, {1, 0});
  uint8_t msg[16] = {4};
  ct->postSend(0, 0, msg, sizeof msg);
  uint8_t mine[16] = {4};
  t_[0]->postSend(1, 0, mine, sizeof mine);
  ASSERT_TRUE(owner_[1].waitFor([](const auto& r) { return r.messages.size() == 1; }));
  EXPECT_EQ(0u, solo.now().total());
  // Pair notices go to the channels with the peer only.
  ASSERT_TRUE(mux_[0]->attach(4, &other, {1, 0}));
  mux_[0]->pairUp(1);
  mux_[1]->pairUp(0);
  EXPECT_EQ(std::vector<int>{0}, other.now().pairs_up);
  EXPECT_TRUE(solo.now().pairs_up.empty());
  EXPECT_TRUE(owner_[0].now().pairs_up.empty()) << "the owner connected the pair itself";
  mux_[0]->pathMoving(1, 0, true, "");
  EXPECT_EQ((std::vector<std::pair<int, int>>{{0, 0}}), other.now().moving) << "a hunted path, in the group's ranks";
  EXPECT_TRUE(owner_[0].now().moving.empty());
  // What a group may not do with paths it does not own.
  EXPECT_THROW(ct->listen("127.0.0.1"), Error);
  EXPECT_FALSE(ct->reconnect(0, 0, after(1)));
  ct->shutdown();  // a no-op: the owner's path is still there
  t_[0]->postSend(1, 0, mine, sizeof mine);
  ASSERT_TRUE(owner_[1].waitFor([](const auto& r) { return r.messages.size() == 2; }));
  mux_[1]->detach(2);
  mux_[0]->detach(4);
}

// A group on shared paths neither probes nor moves them (the owner does):
// its transport has no route control, says so, and fences through the
// shared transport, whose fence takes back every group's writes.
TEST_F(ChannelMuxTest, AChannelHasNoRouteControlAndFencesThroughTheSharedPaths) {
  auto ct = mux_[0]->channelTransport(2, {1, 0});
  const transport::Capabilities shared = t_[0]->capabilities(), mine = ct->capabilities();
  ASSERT_TRUE(shared.route_control && shared.fencing);
  EXPECT_EQ(nullptr, ct->routeControl());
  EXPECT_FALSE(mine.route_control);
  ASSERT_NE(nullptr, ct->fencing());
  EXPECT_TRUE(mine.fencing);
  EXPECT_EQ(shared.descriptor_per_path, mine.descriptor_per_path);
  EXPECT_EQ(shared.congestion_control, mine.congestion_control);
  EXPECT_GT(ct->fencing()->withdrawWrites(0, 0), 0u) << "group rank 0 is transport rank 1, whose path is up";
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
