// The TCP transport: the shared transport contract over four loopback
// paths, plus what only TCP has: the hello handshake, and frames crafted by
// hand on a raw socket that must be rejected without a byte landing.
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <stdexcept>
#include <thread>

#include "common/net.h"
#include "transport/factory.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/same_host.h"
#include "transport/tcp/tcp_path.h"
#include "transport_contract.h"

namespace maestro {
namespace testing {

INSTANTIATE_TEST_SUITE_P(Tcp, TransportContract,
                         ::testing::Values(ContractParam{"tcp", {"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}},
                                           ContractParam{"tcp",
                                                         {"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"},
                                                         true}),
                         contractName);

namespace {

using transport::tcp::FrameHeader;
using transport::tcp::HelloReply;
using transport::tcp::HelloWire;

// A TcpTransport playing rank 1 of 2, and a raw socket playing rank 0.
class RawPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::TransportOptions o;
    o.rank = 1;
    o.world_size = 2;
    for (size_t i = 0; i < o.secret.size(); ++i) o.secret[i] = static_cast<uint8_t>(i + 3);
    secret_ = o.secret;
    o.sink = &sink_;
    configure(o);
    t_ = transport::makeTransport("tcp", o);
    endpoint_ = t_->listen("127.0.0.1");
    t_->expectPeers({{"127.0.0.1:1"}, {endpoint_}});  // rank 0 connects from 127.0.0.1
    memory_.assign(4096 + 2 * kGuard, 0x5C);
    region_ = t_->registerMemory(memory_.data() + kGuard, 4096);
    key_ = t_->expose(region_);
  }
  virtual void configure(transport::TransportOptions&) {}
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
    t_->conceal(region_);
    t_->shutdown();
  }
  // A hello with the group's secret.
  HelloWire goodHello(int rank, int path) const {
    HelloWire h;
    for (size_t i = 0; i < sizeof h.secret; ++i) h.secret[i] = secret_[i];
    h.rank = rank;
    h.path = path;
    return h;
  }
  // Connect and present a hello; returns the reply status.
  uint32_t hello(int rank, int path, bool good_secret = true) {
    fd_ = net::connectFrom("127.0.0.1", net::parseEndpoint(endpoint_), after(10));
    HelloWire h;
    for (size_t i = 0; i < sizeof h.secret; ++i) h.secret[i] = good_secret ? secret_[i] : 0;
    h.rank = rank;
    h.path = path;
    net::writeFull(fd_, &h, sizeof h);
    HelloReply r;
    EXPECT_TRUE(net::readFull(fd_, &r, sizeof r));
    return r.status;
  }
  void sendFrame(const FrameHeader& h, size_t payload) {
    net::writeFull(fd_, &h, sizeof h);
    std::vector<uint8_t> bytes(payload, 0xA1);
    try {
      if (payload) net::writeFull(fd_, bytes.data(), bytes.size());
    } catch (const Error&) {
      // The receiver may close before reading the payload.
    }
  }
  // The next frame from the transport, past any fence MARK (a connection
  // opens with one once a fence was made in this process).
  bool readFrame(FrameHeader* h) {
    do {
      if (!net::readFull(fd_, h, sizeof *h)) return false;
    } while (h->type == static_cast<uint8_t>(transport::tcp::FrameType::kMark));
    return true;
  }
  // The transport's ACKs, up to one that counts `writes` (nothing else comes meanwhile).
  void expectAcked(uint64_t writes) {
    uint64_t acked = 0;
    while (acked < writes) {
      FrameHeader ack;
      ASSERT_TRUE(readFrame(&ack));
      ASSERT_EQ(static_cast<uint8_t>(transport::tcp::FrameType::kAck), ack.type);
      acked = ack.offset;
    }
    EXPECT_EQ(writes, acked);
  }
  // A write of `length` bytes from `local` to the raw peer on path 0 (it
  // checks nothing: any region will do), once the transport has the path:
  // it answers a hello before it installs the connection, so the reply
  // alone does not say the path is there (posting on it then failed "no
  // path 0 to rank 0" once in 51 runs).
  void postToRawPeer(const Region& local, const std::vector<uint8_t>& src, size_t length, uint64_t wr_id) {
    if (!sink_.waitFor([](const auto& s) { return std::count(s.ups.begin(), s.ups.end(), 0) > 0; }, 10))
      throw std::runtime_error("path 0 to rank 0 never came up");  // fails the test, which then goes no further
    transport::WriteRequest w;
    w.local = local;
    w.src = src.data();
    w.length = length;
    w.remote = RemoteRegion{7, 7, 0, src.size()};
    w.wr_id = wr_id;
    t_->postWrite(0, 0, w);
  }
  void expectUntouched() {
    for (size_t i = 0; i < memory_.size(); ++i) ASSERT_EQ(0x5C, memory_[i]) << "byte " << i << " was written";
  }
  std::string waitError() {
    EXPECT_TRUE(sink_.waitFor([&](const auto& s) { return !s.errors.empty(); }, 10));
    auto errors = sink_.now().errors;
    return errors.empty() ? "" : errors[0];
  }

  static constexpr size_t kGuard = 256;
  RecordingSink sink_;
  std::unique_ptr<transport::Transport> t_;
  std::array<uint8_t, transport::Hello::kSecretBytes> secret_{};
  std::string endpoint_;
  std::vector<uint8_t> memory_;
  Region region_;
  uint64_t key_ = 0;
  int fd_ = -1;
};

}  // namespace

// The layers above ask for a capability, not for a transport's name; a kind
// answers before a transport of it exists (from the same declaration its
// transports answer from: the contract checks that they agree).
TEST(TransportCapabilities, TcpOffersRouteControlAndFencesVerbsNeither) {
  const transport::Capabilities tcp = transport::capabilities("tcp"), verbs = transport::capabilities("verbs");
  EXPECT_TRUE(tcp.route_control && tcp.fencing && tcp.descriptor_per_path && tcp.congestion_control);
  EXPECT_FALSE(verbs.route_control || verbs.fencing || verbs.descriptor_per_path || verbs.congestion_control);
  EXPECT_THROW(transport::capabilities("carrier pigeon"), Error);
}

TEST_F(RawPeer, HelloWithWrongSecretIsRefused) {
  EXPECT_EQ(static_cast<uint32_t>(transport::tcp::HelloStatus::kBadSecret), hello(0, 0, false));
}

TEST_F(RawPeer, HelloFromOutOfRangeRankIsRefused) {
  EXPECT_EQ(static_cast<uint32_t>(transport::tcp::HelloStatus::kBadRank), hello(5, 0));
  ::close(fd_);
  EXPECT_EQ(static_cast<uint32_t>(transport::tcp::HelloStatus::kBadRank), hello(1, 0));  // itself
}

// Connections that are not maestro peers -- half a hello, random bytes,
// silence -- hold only themselves: a legitimate hello behind them is
// answered at once, and shutdown does not wait for them.
TEST_F(RawPeer, StrangersDoNotDelayALegitimatePathOrShutdown) {
  auto ep = net::parseEndpoint(endpoint_);
  int half = net::connectFrom("127.0.0.1", ep, after(5));
  HelloWire h;
  net::writeFull(half, &h, 10);  // 10 of its bytes, then nothing
  int noise = net::connectFrom("127.0.0.1", ep, after(5));
  std::vector<uint8_t> junk(sizeof(HelloWire));
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  net::writeFull(noise, junk.data(), junk.size());
  int silent = net::connectFrom("127.0.0.1", ep, after(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them arrive first
  fd_ = net::connectFrom("127.0.0.1", ep, after(5));
  h = goodHello(0, 0);
  net::writeFull(fd_, &h, sizeof h);
  ASSERT_TRUE(net::waitReadable(fd_, after(1))) << "the hello waited behind the strangers";
  HelloReply r;
  ASSERT_TRUE(net::readFull(fd_, &r, sizeof r));
  EXPECT_EQ(0u, r.status);
  HelloReply refused;
  ASSERT_TRUE(net::waitReadable(noise, after(1)));
  ASSERT_TRUE(net::readFull(noise, &refused, sizeof refused)) << "random bytes get an answer";
  EXPECT_EQ(static_cast<uint32_t>(transport::tcp::HelloStatus::kBadMagic), refused.status);
  auto start = Clock::now();
  t_->shutdown();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1)) << "shutdown waited for a stranger";
  for (int fd : {half, noise, silent}) ::close(fd);
}

// A connection that presents no (whole) hello is closed at the deadline.
TEST_F(RawPeer, AConnectionWithoutAHelloIsClosedAtTheDeadline) {
  auto ep = net::parseEndpoint(endpoint_);
  int silent = net::connectFrom("127.0.0.1", ep, after(5));
  int half = net::connectFrom("127.0.0.1", ep, after(5));
  HelloWire h;
  net::writeFull(half, &h, 47);
  for (int fd : {silent, half}) {
    ASSERT_TRUE(net::waitReadable(fd, after(5))) << "still open after 5 s";
    char byte;
    EXPECT_EQ(0, ::recv(fd, &byte, 1, 0)) << "closed, with no answer";
    ::close(fd);
  }
}

// More silent connections than may wait at once: the oldest give way, and
// a legitimate hello that comes after all of them is answered at once.
TEST_F(RawPeer, AFloodOfSilentConnectionsDoesNotLockOutAPeer) {
  auto ep = net::parseEndpoint(endpoint_);
  std::vector<int> flood;
  for (int i = 0; i < 100; ++i) flood.push_back(net::connectFrom("127.0.0.1", ep, after(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fd_ = net::connectFrom("127.0.0.1", ep, after(5));
  HelloWire h = goodHello(0, 0);
  net::writeFull(fd_, &h, sizeof h);
  ASSERT_TRUE(net::waitReadable(fd_, after(1))) << "the hello waited behind the flood";
  HelloReply r;
  ASSERT_TRUE(net::readFull(fd_, &r, sizeof r));
  EXPECT_EQ(0u, r.status);
  size_t closed = 0;
  for (int fd : flood) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) ++closed;
    ::close(fd);
  }
  EXPECT_GE(closed, 100u - 64u) << "the oldest waiting connections give way";
}

// A hello with the right secret from an address that rank did not publish
// for the path is refused: the secret alone does not make a peer.
TEST_F(RawPeer, HelloFromAnotherAddressIsRefused) {
  int fd = net::connectFrom("127.0.0.2", net::parseEndpoint(endpoint_), after(5));
  HelloWire h = goodHello(0, 0);
  net::writeFull(fd, &h, sizeof h);
  HelloReply r;
  ASSERT_TRUE(net::readFull(fd, &r, sizeof r));
  EXPECT_EQ(static_cast<uint32_t>(transport::tcp::HelloStatus::kBadAddress), r.status);
  ::close(fd);
  // Nor does it replace a live connection of that path.
  ASSERT_EQ(0u, hello(0, 0));
  fd = net::connectFrom("127.0.0.2", net::parseEndpoint(endpoint_), after(5));
  net::writeFull(fd, &h, sizeof h);
  ASSERT_TRUE(net::readFull(fd, &r, sizeof r));
  EXPECT_EQ(static_cast<uint32_t>(transport::tcp::HelloStatus::kBadAddress), r.status);
  ::close(fd);
  EXPECT_FALSE(net::waitReadable(fd_, after(0.3))) << "the live connection was closed";
  auto errors = sink_.now().errors;
  EXPECT_TRUE(errors.empty()) << errors[0];
}

// Before the ranks' endpoints are known, a hello with the right secret is
// neither refused nor installed: it waits for them.
TEST(TcpHello, AHelloBeforeThePeersAreKnownWaitsForThem) {
  RecordingSink sink;
  transport::TransportOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.sink = &sink;
  auto t = transport::makeTransport("tcp", o);
  std::string endpoint = t->listen("127.0.0.1");
  int fd = net::connectFrom("127.0.0.1", net::parseEndpoint(endpoint), after(5));
  HelloWire h;  // the secret is all zeros, like the transport's
  h.rank = 0;
  h.path = 0;
  net::writeFull(fd, &h, sizeof h);
  EXPECT_FALSE(net::waitReadable(fd, after(0.3))) << "answered before the peers' addresses were known";
  t->expectPeers({{"127.0.0.1:1"}, {endpoint}});
  ASSERT_TRUE(net::waitReadable(fd, after(5)));
  HelloReply r;
  ASSERT_TRUE(net::readFull(fd, &r, sizeof r));
  EXPECT_EQ(0u, r.status);
  t->awaitAccepted(1, after(5));
  t->shutdown();
  ::close(fd);
}

// A second hello for a connected path is a reconnect (the peer saw the old
// connection die first): it replaces the old connection, which fails.
TEST_F(RawPeer, SecondHelloReplacesTheConnection) {
  ASSERT_EQ(0u, hello(0, 0));
  int first = fd_;
  EXPECT_EQ(0u, hello(0, 0));
  std::string error = waitError();
  EXPECT_NE(std::string::npos, error.find("replaced by a new connection")) << error;
  char byte;
  EXPECT_EQ(0, ::recv(first, &byte, 1, 0)) << "the old connection is closed";
  ::close(first);
}

// A write still inside sendmsg() when its connection is replaced must come
// back flushed, so the layer above re-sends it: dropped, the operation that
// waits for it would hang. The raw peer never reads, so the write is stuck
// in the kernel's send buffer when the reconnect arrives.
TEST_F(RawPeer, WriteInTransmissionIsFlushedWhenTheConnectionIsReplaced) {
  ASSERT_EQ(0u, hello(0, 0));
  int first = fd_;
  std::vector<uint8_t> big(32 << 20, 0x42);
  postToRawPeer(t_->registerMemory(big.data(), big.size()), big, big.size(), 77);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // into sendmsg(), which blocks
  EXPECT_EQ(0u, hello(0, 0));
  EXPECT_TRUE(sink_.waitFor([&](const auto& s) { return s.flushed.size() == 1; }, 10))
      << "the write in transmission was never completed";
  {
    auto r = sink_.now();
    EXPECT_TRUE(r.completed.empty());
    if (!r.flushed.empty()) EXPECT_EQ(77u, r.flushed[0]);
  }
  ::close(first);
  t_->shutdown();  // before `big` goes
}

TEST_F(RawPeer, GoodWriteLands) {
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 100, 50, true, 9), 50);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  for (size_t i = 0; i < memory_.size(); ++i)
    ASSERT_EQ((i >= kGuard + 100 && i < kGuard + 150) ? 0xA1 : 0x5C, memory_[i]) << i;
  // ...and is acknowledged with an ACK frame counting it.
  FrameHeader ack;
  ASSERT_TRUE(readFrame(&ack));
  EXPECT_EQ(static_cast<uint8_t>(transport::tcp::FrameType::kAck), ack.type);
  EXPECT_EQ(1u, ack.offset);
}

// The receive side resumes wherever the socket left it: frames that arrive
// one byte at a time (headers, payloads and control messages split anywhere)
// land exactly as whole ones do.
TEST_F(RawPeer, FramesSplitIntoSingleBytesLandWhole) {
  ASSERT_EQ(0u, hello(0, 0));
  net::setNoDelay(fd_);
  std::vector<uint8_t> stream;
  auto append = [&](const FrameHeader& h, size_t payload, uint8_t value) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&h);
    stream.insert(stream.end(), p, p + sizeof h);
    stream.insert(stream.end(), payload, value);
  };
  append(transport::tcp::writeFrame(region_.id, key_, 10, 100, true, 1), 100, 0x11);
  append(transport::tcp::sendFrame(5), 5, 'm');
  append(transport::tcp::writeFrame(region_.id, key_, 200, 0, true, 2), 0, 0);  // empty write with an immediate
  append(transport::tcp::writeFrame(region_.id, key_, 300, 64, false, 0), 64, 0x22);
  for (uint8_t byte : stream) {
    ASSERT_EQ(1, ::send(fd_, &byte, 1, MSG_NOSIGNAL));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 2 && s.messages.size() == 1; }, 10));
  // Every write is ACKed, the last one included (it had no immediate).
  expectAcked(3);
  EXPECT_EQ(1u, sink_.now().arrivals[0].first);
  EXPECT_EQ(100u, sink_.now().arrivals[0].second);
  EXPECT_EQ(2u, sink_.now().arrivals[1].first);
  EXPECT_EQ(0u, sink_.now().arrivals[1].second);
  EXPECT_EQ("mmmmm", sink_.now().messages[0]);
  for (size_t i = 0; i < memory_.size(); ++i) {
    size_t o = i - kGuard;
    uint8_t want = i < kGuard ? 0x5C : (o >= 10 && o < 110) ? 0x11 : (o >= 300 && o < 364) ? 0x22 : 0x5C;
    ASSERT_EQ(want, memory_[i]) << "byte " << i;
  }
  EXPECT_TRUE(sink_.now().errors.empty());
}

// A peer that stops in the middle of a payload (frozen: SIGSTOP, a swap
// storm) must not hold the region open: closing it returns at once, the
// rest of that payload is drained when it comes, and the path lives on.
TEST_F(RawPeer, ConcealDoesNotWaitForAPeerFrozenMidPayload) {
  ASSERT_EQ(0u, hello(0, 0));
  FrameHeader frame = transport::tcp::writeFrame(region_.id, key_, 0, 4096, false, 0);
  net::writeFull(fd_, &frame, sizeof frame);
  std::vector<uint8_t> head(100, 0xA1);
  net::writeFull(fd_, head.data(), head.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // landing: the path holds the region
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> concealed = done->get_future();
  std::thread([this, done] {
    t_->conceal(region_);
    done->set_value();
  }).detach();
  ASSERT_EQ(std::future_status::ready, concealed.wait_for(std::chrono::seconds(2)))
      << "conceal() waited for a peer that stopped mid-payload";
  std::vector<uint8_t> rest(4096 - 100, 0xA2);
  net::writeFull(fd_, rest.data(), rest.size());  // the peer wakes up
  // Its write is ACKed (drained, like a stale one) and nothing more lands.
  FrameHeader ack;
  ASSERT_TRUE(net::waitReadable(fd_, after(5)));
  ASSERT_TRUE(readFrame(&ack));
  EXPECT_EQ(static_cast<uint8_t>(transport::tcp::FrameType::kAck), ack.type);
  for (size_t i = kGuard + 100; i < memory_.size(); ++i) ASSERT_EQ(0x5C, memory_[i]) << "byte " << i << " was written";
  auto errors = sink_.now().errors;
  EXPECT_TRUE(errors.empty()) << "the path failed: " << errors[0];
  key_ = t_->expose(region_);  // TearDown conceals it once more
}

// A peer that goes away in the middle of a payload fails the path, and the
// half-written region is let go: conceal() (which waits for writes in
// progress) returns.
TEST_F(RawPeer, PeerClosingMidPayloadFailsThePathAndReleasesTheRegion) {
  ASSERT_EQ(0u, hello(0, 0));
  FrameHeader h = transport::tcp::writeFrame(region_.id, key_, 0, 1000, true, 4);
  net::writeFull(fd_, &h, sizeof h);
  std::vector<uint8_t> half(400, 0x33);
  net::writeFull(fd_, half.data(), half.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::close(fd_);
  fd_ = -1;
  std::string error = waitError();
  EXPECT_NE(std::string::npos, error.find("in the middle of a frame")) << error;
  auto concealed = std::async(std::launch::async, [&] { t_->conceal(region_); });
  EXPECT_EQ(std::future_status::ready, concealed.wait_for(std::chrono::seconds(5)))
      << "the failed path still pins the region";
  concealed.wait();
  key_ = t_->expose(region_);  // TearDown conceals once more
  EXPECT_TRUE(sink_.now().arrivals.empty());
}

// A revoke is meant for the write that was landing when its region was
// closed. When that write finishes by itself before the event loop gets to
// the revoke, and meanwhile the region is exposed again and a new write into
// it starts, the late revoke must leave the new write alone: it lands whole
// and raises its arrival. The loop is held in a task while the revoke is
// queued, so the old write's end, the new write's start and then the revoke
// run in that order, every time.
TEST(TcpPathRevoke, ALateRevokeDoesNotDropTheNextWriteIntoTheRegion) {
  namespace tcp = transport::tcp;
  auto loop = std::make_shared<tcp::EventLoop>();
  tcp::RegionTable table;
  std::vector<uint8_t> memory(1000, 0x5C);
  Region region = table.add(memory.data(), memory.size());
  const uint64_t key = table.expose(region.id);
  int fds[2];
  ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds));
  const int peer = fds[1];
  std::future<void> concealed;

  // On the first write's arrival (the loop thread, in the middle of its
  // receive): the conceal is over; expose the region again and start the
  // second write, half of its payload.
  class Sink : public RecordingSink {
   public:
    std::function<void(uint32_t imm)> hook;
    void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override {
      if (hook) hook(imm);
      RecordingSink::onWriteArrived(peer, path, imm, length);
    }
  } sink;
  sink.hook = [&](uint32_t imm) {
    if (imm != 1) return;
    concealed.wait();
    FrameHeader second = tcp::writeFrame(region.id, table.expose(region.id), 0, 100, true, 2);
    net::writeFull(peer, &second, sizeof second);
    std::vector<uint8_t> half(50, 0xB2);
    net::writeFull(peer, half.data(), half.size());
  };
  auto path = std::make_shared<tcp::TcpPath>(fds[0], 0, 0, "test", &sink, &table, loop.get());
  std::atomic<bool> revoked{false};
  table.setRevoker([&](uint32_t id) {
    path->revoke(id);
    revoked = true;
  });
  path->start();
  auto consumed = [&] {
    int queued = 1;
    auto deadline = after(10);
    while (::ioctl(fds[0], FIONREAD, &queued) == 0 && queued > 0 && Clock::now() < deadline) std::this_thread::yield();
    loop->quiesce();
    return queued == 0;
  };

  // The first write stops after 100 of its 1000 bytes: the path holds the region.
  FrameHeader first = tcp::writeFrame(region.id, key, 0, 1000, true, 1);
  net::writeFull(peer, &first, sizeof first);
  std::vector<uint8_t> bytes(1000, 0xA1);
  net::writeFull(peer, bytes.data(), 100);
  ASSERT_TRUE(consumed());
  // Hold the loop; conceal() gives up waiting and queues the revoke behind it.
  std::promise<void> entered, release;
  loop->post([&] {
    entered.set_value();
    release.get_future().wait();
  });
  entered.get_future().wait();
  concealed = std::async(std::launch::async, [&] { table.conceal(region.id); });
  auto deadline = after(30);
  while (!revoked && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(revoked.load()) << "conceal() did not revoke the write in progress";
  // The rest of the first write is there when the loop goes on.
  net::writeFull(peer, bytes.data() + 100, 900);
  release.set_value();
  ASSERT_TRUE(sink.waitFor([](const auto& s) { return s.arrivals.size() == 1; }, 10));
  loop->quiesce();  // the revoke has run
  std::vector<uint8_t> rest(50, 0xB2);
  net::writeFull(peer, rest.data(), rest.size());
  EXPECT_TRUE(sink.waitFor([](const auto& s) { return s.arrivals.size() == 2; }, 5))
      << "the revoke of the first write dropped the second";
  for (size_t i = 0; i < memory.size(); ++i) ASSERT_EQ(i < 100 ? 0xB2 : 0xA1, memory[i]) << "byte " << i;
  EXPECT_TRUE(sink.now().errors.empty());
  path->stop();
  loop->quiesce();
  path.reset();
  ::close(peer);
  table.conceal(region.id);
}

// shutdown() is the point after which the sink may be destroyed: a
// completion the event loop is delivering at that moment must have returned
// before shutdown() does.
class SlowSink : public RecordingSink {
 public:
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override {
    in_callback = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    RecordingSink::onWriteArrived(peer, path, imm, length);
    returned = true;
  }
  std::atomic<bool> in_callback{false}, returned{false};
};

class RawPeerSlowSink : public RawPeer {
  void configure(transport::TransportOptions& o) override { o.sink = &slow_; }
 protected:
  // The raw peer writes 50 bytes; shutdown() runs while the sink is still
  // in that write's arrival callback.
  void shutdownDuringArrival() {
    ASSERT_EQ(0u, hello(0, 0));
    sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 50, true, 9), 50);
    auto deadline = after(10);
    while (!slow_.in_callback && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(slow_.in_callback.load());
    t_->shutdown();
  }
  SlowSink slow_;
};

TEST_F(RawPeerSlowSink, ShutdownWaitsForACompletionInProgress) {
  ASSERT_NO_FATAL_FAILURE(shutdownDuringArrival());
  EXPECT_TRUE(slow_.returned.load()) << "shutdown() returned while the sink was still being called";
}

// A write whose arrival the sink is still hearing of when this rank shuts
// down (its operation completed on that arrival and the process group is
// being destroyed) is acknowledged all the same: the writer's operation,
// which only that ACK completes, must not fail because the receiver's
// finished first.
TEST_F(RawPeerSlowSink, AWriteThatLandedIsAcknowledgedEvenWhenShutdownFollowsItsArrival) {
  ASSERT_NO_FATAL_FAILURE(shutdownDuringArrival());
  FrameHeader ack{};
  ASSERT_TRUE(readFrame(&ack)) << "the connection closed without acknowledging the write";
  EXPECT_EQ(static_cast<uint8_t>(transport::tcp::FrameType::kAck), ack.type);
  EXPECT_EQ(1u, ack.offset);
}

// Holds the event loop in the arrival of a write with immediate kHold until
// the test opens the gate.
class GateSink : public RecordingSink {
 public:
  static constexpr uint32_t kHold = 77;
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override {
    if (imm == kHold) {
      std::unique_lock<std::mutex> lock(gate_mu_);
      held_ = true;
      gate_cv_.notify_all();
      gate_cv_.wait(lock, [&] { return open_; });
    }
    RecordingSink::onWriteArrived(peer, path, imm, length);
  }
  bool waitHeld() {
    std::unique_lock<std::mutex> lock(gate_mu_);
    return gate_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(gate_mu_);
    open_ = true;
    gate_cv_.notify_all();
  }

 private:
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool held_ = false, open_ = false;
};

class RawPeerGated : public RawPeer {
  void configure(transport::TransportOptions& o) override { o.sink = &gate_; }
 protected:
  GateSink gate_;
};

// A rank that leaves sends its goodbye, closes, and resets the connection
// when our bytes reached it after it stopped reading. A send of ours that
// then fails must not lose the goodbye, which the kernel still holds for us:
// the engine would take the exit for a crash. The loop is held on path 1
// while path 0's peer says goodbye, closes with a reset and our send on
// path 0 fails, so the failure is handled before the loop has seen the
// goodbye arrive.
TEST_F(RawPeerGated, AMessageBeforeTheResetIsReadWhenOurSendFailsOnIt) {
  ASSERT_EQ(0u, hello(0, 1));
  const int hold = fd_;
  ASSERT_EQ(0u, hello(0, 0));
  const FrameHeader w = transport::tcp::writeFrame(region_.id, key_, 0, 50, true, GateSink::kHold);
  std::vector<uint8_t> payload(50, 0xA1);
  net::writeFull(hold, &w, sizeof w);
  net::writeFull(hold, payload.data(), payload.size());
  ASSERT_TRUE(gate_.waitHeld()) << "the write on path 1 never arrived";
  // Path 0's peer: goodbye, close (FIN), and a reset.
  const FrameHeader bye = transport::tcp::sendFrame(3);
  net::writeFull(fd_, &bye, sizeof bye);
  net::writeFull(fd_, "bye", 3);
  ::shutdown(fd_, SHUT_WR);
  linger l{1, 0};
  setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd_);
  fd_ = -1;
  // Loopback delivers the reset at once; should it come later, the send
  // below goes out and the path fails on the read instead (the test passes
  // without proving its point, never the reverse).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  t_->postSend(0, 0, "x", 1);
  gate_.open();
  ASSERT_TRUE(gate_.waitFor([&](const auto& r) { return !r.errors.empty(); }, 10)) << "path 0 never failed";
  auto r = gate_.now();
  EXPECT_EQ(std::vector<std::string>{"bye"}, r.messages) << "the goodbye before the reset was lost; path error: "
                                                          << r.errors[0];
  ::close(hold);
}

// The path's own counters: its congestion control and TCP_INFO's bytes.
class RawPeerReno : public RawPeer {
  void configure(transport::TransportOptions& o) override { o.tcp_congestion = "reno"; }
};

std::string kernelDefaultCongestion() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  in >> name;
  return name;
}

TEST_F(RawPeer, PathReportsTheKernelsCongestionControlByDefault) {
  EXPECT_TRUE(t_->pathCounters(0, 0).congestion.empty());  // no such path yet
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 50, true, 9), 50);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  EXPECT_EQ(kernelDefaultCongestion(), t_->pathCounters(0, 0).congestion);
}

TEST_F(RawPeerReno, PathRunsTheConfiguredCongestionControlAndCountsItsBytes) {
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 50, true, 9), 50);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  FrameHeader ack;
  ASSERT_TRUE(readFrame(&ack));  // the transport has sent (at least) this ACK
  const transport::PathCounters c = t_->pathCounters(0, 0);
  EXPECT_EQ("reno", c.congestion);
  ASSERT_EQ(1u, c.counters.count("tcp_bytes_sent"));
  EXPECT_GE(c.counters.at("tcp_bytes_sent"), sizeof ack);
  EXPECT_EQ(0u, c.counters.at("tcp_bytes_retrans"));  // loopback loses nothing
}

struct BadFrame {
  const char* name;
  std::function<FrameHeader(uint32_t region, uint64_t key)> make;
  size_t payload;
  const char* expect;  // part of the path error
};

class RawPeerBadFrame : public RawPeer, public ::testing::WithParamInterface<BadFrame> {};

TEST_P(RawPeerBadFrame, IsRejectedAndNothingIsWritten) {
  ASSERT_EQ(0u, hello(0, 0));
  const BadFrame& bad = GetParam();
  sendFrame(bad.make(region_.id, key_), bad.payload);
  std::string error = waitError();
  EXPECT_NE(std::string::npos, error.find(bad.expect)) << error;
  expectUntouched();
  EXPECT_TRUE(sink_.now().arrivals.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, RawPeerBadFrame,
    ::testing::Values(
        BadFrame{"BadMagic", [](uint32_t r, uint64_t k) { auto h = transport::tcp::writeFrame(r, k, 0, 16, true, 0); h.magic = 0x12345678; return h; }, 16, "bad frame magic"},
        BadFrame{"UnknownType", [](uint32_t r, uint64_t k) { auto h = transport::tcp::writeFrame(r, k, 0, 16, true, 0); h.type = 99; return h; }, 16, "unknown frame type"},
        BadFrame{"ReservedBits", [](uint32_t r, uint64_t k) { auto h = transport::tcp::writeFrame(r, k, 0, 16, true, 0); h.reserved = 1; return h; }, 16, "reserved"},
        BadFrame{"UnknownFlags", [](uint32_t r, uint64_t k) { auto h = transport::tcp::writeFrame(r, k, 0, 16, true, 0); h.flags = 0x80; return h; }, 16, "flags"},
        BadFrame{"UnknownRegion", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r + 100, k, 0, 16, true, 0); }, 16, "unknown region"},
        BadFrame{"WrongKey", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r, k ^ 1, 0, 16, true, 0); }, 16, "wrong key"},
        BadFrame{"PastTheEnd", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r, k, 4090, 16, true, 0); }, 16, "overruns"},
        BadFrame{"LongerThanRegion", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r, k, 0, 4097, true, 0); }, 4097, "overruns"},
        BadFrame{"OffsetOverflow", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r, k, ~0ull - 7, 16, true, 0); }, 16, "overruns"},
        BadFrame{"OffsetPlusLengthWraps", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r, k, 1ull << 63, 1ull << 63, true, 0); }, 0, "exceeds"},
        BadFrame{"HugeLength", [](uint32_t r, uint64_t k) { return transport::tcp::writeFrame(r, k, 0, 1ull << 40, true, 0); }, 0, "exceeds"},
        BadFrame{"HugeControl", [](uint32_t, uint64_t) { return transport::tcp::sendFrame(1 << 20); }, 0, "control limit"},
        BadFrame{"ControlWithWriteFields", [](uint32_t r, uint64_t) { auto h = transport::tcp::sendFrame(4); h.region = r; return h; }, 4, "SEND frame"},
        BadFrame{"AckWithPayload", [](uint32_t, uint64_t) { auto h = transport::tcp::ackFrame(0); h.length = 8; return h; }, 8, "ACK frame"},
        BadFrame{"AckForUnsentWrites", [](uint32_t, uint64_t) { return transport::tcp::ackFrame(3); }, 0, "acknowledged 3 writes"}),
    [](const ::testing::TestParamInfo<BadFrame>& i) { return std::string(i.param.name); });

// A write into a region that is registered but not exposed to any operation
// is dropped (drained, never written), and one presenting a key of an earlier
// exposure -- a late duplicate after a failover -- likewise.
TEST_F(RawPeer, StaleWritesAreDrainedNotWritten) {
  ASSERT_EQ(0u, hello(0, 0));
  uint64_t old_key = key_;
  t_->conceal(region_);
  sendFrame(transport::tcp::writeFrame(region_.id, old_key, 0, 64, true, 1), 64);  // concealed region
  key_ = t_->expose(region_);
  ASSERT_NE(old_key, key_) << "each exposure draws a fresh key";
  sendFrame(transport::tcp::writeFrame(region_.id, old_key, 0, 64, true, 2), 64);  // key of the last exposure
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 8, true, 3), 8);       // a good one after them
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  EXPECT_EQ(3u, sink_.now().arrivals[0].first);
  for (size_t i = 0; i < memory_.size(); ++i) ASSERT_EQ(i >= kGuard && i < kGuard + 8 ? 0xA1 : 0x5C, memory_[i]) << i;
  EXPECT_TRUE(sink_.now().errors.empty());
}


// ---- fences (Fencing::withdrawWrites / dropWritesUntil) -------------------
// A path set aside while it holds writes has them withdrawn and sent again
// elsewhere while it stays open; its peer drops what still arrives of them,
// from the notice of the fence until the sender's MARK that follows them.

namespace {
uint64_t fenceDrops(transport::Transport& t) {
  return t.pathCounters(0, 0).counters.at("writes_dropped_by_fence");
}
}  // namespace

TEST_F(RawPeer, WritesWithdrawnByTheirSenderAreDroppedUntilItsMark) {
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 8, true, 1), 8);  // the path is in place
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  t_->fencing()->dropWritesUntil(0, 0, 5);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 64, 64, true, 2), 64);  // withdrawn: dropped
  sendFrame(transport::tcp::markFrame(4), 0);                                    // an earlier fence's mark
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 128, 64, true, 3), 64); // still dropped
  sendFrame(transport::tcp::markFrame(5), 0);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 192, 8, true, 4), 8);   // after the mark: lands
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 2; }, 10));
  EXPECT_EQ(4u, sink_.now().arrivals[1].first);
  for (size_t i = 0; i < memory_.size(); ++i) {
    const size_t at = i - kGuard;
    const bool written = i >= kGuard && (at < 8 || (at >= 192 && at < 200));
    ASSERT_EQ(written ? 0xA1 : 0x5C, memory_[i]) << "byte " << at;
  }
  EXPECT_EQ(2u, fenceDrops(*t_));
  // Dropped writes are acknowledged like landed ones: the sender's count goes on.
  expectAcked(4);
  // A notice that arrives after its mark holds nothing back.
  t_->fencing()->dropWritesUntil(0, 0, 5);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 256, 8, true, 5), 8);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 3; }, 10));
  EXPECT_EQ(2u, fenceDrops(*t_));
  EXPECT_TRUE(sink_.now().errors.empty());
}

// The notice may come while a withdrawn write is landing: the rest of it is
// dropped (its first bytes are those of the copy on its way elsewhere).
TEST_F(RawPeer, AFenceStopsAWriteThatIsLanding) {
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 8, true, 1), 8);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  const FrameHeader h = transport::tcp::writeFrame(region_.id, key_, 1024, 2048, true, 2);
  net::writeFull(fd_, &h, sizeof h);
  std::vector<uint8_t> first(1024, 0xA1), rest(1024, 0xB2);
  net::writeFull(fd_, first.data(), first.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // most often read by now: landing
  t_->fencing()->dropWritesUntil(0, 0, 9);
  net::writeFull(fd_, rest.data(), rest.size());
  sendFrame(transport::tcp::markFrame(9), 0);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 8, 8, true, 3), 8);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 2; }, 10));
  EXPECT_EQ(3u, sink_.now().arrivals[1].first) << "the stopped write raised an arrival";
  for (size_t at = 2048; at < 3072; ++at) ASSERT_EQ(0x5C, memory_[kGuard + at]) << "byte " << at;
  EXPECT_EQ(1u, fenceDrops(*t_));
}

// Sender side: every write not yet acknowledged comes back once, as
// withdrawn -- the one on the wire and the one queued behind it -- and a MARK
// follows what went out of them; their later ACK completes nothing, and
// writes posted after the fence complete as usual.
TEST_F(RawPeer, WithdrawnWritesCompleteOnceAndTheMarkFollowsThem) {
  ASSERT_EQ(0u, hello(0, 0));
  std::vector<uint8_t> big(16 << 20, 0x42);
  Region local = t_->registerMemory(big.data(), big.size());
  auto write = [&](uint64_t id, size_t length) { postToRawPeer(local, big, length, id); };
  write(1, big.size());  // the raw peer does not read yet: stuck in the socket
  write(2, 64);
  const uint64_t mark = t_->fencing()->withdrawWrites(0, 0);
  ASSERT_GT(mark, 0u);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.withdrawn.size() == 2; }, 10));
  // Read the stream: the writes that had gone out, then the mark.
  std::vector<uint8_t> sink(1 << 20);
  uint64_t writes = 0;
  for (;;) {
    FrameHeader h;
    ASSERT_TRUE(net::readFull(fd_, &h, sizeof h));
    if (h.type == static_cast<uint8_t>(transport::tcp::FrameType::kMark) && h.offset == mark) break;
    if (h.type != static_cast<uint8_t>(transport::tcp::FrameType::kWrite)) continue;  // an earlier mark
    writes++;
    for (uint64_t left = h.length; left > 0;) {
      const size_t n = std::min<uint64_t>(left, sink.size());
      ASSERT_TRUE(net::readFull(fd_, sink.data(), n));
      left -= n;
    }
  }
  EXPECT_GE(writes, 1u) << "the write on the wire went before the mark";
  sendFrame(transport::tcp::ackFrame(writes), 0);
  write(3, 64);
  FrameHeader h;
  ASSERT_TRUE(readFrame(&h));
  ASSERT_EQ(static_cast<uint8_t>(transport::tcp::FrameType::kWrite), h.type);
  ASSERT_TRUE(net::readFull(fd_, sink.data(), h.length));
  sendFrame(transport::tcp::ackFrame(writes + 1), 0);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.completed.size() == 1; }, 10));
  const auto r = sink_.now();
  EXPECT_EQ(std::vector<uint64_t>({1, 2}), r.withdrawn);
  EXPECT_EQ(std::vector<uint64_t>({3}), r.completed);
  EXPECT_TRUE(r.flushed.empty());
  EXPECT_TRUE(r.errors.empty());
  t_->shutdown();  // before `big` goes
}

// A connection that fails while it holds writes flushes them to be sent
// again elsewhere, but the kernel still sends what it had queued (a route
// that swallowed it may deliver it seconds later, after the copies, into a
// place that holds the next message by then). So the sender hands the layer
// above a mark to tell its peer before the flush: one that names the
// connection and that no MARK reaches.
TEST_F(RawPeer, AConnectionThatFailsWithWritesOnItIsFencedForGoodBeforeTheyAreFlushed) {
  ASSERT_EQ(0u, hello(0, 0));
  std::vector<uint8_t> big(16 << 20, 0x42);
  // The raw peer does not read: stuck in the socket.
  postToRawPeer(t_->registerMemory(big.data(), big.size()), big, big.size(), 1);
  t_->closePath(0, 0, "set aside by the test");
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.flushed.size() == 1; }, 10));
  const auto r = sink_.now();
  ASSERT_EQ(1u, r.fences.size());
  EXPECT_EQ(0u, r.fences[0].errors_before) << "fenced before the path's error";
  EXPECT_EQ(0u, r.fences[0].flushed_before) << "fenced before its writes were flushed";
  const uint64_t mark = r.fences[0].mark;
  EXPECT_TRUE(transport::tcp::sameConnection(mark, goodHello(0, 0).connection)) << "names the connection";
  EXPECT_EQ(transport::tcp::kClosedFence, mark & transport::tcp::kClosedFence) << "a count no MARK carries";
  t_->shutdown();  // before `big` goes
}

// Receiver side: told of that mark, it drops every write still arriving on
// the connection, past any MARK its sender could have sent, and keeps
// acknowledging them; the write landing when the notice comes stops there.
TEST_F(RawPeer, AFailedConnectionsFenceDropsEveryWriteStillArrivingOnIt) {
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 8, true, 1), 8);  // the path is in place
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  const FrameHeader landing = transport::tcp::writeFrame(region_.id, key_, 1024, 2048, true, 2);
  net::writeFull(fd_, &landing, sizeof landing);
  std::vector<uint8_t> first(1024, 0xA1), rest(1024, 0xB2);
  net::writeFull(fd_, first.data(), first.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // most often read by now: landing
  t_->fencing()->dropWritesUntil(0, 0, transport::tcp::markOf(0, transport::tcp::kClosedFence));
  net::writeFull(fd_, rest.data(), rest.size());
  sendFrame(transport::tcp::markFrame(transport::tcp::markOf(0, transport::tcp::kClosedFence - 1)), 0);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 64, 64, true, 3), 64);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 128, 8, true, 4), 8);
  expectAcked(4);  // dropped writes are acknowledged like landed ones
  for (size_t i = 0; i < memory_.size(); ++i) {
    const size_t at = i - kGuard;
    if (i >= kGuard && at < 8) continue;  // the write before the notice
    if (i >= kGuard && at >= 1024 && at < 2048) continue;  // what landed of the stopped one, maybe
    ASSERT_EQ(0x5C, memory_[i]) << "byte " << at << " was written after the notice";
  }
  EXPECT_EQ(1u, sink_.now().arrivals.size()) << "a dropped write raised an arrival";
  EXPECT_EQ(3u, fenceDrops(*t_));
  EXPECT_TRUE(sink_.now().errors.empty());
}


// The drops are the path's: a connection that replaces the one that counted
// them counts on from there.
TEST_F(RawPeer, FenceDropsCountOnWhenTheConnectionIsReplaced) {
  ASSERT_EQ(0u, hello(0, 0));
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 0, 8, true, 1), 8);  // the path is in place
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  t_->fencing()->dropWritesUntil(0, 0, 5);
  sendFrame(transport::tcp::writeFrame(region_.id, key_, 64, 8, true, 2), 8);  // dropped
  expectAcked(2);
  ASSERT_EQ(1u, fenceDrops(*t_));
  const int first = fd_;
  ASSERT_EQ(0u, hello(0, 0));  // a second hello replaces the connection
  ::close(first);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return !s.errors.empty(); }, 10)) << "the first one was replaced";
  EXPECT_EQ(1u, fenceDrops(*t_));
  for (size_t at = 64; at < 72; ++at) ASSERT_EQ(0x5C, memory_[kGuard + at]) << "byte " << at;
}

// ---- single copy (same_host.h) -------------------------------------------
// The raw peer is this very process: its offer is a real one (its pid, a
// cookie in its memory, its own liveness word), so the transport may read
// the payloads of its by-reference writes straight from here.
class RawPeerSingleCopy : public RawPeer {
 protected:
  void configure(transport::TransportOptions& o) override { o.single_copy = true; }
  // Read frames until one of `type` arrives (skipping ACKs); false at EOF.
  bool readUntil(transport::tcp::FrameType type, FrameHeader* out, std::vector<uint8_t>* payload = nullptr) {
    for (;;) {
      FrameHeader h;
      if (!readFrame(&h)) return false;
      std::vector<uint8_t> bytes(h.type == static_cast<uint8_t>(transport::tcp::FrameType::kAck) ? 0 : h.length);
      if (!bytes.empty() && !net::readFull(fd_, bytes.data(), bytes.size())) return false;
      if (h.type == static_cast<uint8_t>(type)) {
        *out = h;
        if (payload) *payload = std::move(bytes);
        return true;
      }
    }
  }
  // A by-reference write of `length` bytes at `src` (in this process).
  void sendByReference(uint64_t offset, size_t length, const void* src, uint32_t imm) {
    FrameHeader h = transport::tcp::writeFrame(region_.id, key_, offset, length, true, imm);
    h.flags |= transport::tcp::kFlagByReference;
    uint64_t address = reinterpret_cast<uint64_t>(src);
    net::writeFull(fd_, &h, sizeof h);
    net::writeFull(fd_, &address, sizeof address);
  }
  // A by-reference write from a peer whose offer was not accepted fails the
  // path, and nothing is read into the region.
  void expectByReferenceRefused() {
    std::vector<uint8_t> source(64, 0xD4);
    sendByReference(0, source.size(), source.data(), 1);
    EXPECT_NE(std::string::npos, waitError().find("offer was not accepted"));
    expectUntouched();
  }
  void offer(const transport::tcp::same_host::Offer& o) {
    FrameHeader h = transport::tcp::offerFrame();
    net::writeFull(fd_, &h, sizeof h);
    net::writeFull(fd_, &o, sizeof o);
  }
  std::atomic<uint64_t>* alive_ = transport::tcp::same_host::newLivenessWord();
};

TEST_F(RawPeerSingleCopy, TheTransportOffersItselfWithAValidOffer) {
  ASSERT_EQ(0u, hello(0, 0));
  FrameHeader h;
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(readUntil(transport::tcp::FrameType::kOffer, &h, &bytes));
  ASSERT_EQ(sizeof(transport::tcp::same_host::Offer), bytes.size());
  transport::tcp::same_host::Offer o;
  std::memcpy(&o, bytes.data(), sizeof o);
  EXPECT_EQ(static_cast<uint64_t>(::getpid()), o.pid);
  EXPECT_EQ("", transport::tcp::same_host::verify(o));  // the cookie it names is really there
}

// After the offer is accepted, a by-reference write lands exactly where a
// payload on the socket would, and is ACKed; once the writer's connection
// is marked dead, its by-reference writes are dropped unread (their copies
// sent elsewhere may already have landed, and the buffer been reused).
TEST_F(RawPeerSingleCopy, ByReferenceWritesLandAfterAnAcceptedOfferAndNotOnceTheSenderIsGone) {
  ASSERT_EQ(0u, hello(0, 0));
  offer(transport::tcp::same_host::makeOffer(alive_));
  FrameHeader accept;
  ASSERT_TRUE(readUntil(transport::tcp::FrameType::kAccept, &accept));
  std::vector<uint8_t> first(50, 0xB7), second(50, 0xC3);
  sendByReference(100, first.size(), first.data(), 7);
  ASSERT_TRUE(sink_.waitFor([&](const auto& s) { return s.arrivals.size() == 1; }, 10));
  EXPECT_EQ(7u, sink_.now().arrivals[0].first);
  EXPECT_EQ(50u, sink_.now().arrivals[0].second);
  alive_->store(0);
  sendByReference(200, second.size(), second.data(), 8);
  FrameHeader ack{};
  while (ack.offset < 2) ASSERT_TRUE(readUntil(transport::tcp::FrameType::kAck, &ack)) << "both writes are ACKed";
  for (size_t i = 0; i < memory_.size(); ++i)
    ASSERT_EQ((i >= kGuard + 100 && i < kGuard + 150) ? 0xB7 : 0x5C, memory_[i]) << i;
  EXPECT_EQ(1u, sink_.now().arrivals.size()) << "the dropped write raised no arrival";
  EXPECT_TRUE(sink_.now().errors.empty());
}

// A by-reference write is checked against the region like any other: one
// that would overrun it fails the path and nothing is copied.
TEST_F(RawPeerSingleCopy, AByReferenceWritePastTheRegionIsRejected) {
  ASSERT_EQ(0u, hello(0, 0));
  offer(transport::tcp::same_host::makeOffer(alive_));
  FrameHeader accept;
  ASSERT_TRUE(readUntil(transport::tcp::FrameType::kAccept, &accept));
  std::vector<uint8_t> source(64, 0xD4);
  sendByReference(4090, source.size(), source.data(), 1);
  EXPECT_NE(std::string::npos, waitError().find("overruns"));
  expectUntouched();
}

// Without an accepted offer, a by-reference write fails the path: the
// receiver never reads a process it has not verified.
TEST_F(RawPeerSingleCopy, AByReferenceWriteWithoutAnAcceptedOfferFailsThePath) {
  ASSERT_EQ(0u, hello(0, 0));
  expectByReferenceRefused();
}

TEST_F(RawPeerSingleCopy, AnOfferWhoseCookieIsNotThereIsNotAccepted) {
  ASSERT_EQ(0u, hello(0, 0));
  transport::tcp::same_host::Offer o = transport::tcp::same_host::makeOffer(alive_);
  o.cookie[0] ^= 1;  // what another host's process at the same pid would show
  offer(o);
  expectByReferenceRefused();
}

TEST(SameHost, AnOfferFromAnotherNetworkNamespaceOrNoProcessIsRefused) {
  auto* alive = transport::tcp::same_host::newLivenessWord();
  transport::tcp::same_host::Offer o = transport::tcp::same_host::makeOffer(alive);
  EXPECT_EQ("", transport::tcp::same_host::verify(o));
  o.pid = 0;
  EXPECT_NE("", transport::tcp::same_host::verify(o));
  o.pid = 1u << 30;  // no such process
  EXPECT_NE(std::string::npos, transport::tcp::same_host::verify(o).find("cannot read"));
}

// Two transports in this process with single copy on: once a path's offer
// is accepted (its ACCEPT overtakes the ACK of any later write), every
// payload on it goes by reference -- the path counts those bytes -- and
// lands exactly, while with single copy off no path counts any.
class TcpSingleCopyPair : public TransportContract {
 protected:
  uint64_t referenceBytes() {
    uint64_t sum = 0;
    for (int i = 0; i < paths_; ++i) {
      auto c = t_[0]->pathCounters(1, i).counters;
      auto it = c.find("single_copy_bytes_sent");
      if (it != c.end()) sum += it->second;
    }
    return sum;
  }
  void roundOfWrites(size_t bytes) {
    std::vector<uint8_t> src(bytes), dst(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 17 + 3);
    Region local = t_[0]->registerMemory(src.data(), src.size());
    Region remote = t_[1]->registerMemory(dst.data(), dst.size());
    RemoteRegion rr = toRemote(remote);
    rr.key = t_[1]->expose(remote);
    size_t before = sinks_[0].now().completed.size();
    auto chunks = writeChunks(local, src.data(), rr, bytes, 64 * 1024, 0);
    ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.completed.size() == before + chunks.size(); }));
    EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), bytes));
    t_[1]->conceal(remote);
    t_[1]->deregisterMemory(remote);
    t_[0]->deregisterMemory(local);
  }
};

TEST_P(TcpSingleCopyPair, PayloadsGoByReferenceOnlyWhereSingleCopyIsOn) {
  const size_t bytes = 1 << 20;
  ASSERT_NO_FATAL_FAILURE(roundOfWrites(bytes));  // every path's offer is accepted by its end
  uint64_t before = referenceBytes();
  ASSERT_NO_FATAL_FAILURE(roundOfWrites(bytes));
  EXPECT_EQ(GetParam().single_copy ? bytes : 0u, referenceBytes() - before);
  EXPECT_TRUE(sinks_[0].now().errors.empty() && sinks_[1].now().errors.empty());
}

INSTANTIATE_TEST_SUITE_P(Tcp, TcpSingleCopyPair,
                         ::testing::Values(ContractParam{"tcp", {"127.0.0.1", "127.0.0.2"}},
                                           ContractParam{"tcp", {"127.0.0.1", "127.0.0.2"}, true}),
                         contractName);

}  // namespace testing
}  // namespace maestro
