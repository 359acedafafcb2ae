// Tests of the verbs transport on a real RDMA device. They need one: run
// them inside the Soft-RoCE VM (scripts/softroce/run.sh), which gives rxe0
// and four IP aliases in MAESTRO_VNICS. Without a device every test that
// needs one is skipped (and the harness is what counts them as passes).
//
// Two transports, ranks 0 and 1, run in this one process: rank 0 listens on
// all four aliases, rank 1 opens path i from alias i to rank 0's endpoint on
// alias i+1, so every QP has a distinct (source, destination) pair.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/factory.h"
#include "transport/nic_counters.h"
#include "transport/verbs/gid_table.h"
#include "transport/verbs/verbs_transport.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

using std::chrono::seconds;

constexpr int kPaths = 4;
constexpr size_t kChunk = 50 * 1024;  // the paper's ~50 KB chunk
constexpr int kInflight = 8;          // TransportOptions default, the paper's

std::vector<std::string> vnicsFromEnv() {
  std::vector<std::string> out;
  const char* env = std::getenv("MAESTRO_VNICS");
  if (env == nullptr) return out;
  std::stringstream in(env);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Deadline in(seconds s) { return Clock::now() + s; }

// Records every callback; tests wait on it with a timeout.
class RecordingSink : public CompletionSink {
 public:
  struct Completion {
    int path;
    uint64_t wr_id;
    bool ok;
    size_t seq;  // position among all callbacks of this sink
  };
  struct Arrival {
    int path;
    uint32_t imm;
    uint32_t length;
  };
  struct Message {
    int path;
    std::vector<uint8_t> bytes;
  };
  struct PathError {
    int peer;
    int path;
    std::string what;
    size_t seq;
  };

  void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    completions_.push_back({path, wr_id, ok, seq_++});
    if (ok) ++ok_per_path_[path];
    cv_.notify_all();
  }
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    arrivals_.push_back({path, imm, length});
    ++seq_;
    cv_.notify_all();
  }
  void onMessage(int peer, int path, const uint8_t* data, size_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back({path, std::vector<uint8_t>(data, data + length)});
    ++seq_;
    cv_.notify_all();
  }
  void onPathError(int peer, int path, const std::string& what) override {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back({peer, path, what, seq_++});
    cv_.notify_all();
  }

  void onPathUp(int peer, int path) override {
    std::lock_guard<std::mutex> lock(mu_);
    ups_.push_back({peer, path, "up", seq_++});
    cv_.notify_all();
  }

  // Waits until pred() (called under the lock) holds; false on timeout.
  template <typename Pred>
  bool waitFor(Pred pred, seconds timeout = seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(); });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  size_t seq_ = 0;
  std::vector<Completion> completions_;
  std::map<int, size_t> ok_per_path_;
  std::vector<Arrival> arrivals_;
  std::vector<Message> messages_;
  std::vector<PathError> errors_;
  std::vector<PathError> ups_;  // onPathUp, recorded like errors
};

TransportOptions optionsFor(int rank, RecordingSink* sink, uint8_t secret_byte = 0x42, bool busy_poll = false) {
  TransportOptions options;
  options.busy_poll = busy_poll;
  options.rank = rank;
  options.world_size = 2;
  options.secret.fill(secret_byte);
  options.sink = sink;
  options.max_inflight_per_path = kInflight;
  return options;
}

Hello helloFrom(int rank, int path, uint8_t secret_byte = 0x42) {
  Hello hello;
  std::memset(hello.secret, secret_byte, sizeof(hello.secret));
  hello.rank = rank;
  hello.path = path;
  return hello;
}

// What a peer needs to write into `region` of `t` now: the key of its
// current exposure (with memory windows the MR's own rkey opens nothing).
RemoteRegion exposed(Transport& t, const Region& region) {
  RemoteRegion r = toRemote(region);
  r.key = t.expose(region);
  return r;
}

// Page-aligned buffer, freed on scope exit.
struct Buffer {
  explicit Buffer(size_t n) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) != 0) throw std::bad_alloc();
    data = static_cast<uint8_t*>(p);
    std::memset(data, 0, n);
  }
  ~Buffer() { std::free(data); }
  uint8_t* data;
  size_t size;
};

class VerbsPairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vnics_ = vnicsFromEnv();
    if (vnics_.size() < kPaths) GTEST_SKIP() << "needs MAESTRO_VNICS with 4 addresses (run via scripts/softroce/run.sh)";
    vnics_.resize(kPaths);
    std::string why;
    if (!verbsUsableFor(vnics_, &why)) GTEST_SKIP() << "no usable RDMA device: " << why;

    t0_ = makeVerbsTransport(optionsFor(0, &s0_, 0x42, busyPoll()));
    t1_ = makeVerbsTransport(optionsFor(1, &s1_, 0x42, busyPoll()));
    for (int i = 0; i < kPaths; ++i) endpoints_.push_back(t0_->listen(vnics_[i]));
    t0_->expectPeers({endpoints_, rank1Endpoints()});
    for (int i = 0; i < kPaths; ++i) t1_->connect(specFor(i), helloFrom(1, i), in(seconds(20)));
    t0_->awaitAccepted(kPaths, in(seconds(20)));
  }

  // Rank 1 opens path i from vnics_[i] (what it would publish).
  std::vector<std::string> rank1Endpoints() const {
    std::vector<std::string> v;
    for (const auto& a : vnics_) v.push_back(a + ":1");
    return v;
  }
  // Path i of rank 1: from vnics_[i] to a listener of rank 0 on another alias.
  PathSpec specFor(int i) const {
    PathSpec spec;
    spec.peer = 0;
    spec.path = i;
    spec.local_addr = vnics_[i];
    spec.remote_endpoint = endpoints_[(i + 1) % kPaths];
    return spec;
  }

  void TearDown() override {
    // Bounded: a hang here is a failure of the whole binary (harness timeout).
    const auto start = Clock::now();
    if (t1_) t1_->shutdown();
    if (t0_) t0_->shutdown();
    EXPECT_LT(Clock::now() - start, seconds(10)) << "shutdown took too long";
  }

  virtual bool busyPoll() const { return false; }
  // Writes `bytes` back and forth `iterations` times (see the test below).
  void chunkedIterations(size_t bytes, uint32_t iterations);

  std::vector<std::string> vnics_;
  std::vector<std::string> endpoints_;
  RecordingSink s0_, s1_;
  std::unique_ptr<Transport> t0_, t1_;
};

// ---- QP <-> alias mapping ---------------------------------------------------

// The GID index a QP sends from (its address vector's sgid_index).
int sgidIndex(ibv_qp* qp, uint8_t* port) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &attr, IBV_QP_AV | IBV_QP_PORT, &init) != 0) return -1;
  *port = attr.port_num != 0 ? attr.port_num : 1;
  return attr.ah_attr.grh.sgid_index;
}

// Checks that `qp` sends from the RoCEv2 GID of `ip`: by index (looked up in
// sysfs by address) and by content (read back from the device).
void expectQpOnAlias(ibv_qp* qp, const std::string& ip, const std::string& what) {
  ASSERT_NE(qp, nullptr) << what;
  uint8_t port = 1;
  const int sgid = sgidIndex(qp, &port);
  GidEntry entry;
  ASSERT_TRUE(findRoceV2Gid(ip, &entry)) << ip;
  EXPECT_EQ(sgid, entry.index) << what << ": QP " << qp->qp_num << " does not use the RoCEv2 GID of " << ip;
  ibv_gid gid{};
  ASSERT_EQ(ibv_query_gid(qp->context, port, sgid, &gid), 0);
  uint8_t expected[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  ASSERT_EQ(inet_pton(AF_INET, ip.c_str(), expected + 12), 1);
  EXPECT_EQ(std::memcmp(gid.raw, expected, 16), 0) << what << ": GID " << sgid << " is not ::ffff:" << ip;
}

TEST_F(VerbsPairTest, EveryPathQpUsesTheGidOfItsOwnAlias) {
  std::vector<int> indexes;
  for (int i = 0; i < kPaths; ++i) {
    ibv_qp* active = verbsPathQp(*t1_, 0, i);
    ibv_qp* passive = verbsPathQp(*t0_, 1, i);
    expectQpOnAlias(active, vnics_[i], "rank 1 path " + std::to_string(i));
    expectQpOnAlias(passive, vnics_[(i + 1) % kPaths], "rank 0 path " + std::to_string(i));
    uint8_t port;
    indexes.push_back(sgidIndex(active, &port));
    const std::string description = t1_->describePath(0, i);
    EXPECT_EQ(description.rfind(vnics_[i] + " -> " + endpoints_[(i + 1) % kPaths], 0), 0u) << description;
    EXPECT_NE(description.find("gid_idx " + std::to_string(indexes.back())), std::string::npos) << description;
  }
  std::sort(indexes.begin(), indexes.end());
  EXPECT_EQ(std::unique(indexes.begin(), indexes.end()), indexes.end()) << "two paths share a GID";
  EXPECT_EQ(verbsPathQp(*t1_, 0, kPaths), nullptr);
}

// ---- chunked multi-path writes ---------------------------------------------------

// Writes `bytes` from src (registered on `from`) into dst (registered on
// `to`) as kChunk chunks, chunk c on path c % 4, at most kInflight
// outstanding per path, imm = tag | c. Returns false on timeout.
bool chunkedWrite(Transport& from, int to_rank, RecordingSink& from_sink, const Region& src, const RemoteRegion& dst,
                  size_t bytes, uint32_t tag, uint64_t wr_base) {
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  std::vector<size_t> next(kPaths), posted(kPaths);
  for (int p = 0; p < kPaths; ++p) next[p] = p;
  std::map<int, size_t> done_before;
  {
    std::lock_guard<std::mutex> lock(from_sink.mu_);
    done_before = from_sink.ok_per_path_;
  }
  size_t total_posted = 0;
  for (;;) {
    std::map<int, size_t> done;
    {
      std::lock_guard<std::mutex> lock(from_sink.mu_);
      done = from_sink.ok_per_path_;
    }
    size_t total_done = 0;
    for (int p = 0; p < kPaths; ++p) {
      const size_t completed = done[p] - done_before[p];
      total_done += completed;
      while (next[p] < chunks && posted[p] - completed < static_cast<size_t>(kInflight)) {
        const size_t c = next[p];
        const size_t offset = c * kChunk;
        WriteRequest req;
        req.local = src;
        req.src = static_cast<uint8_t*>(src.addr) + offset;
        req.length = std::min(kChunk, bytes - offset);
        req.remote = dst;
        req.remote_offset = offset;
        req.with_imm = true;
        req.imm = tag | static_cast<uint32_t>(c);
        req.wr_id = wr_base + c;
        from.postWrite(to_rank, p, req);
        ++posted[p];
        ++total_posted;
        next[p] += kPaths;
      }
    }
    if (total_done == chunks) return true;
    const bool progressed = from_sink.waitFor(
        [&] {
          size_t n = 0;
          for (int p = 0; p < kPaths; ++p) n += from_sink.ok_per_path_[p] - done_before[p];
          return n > total_done || !from_sink.errors_.empty();
        },
        seconds(30));
    if (!progressed) return false;
    std::lock_guard<std::mutex> lock(from_sink.mu_);
    if (!from_sink.errors_.empty()) return false;
  }
}

void VerbsPairTest::chunkedIterations(size_t kBytes, uint32_t iterations) {
  const size_t chunks = (kBytes + kChunk - 1) / kChunk;
  Buffer a_src(kBytes), a_dst(kBytes), b_src(kBytes), b_dst(kBytes);
  // Registered once, reused by every iteration (what the registration cache
  // above the transport relies on).
  const Region r1_src = t1_->registerMemory(a_src.data, kBytes);
  const Region r0_dst = t0_->registerMemory(a_dst.data, kBytes);
  const Region r0_src = t0_->registerMemory(b_src.data, kBytes);
  const Region r1_dst = t1_->registerMemory(b_dst.data, kBytes);

  for (uint32_t iter = 0; iter < iterations; ++iter) {
    // Even iterations: rank 1 (connecting side) writes to rank 0; odd ones the
    // other way, over the same QPs.
    const bool forward = iter % 2 == 0;
    Transport& from = forward ? *t1_ : *t0_;
    RecordingSink& from_sink = forward ? s1_ : s0_;
    RecordingSink& to_sink = forward ? s0_ : s1_;
    Buffer& src = forward ? a_src : b_src;
    Buffer& dst = forward ? a_dst : b_dst;
    for (size_t i = 0; i < kBytes; ++i) src.data[i] = static_cast<uint8_t>((i * 131 + iter * 7 + (i >> 12)) & 0xff);
    std::memset(dst.data, 0, kBytes);
    size_t arrivals_before;
    {
      std::lock_guard<std::mutex> lock(to_sink.mu_);
      arrivals_before = to_sink.arrivals_.size();
    }
    const uint32_t tag = iter << 24;
    const auto start = Clock::now();
    // Each iteration is one exposure of the destination, as an operation is.
    Transport& to = forward ? *t0_ : *t1_;
    const Region& dst_region = forward ? r0_dst : r1_dst;
    ASSERT_TRUE(chunkedWrite(from, forward ? 0 : 1, from_sink, forward ? r1_src : r0_src, exposed(to, dst_region),
                             kBytes, tag, uint64_t{iter} << 32))
        << "iteration " << iter << " did not complete (timeout or path error)";
    ASSERT_TRUE(to_sink.waitFor([&] { return to_sink.arrivals_.size() - arrivals_before >= chunks; }))
        << "only " << to_sink.arrivals_.size() - arrivals_before << " of " << chunks << " immediates arrived";
    to.conceal(dst_region);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("[ info     ] iteration %u: %zu chunks, %.1f MB/s%s\n", iter, chunks, kBytes / secs / 1e6,
                busyPoll() ? " (busy poll)" : "");

    std::vector<int> seen(chunks, 0);
    {
      std::lock_guard<std::mutex> lock(to_sink.mu_);
      for (size_t k = arrivals_before; k < to_sink.arrivals_.size(); ++k) {
        const auto& a = to_sink.arrivals_[k];
        ASSERT_EQ(a.imm & 0xff000000u, tag) << "immediate from another iteration";
        const uint32_t c = a.imm & 0x00ffffffu;
        ASSERT_LT(c, chunks);
        ++seen[c];
        EXPECT_EQ(a.path, static_cast<int>(c % kPaths)) << "chunk " << c;
        EXPECT_EQ(a.length, std::min(kChunk, kBytes - c * kChunk)) << "chunk " << c;
      }
    }
    for (size_t c = 0; c < chunks; ++c) EXPECT_EQ(seen[c], 1) << "immediate of chunk " << c << " delivered " << seen[c] << " times";
    ASSERT_EQ(std::memcmp(src.data, dst.data, kBytes), 0) << "payload differs";
  }
  {
    // Every write completed exactly once, successfully; no path failed.
    std::lock_guard<std::mutex> lock1(s1_.mu_);
    std::lock_guard<std::mutex> lock0(s0_.mu_);
    std::map<uint64_t, int> count;
    for (const auto& c : s1_.completions_) count[c.wr_id] += c.ok ? 1 : 100;
    for (const auto& c : s0_.completions_) count[c.wr_id] += c.ok ? 1 : 100;
    EXPECT_EQ(count.size(), iterations * chunks);
    for (const auto& entry : count) EXPECT_EQ(entry.second, 1) << "wr_id " << entry.first;
    EXPECT_TRUE(s0_.errors_.empty() && s1_.errors_.empty());
  }
  t1_->deregisterMemory(r1_src);
  t0_->deregisterMemory(r0_dst);
  t0_->deregisterMemory(r0_src);
  t1_->deregisterMemory(r1_dst);
}

TEST_F(VerbsPairTest, ChunkedWritesSpreadOverFourPathsLandByteForByte) { chunkedIterations(8 << 20, 4); }

// The same with the progress threads spinning on the CQ instead of sleeping
// on the completion channel.
class VerbsBusyPollTest : public VerbsPairTest {
 protected:
  bool busyPoll() const override { return true; }
};

TEST_F(VerbsBusyPollTest, ChunkedWritesLandByteForByte) { chunkedIterations(2 << 20, 2); }

// ---- control messages ---------------------------------------------------------------

TEST_F(VerbsPairTest, ControlMessagesArriveInOrderOnEveryPath) {
  // More messages per path than the send queue has control slots, so some
  // wait in the backlog; sizes up to kMaxControlBytes.
  constexpr int kPerPath = 40;
  const size_t sizes[] = {1, 100, 4000, kMaxControlBytes};
  auto payload = [&](int from, int path, int seq) {
    std::vector<uint8_t> bytes(sizes[seq % 4]);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(from * 97 + path * 31 + seq * 7 + i);
    bytes[0] = static_cast<uint8_t>(seq);
    return bytes;
  };
  for (int seq = 0; seq < kPerPath; ++seq) {
    for (int p = 0; p < kPaths; ++p) {
      const auto m1 = payload(1, p, seq);
      t1_->postSend(0, p, m1.data(), m1.size());
      const auto m0 = payload(0, p, seq);
      t0_->postSend(1, p, m0.data(), m0.size());
    }
  }
  for (auto [sink, from] : {std::make_pair(&s0_, 1), std::make_pair(&s1_, 0)}) {
    ASSERT_TRUE(sink->waitFor([&, sink = sink] { return sink->messages_.size() >= kPaths * kPerPath; }))
        << "rank " << from << "'s messages: " << sink->messages_.size() << " of " << kPaths * kPerPath;
    std::lock_guard<std::mutex> lock(sink->mu_);
    std::vector<int> next(kPaths, 0);
    for (const auto& m : sink->messages_) {
      const int seq = next[m.path]++;
      EXPECT_EQ(m.bytes, payload(from, m.path, seq)) << "path " << m.path << " message " << seq;
    }
    EXPECT_TRUE(sink->errors_.empty());
  }
  EXPECT_THROW(t1_->postSend(0, 0, "x", kMaxControlBytes + 1), Error);
}

// ---- failures ---------------------------------------------------------------------------

TEST_F(VerbsPairTest, WrongRkeyFailsOnlyThatPathWithClearErrorAndFlushes) {
  constexpr size_t kBytes = 1 << 20;
  Buffer src(kBytes), dst(kBytes);
  const Region local = t1_->registerMemory(src.data, kBytes);
  const Region remote = t0_->registerMemory(dst.data, kBytes);
  RemoteRegion bad = exposed(*t0_, remote);
  bad.key ^= 0x00a5a500u;  // a key the peer's NIC never issued
  constexpr int kBadPath = 2;
  // The bad write first, then good writes queued behind it on the same path:
  // each must complete exactly once, the bad one with ok=false.
  for (int i = 0; i < 6; ++i) {
    WriteRequest req;
    req.local = local;
    req.src = src.data + i * kChunk;
    req.length = kChunk;
    req.remote = i == 0 ? bad : exposed(*t0_, remote);
    req.remote_offset = i * kChunk;
    req.with_imm = true;
    req.imm = i;
    req.wr_id = 100 + i;
    t1_->postWrite(0, kBadPath, req);
  }
  ASSERT_TRUE(s1_.waitFor([&] { return s1_.completions_.size() >= 6 && !s1_.errors_.empty(); }, seconds(30)))
      << "no error completion: " << s1_.completions_.size() << " completions, " << s1_.errors_.size() << " errors";
  {
    std::lock_guard<std::mutex> lock(s1_.mu_);
    ASSERT_EQ(s1_.errors_.size(), 1u);
    const auto& error = s1_.errors_[0];
    EXPECT_EQ(error.peer, 0);
    EXPECT_EQ(error.path, kBadPath);
    EXPECT_NE(error.what.find(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)), std::string::npos) << error.what;
    EXPECT_NE(error.what.find("rkey"), std::string::npos) << error.what;
    std::map<uint64_t, int> seen;
    for (const auto& c : s1_.completions_) {
      ++seen[c.wr_id];
      EXPECT_EQ(c.path, kBadPath);
      if (c.wr_id == 100) {
        EXPECT_FALSE(c.ok) << "the bad write reported success";
      }
      if (!c.ok) {
        EXPECT_GT(c.seq, error.seq) << "a failed write was reported before onPathError";
      }
    }
    EXPECT_EQ(seen.size(), 6u);
    for (const auto& entry : seen) EXPECT_EQ(entry.second, 1) << "wr_id " << entry.first;
  }
  std::printf("[ info     ] path error: %s\n", s1_.errors_[0].what.c_str());

  // The other paths still work.
  WriteRequest good;
  good.local = local;
  good.src = src.data;
  good.length = 4096;
  good.remote = exposed(*t0_, remote);
  good.with_imm = true;
  good.imm = 0xabcd;
  good.wr_id = 555;
  t1_->postWrite(0, 0, good);
  ASSERT_TRUE(s0_.waitFor([&] {
    for (const auto& a : s0_.arrivals_) if (a.imm == 0xabcd && a.path == 0) return true;
    return false;
  }));
  // A write posted on the dead path completes with ok=false, asynchronously.
  good.wr_id = 556;
  t1_->postWrite(0, kBadPath, good);
  ASSERT_TRUE(s1_.waitFor([&] {
    for (const auto& c : s1_.completions_) if (c.wr_id == 556) return !c.ok;
    return false;
  }, seconds(10)));
  // The peer learns about it too (its QP failed / it got a DISCONNECTED).
  ASSERT_TRUE(s0_.waitFor([&] { return !s0_.errors_.empty(); }, seconds(15))) << "peer never saw the path fail";
  {
    std::lock_guard<std::mutex> lock(s0_.mu_);
    EXPECT_EQ(s0_.errors_[0].path, kBadPath);
    EXPECT_EQ(s0_.errors_[0].peer, 1);
    std::printf("[ info     ] peer's path error: %s\n", s0_.errors_[0].what.c_str());
  }
  {
    std::lock_guard<std::mutex> lock(s1_.mu_);
    EXPECT_EQ(s1_.errors_.size(), 1u) << "onPathError raised more than once";
  }
}

// With memory windows, registering a region grants no remote access: the
// MR's own rkey is refused by the NIC, and only an exposure's key opens it.
TEST_F(VerbsPairTest, ARegistrationsOwnRkeyOpensNothing) {
  constexpr size_t kBytes = 64 << 10;
  Buffer src(kBytes), dst(kBytes);
  std::memset(src.data, 0x5c, kBytes);
  const Region local = t1_->registerMemory(src.data, kBytes);
  const Region remote = t0_->registerMemory(dst.data, kBytes);
  WriteRequest req;
  req.local = local;
  req.src = src.data;
  req.length = kBytes;
  req.remote = toRemote(remote);  // never exposed: the MR's rkey
  req.wr_id = 700;
  t1_->postWrite(0, 1, req);
  ASSERT_TRUE(s1_.waitFor([&] {
    for (const auto& c : s1_.completions_) if (c.wr_id == 700) return true;
    return false;
  }, seconds(30)));
  {
    std::lock_guard<std::mutex> lock(s1_.mu_);
    for (const auto& c : s1_.completions_)
      if (c.wr_id == 700) EXPECT_FALSE(c.ok) << "the MR's own rkey opened the region: no memory windows?";
  }
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(dst.data[i], 0) << "byte " << i << " was written";
  req.remote = exposed(*t0_, remote);
  EXPECT_NE(req.remote.key, remote.key) << "the exposure's key is the MR's";
  req.wr_id = 701;
  t1_->postWrite(0, 0, req);
  ASSERT_TRUE(s1_.waitFor([&] {
    for (const auto& c : s1_.completions_) if (c.wr_id == 701) return c.ok;
    return false;
  }, seconds(30))) << "the exposure's key did not open the region";
  EXPECT_EQ(std::memcmp(src.data, dst.data, kBytes), 0);
  t0_->conceal(remote);
}

// Every exposure of a region has a key the one before it did not have, and
// nesting exposures share one. Prints what an expose()/conceal() pair costs
// (two memory-window binds), which every operation pays per region.
TEST_F(VerbsPairTest, EachExposureHasANewKey) {
  constexpr size_t kBytes = 1 << 20;
  Buffer dst(kBytes);
  const Region region = t0_->registerMemory(dst.data, kBytes);
  constexpr int kRounds = 1000;
  uint64_t previous = t0_->expose(region);
  EXPECT_EQ(previous, t0_->expose(region)) << "a nested exposure changed the key";
  t0_->conceal(region);
  t0_->conceal(region);
  const auto start = Clock::now();
  for (int i = 0; i < kRounds; ++i) {
    const uint64_t key = t0_->expose(region);
    t0_->conceal(region);
    ASSERT_NE(previous, key) << "exposure " << i << " reused the key of the one before";
    previous = key;
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kRounds;
  std::printf("[ info     ] expose + conceal: %.1f us per pair\n", us);
  t0_->deregisterMemory(region);
}

TEST_F(VerbsPairTest, ClosePathRaisesOnceAndFlushesLaterWrites) {
  constexpr size_t kBytes = 256 << 10;
  Buffer src(kBytes), dst(kBytes);
  const Region local = t1_->registerMemory(src.data, kBytes);
  const Region remote = t0_->registerMemory(dst.data, kBytes);
  t1_->closePath(0, 3, "monitor: path 3 looks blackholed");
  t1_->closePath(0, 3, "second close is a no-op");
  WriteRequest req;
  req.local = local;
  req.src = src.data;
  req.length = kBytes;
  req.remote = exposed(*t0_, remote);
  req.wr_id = 77;
  t1_->postWrite(0, 3, req);
  ASSERT_TRUE(s1_.waitFor([&] { return !s1_.errors_.empty() && !s1_.completions_.empty(); }, seconds(10)));
  {
    std::lock_guard<std::mutex> lock(s1_.mu_);
    ASSERT_EQ(s1_.errors_.size(), 1u);
    EXPECT_EQ(s1_.errors_[0].path, 3);
    EXPECT_NE(s1_.errors_[0].what.find("blackholed"), std::string::npos) << s1_.errors_[0].what;
    ASSERT_EQ(s1_.completions_.size(), 1u);
    EXPECT_EQ(s1_.completions_[0].wr_id, 77u);
    EXPECT_FALSE(s1_.completions_[0].ok);
    EXPECT_GT(s1_.completions_[0].seq, s1_.errors_[0].seq);
  }
  ASSERT_TRUE(s0_.waitFor([&] { return !s0_.errors_.empty(); }, seconds(15))) << "peer never saw the close";
  std::lock_guard<std::mutex> lock(s0_.mu_);
  EXPECT_EQ(s0_.errors_[0].path, 3);
}

// A path that failed comes back with reconnect() from the side that opened
// it: a new QP from the same alias to the same endpoint; both sides hear
// onPathUp after the old connection's onPathError, and writes flow again.
TEST_F(VerbsPairTest, ReconnectBringsAFailedPathBack) {
  constexpr int kPath = 1;
  ibv_qp* old_qp = verbsPathQp(*t1_, 0, kPath);
  const uint32_t old_qpn = old_qp->qp_num;
  // Start-up raises one onPathUp per path, on the accepting side from the
  // progress thread, possibly after the fixture returned: let all of them
  // arrive, then count from here.
  ASSERT_TRUE(s0_.waitFor([&] { return s0_.ups_.size() >= static_cast<size_t>(kPaths); }, seconds(10)));
  ASSERT_TRUE(s1_.waitFor([&] { return s1_.ups_.size() >= static_cast<size_t>(kPaths); }, seconds(10)));
  size_t ups_before[2];
  {
    std::lock_guard<std::mutex> l0(s0_.mu_), l1(s1_.mu_);
    ups_before[0] = s0_.ups_.size();
    ups_before[1] = s1_.ups_.size();
  }
  t1_->closePath(0, kPath, "test takes path 1 down");
  ASSERT_TRUE(s1_.waitFor([&] { return !s1_.errors_.empty(); }, seconds(10)));
  ASSERT_TRUE(s0_.waitFor([&] { return !s0_.errors_.empty(); }, seconds(15))) << "the peer never saw the close";
  EXPECT_THROW(t0_->reconnect(1, kPath, in(seconds(5))), Error) << "rank 0 did not open that path";

  ASSERT_TRUE(t1_->reconnect(0, kPath, in(seconds(20))));
  ASSERT_TRUE(s1_.waitFor([&] { return s1_.ups_.size() > ups_before[1]; }, seconds(10)))
      << "no onPathUp on the reconnecting side";
  ASSERT_TRUE(s0_.waitFor([&] { return s0_.ups_.size() > ups_before[0]; }, seconds(10)))
      << "no onPathUp on the accepting side";
  int side = 0;
  for (RecordingSink* sink : {&s0_, &s1_}) {
    std::lock_guard<std::mutex> lock(sink->mu_);
    ASSERT_EQ(sink->ups_.size(), ups_before[side] + 1);
    const auto& up = sink->ups_.back();
    EXPECT_EQ(up.path, kPath);
    EXPECT_EQ(sink->errors_.size(), 1u);
    EXPECT_GT(up.seq, sink->errors_[0].seq) << "onPathUp before the old connection's onPathError";
    ++side;
  }
  ibv_qp* new_qp = verbsPathQp(*t1_, 0, kPath);
  ASSERT_NE(new_qp, nullptr);
  EXPECT_NE(new_qp->qp_num, old_qpn);
  expectQpOnAlias(new_qp, vnics_[kPath], "reconnected path");

  constexpr size_t kBytes = 256 << 10;
  Buffer src(kBytes), dst(kBytes);
  for (size_t i = 0; i < kBytes; ++i) src.data[i] = static_cast<uint8_t>(i * 29);
  const Region local = t1_->registerMemory(src.data, kBytes);
  const Region remote = t0_->registerMemory(dst.data, kBytes);
  WriteRequest req;
  req.local = local;
  req.src = src.data;
  req.length = kBytes;
  req.remote = exposed(*t0_, remote);
  req.with_imm = true;
  req.imm = 0xbeef;
  req.wr_id = 9;
  t1_->postWrite(0, kPath, req);
  ASSERT_TRUE(s0_.waitFor([&] { return !s0_.arrivals_.empty(); }, seconds(20)));
  EXPECT_EQ(s0_.arrivals_[0].imm, 0xbeefu);
  EXPECT_EQ(std::memcmp(src.data, dst.data, kBytes), 0);
  const std::string reply = "pong";
  t0_->postSend(1, kPath, reply.data(), reply.size());  // the accepting side uses the new QP too
  ASSERT_TRUE(s1_.waitFor([&] { return !s1_.messages_.empty(); }, seconds(20)));
}

// Soft-RoCE publishes retransmission and sequence-error counters (no
// CNP/ECN ones: it has no DCQCN); the transport reports them for its paths.
TEST_F(VerbsPairTest, NicCountersOfTheDeviceAreReported) {
  for (int i = 0; i < kPaths; ++i) {
    auto c = readNicCounters(t1_->pathCounters(0, i).nic_port);
    EXPECT_EQ(1u, c.count("rcvd_seq_err")) << "path " << i << ": " << c.size() << " counters";
    EXPECT_EQ(1u, c.count("completer_retry_err")) << "path " << i;
  }
}

// RoCEv2 takes its UDP source port from the NIC, and what the adapter sent
// lands: no route control, no fences -- and the transport says so, as its
// kind does before one exists.
TEST_F(VerbsPairTest, OffersNeitherRouteControlNorFences) {
  for (Transport* t : {t0_.get(), t1_.get()}) {
    EXPECT_EQ(nullptr, t->routeControl());
    EXPECT_EQ(nullptr, t->fencing());
    EXPECT_TRUE(t->capabilities() == capabilities("verbs"));
    EXPECT_FALSE(t->capabilities().route_control || t->capabilities().fencing);
    EXPECT_FALSE(t->delivery(0, 0).known);
  }
}

TEST_F(VerbsPairTest, ShutdownWithWritesInFlightDoesNotHang) {
  constexpr size_t kBytes = 4 << 20;
  Buffer src(kBytes), dst(kBytes);
  const Region local = t1_->registerMemory(src.data, kBytes);
  const Region remote = t0_->registerMemory(dst.data, kBytes);
  for (int i = 0; i < kPaths * kInflight; ++i) {
    WriteRequest req;
    req.local = local;
    req.src = src.data + (i % 32) * (kBytes / 32);
    req.length = kBytes / 32;
    req.remote = exposed(*t0_, remote);
    req.remote_offset = (i % 32) * (kBytes / 32);
    req.with_imm = true;
    req.wr_id = i;
    t1_->postWrite(0, i % kPaths, req);
  }
  // TearDown shuts both down at once and bounds the time it takes; the
  // regions are released by shutdown itself.
}

// A peer address that vanishes (the alias the passive side of path 2
// listens on is removed, so its ACKs no longer come back) fails that path
// with RETRY_EXC_ERR once the RC retries are spent (~0.5 s at ACK timeout
// 14, retry count 6): one path error, the write flushed, and the paths that
// do not touch that address keep working. Changes the VM's addresses, so it
// runs only inside the harness (as root).
TEST_F(VerbsPairTest, VanishedPeerAddressFailsOnlyItsPath) {
  const std::string nic = std::getenv("MAESTRO_SOFTROCE_NIC") ? std::getenv("MAESTRO_SOFTROCE_NIC") : "";
  if (nic.empty() || geteuid() != 0) GTEST_SKIP() << "only inside the Soft-RoCE VM (changes its addresses)";
  constexpr size_t kBytes = 256 << 10;
  Buffer src(kBytes), dst(kBytes);
  const Region local = t1_->registerMemory(src.data, kBytes);
  const Region remote = t0_->registerMemory(dst.data, kBytes);
  // vnics_[3]: the remote end of path 2 (and the local end of path 3). Not
  // vnics_[0]: deleting a subnet's primary address takes the secondaries along.
  const std::string gone = vnics_[3];
  ASSERT_EQ(std::system(("ip addr del " + gone + "/24 dev " + nic).c_str()), 0);
  struct Restore {  // whatever happens, the next test gets its alias and GID back
    std::string ip, nic;
    ~Restore() {
      (void)!std::system(("ip addr add " + ip + "/24 dev " + nic + " 2>/dev/null").c_str());
      GidEntry entry;
      for (int i = 0; i < 100 && !findRoceV2Gid(ip, &entry); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } restore{gone, nic};

  WriteRequest req;
  req.local = local;
  req.src = src.data;
  req.length = kBytes;
  req.remote = exposed(*t0_, remote);
  req.with_imm = true;
  req.wr_id = 31;
  const auto start = Clock::now();
  t1_->postWrite(0, 2, req);
  ASSERT_TRUE(s1_.waitFor([&] { return !s1_.errors_.empty() && !s1_.completions_.empty(); }, seconds(30)))
      << "the write to a vanished address never failed";
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(s1_.mu_);
    EXPECT_EQ(s1_.errors_.size(), 1u);
    EXPECT_EQ(s1_.errors_[0].path, 2);
    EXPECT_NE(s1_.errors_[0].what.find("RDMA write on path 2"), std::string::npos) << s1_.errors_[0].what;
    EXPECT_NE(s1_.errors_[0].what.find(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR)), std::string::npos)
        << s1_.errors_[0].what;
    EXPECT_EQ(s1_.completions_[0].wr_id, 31u);
    EXPECT_FALSE(s1_.completions_[0].ok);
    std::printf("[ info     ] failed after %.2f s: %s\n", secs, s1_.errors_[0].what.c_str());
  }
  // Path 0 (vnics 0 -> 1) is untouched.
  req.wr_id = 32;
  req.imm = 0x1111;
  t1_->postWrite(0, 0, req);
  ASSERT_TRUE(s1_.waitFor([&] {
    for (const auto& c : s1_.completions_) if (c.wr_id == 32) return c.ok;
    return false;
  }, seconds(30)));
}

// Registering beyond RLIMIT_MEMLOCK fails with a message that names the
// limit and how to raise it. Root ignores the limit while it holds
// CAP_IPC_LOCK, so a child drops that capability (from its bounding set too,
// so it stays dropped across exec), lowers the limit and re-executes this
// binary to run VerbsMemlockChild alone. Re-executing, not just forking: a
// forked child would share the parent's already opened verbs contexts,
// which libibverbs does not support and which can corrupt the parent.
TEST(VerbsMemlock, RegistrationBeyondTheLimitSaysHowToRaiseIt) {
  if (rdmaDeviceNames().empty()) GTEST_SKIP() << "no RDMA device";
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop CAP_IPC_LOCK deterministically";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2] = {};
    rlimit limit{64 << 10, 64 << 10};
    if (prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0 || syscall(SYS_capget, &header, caps) != 0) _exit(90);
    caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    caps[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    caps[CAP_IPC_LOCK / 32].inheritable &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &header, caps) != 0 || setrlimit(RLIMIT_MEMLOCK, &limit) != 0) _exit(91);
    setenv("MAESTRO_VERBS_MEMLOCK_CHILD", "1", 1);
    char filter[] = "--gtest_filter=DISABLED_VerbsMemlockChild.*";
    char also_disabled[] = "--gtest_also_run_disabled_tests";
    char self[] = "/proc/self/exe";
    char* argv[] = {self, filter, also_disabled, nullptr};
    execv(self, argv);
    _exit(92);
  }
  close(fds[1]);
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) output.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status << ":\n" << output;
  const size_t at = output.find("memlock message: ");
  ASSERT_NE(at, std::string::npos) << output;
  const std::string message = output.substr(at, output.find('\n', at) - at);
  EXPECT_NE(message.find("RLIMIT_MEMLOCK, now 64 KiB"), std::string::npos) << message;
  EXPECT_NE(message.find("ulimit -l unlimited"), std::string::npos) << message;
  EXPECT_NE(message.find("LimitMEMLOCK"), std::string::npos) << message;
  std::printf("[ info     ] %s\n", message.c_str());
}

// The child half of the test above. DISABLED_: it runs only when the test
// above re-executes the binary for it (it needs the lowered limit).
TEST(DISABLED_VerbsMemlockChild, RegisterUnderLowLimit) {
  ASSERT_NE(std::getenv("MAESTRO_VERBS_MEMLOCK_CHILD"), nullptr) << "runs only as VerbsMemlock's child";
  RecordingSink sink;
  auto t = makeVerbsTransport(optionsFor(0, &sink));
  std::vector<uint8_t> big(8 << 20, 1);
  try {
    t->registerMemory(big.data(), big.size());
    FAIL() << "registered 8 MiB under a 64 KiB memlock limit";
  } catch (const Error& e) {
    std::printf("memlock message: %s\n", e.what());
  }
}

// ---- connection setup ----------------------------------------------------------------

TEST_F(VerbsPairTest, HelloWithWrongSecretOrRankIsRejected) {
  RecordingSink sink;
  auto intruder = makeVerbsTransport(optionsFor(1, &sink, 0x13));
  PathSpec spec;
  spec.peer = 0;
  spec.path = 0;
  spec.local_addr = vnics_[0];
  spec.remote_endpoint = endpoints_[1];
  const auto start = Clock::now();
  try {
    intruder->connect(spec, helloFrom(1, 0, 0x13), in(seconds(10)));
    FAIL() << "a wrong secret was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wrong secret"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, seconds(5)) << "a rejection must not wait for the deadline";
  try {
    intruder->connect(spec, helloFrom(7, 0), in(seconds(10)));  // right secret, rank outside the world
    FAIL() << "rank 7 was accepted in a world of 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 7"), std::string::npos) << e.what();
  }
  try {
    t0_->awaitAccepted(kPaths + 1, in(seconds(1)));
    FAIL() << "a rejected connection was counted as accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 of 5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wrong secret"), std::string::npos) << e.what();
  }
  intruder->shutdown();
}

// The secret is not enough: a path is accepted only from the address its
// rank published for it, so a process that learned the secret cannot open
// (or take over) rank 1's path 0 from another address.
TEST_F(VerbsPairTest, HelloFromAnAddressItsRankDidNotPublishIsRejected) {
  RecordingSink sink;
  auto intruder = makeVerbsTransport(optionsFor(1, &sink));
  PathSpec spec = specFor(0);
  spec.local_addr = vnics_[2];  // rank 1 opens path 0 from vnics_[0]
  const auto start = Clock::now();
  try {
    intruder->connect(spec, helloFrom(1, 0), in(seconds(10)));
    FAIL() << "path 0 of rank 1 was accepted from " << vnics_[2];
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("opens from " + vnics_[0]), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, seconds(5)) << "a rejection must not wait for the deadline";
  intruder->shutdown();
  // The real path 0 was not replaced: it still carries messages.
  t1_->postSend(0, 0, "still here", 10);
  EXPECT_TRUE(s0_.waitFor(
      [&] {
        for (const auto& m : s0_.messages_)
          if (std::string(m.bytes.begin(), m.bytes.end()) == "still here") return true;
        return false;
      },
      seconds(10)));
}

// A request that arrives before the listener knows where its peers' paths
// come from (the peer read the endpoints first) waits, then is accepted.
TEST_F(VerbsPairTest, ARequestBeforeExpectPeersWaitsForIt) {
  RecordingSink sa, sb;
  auto a = makeVerbsTransport(optionsFor(0, &sa));
  auto b = makeVerbsTransport(optionsFor(1, &sb));
  const std::string endpoint = a->listen(vnics_[1]);
  PathSpec spec = specFor(0);
  spec.remote_endpoint = endpoint;
  std::thread opener([&] { b->connect(spec, helloFrom(1, 0), in(seconds(20))); });
  EXPECT_THROW(a->awaitAccepted(1, in(seconds(1))), Error) << "accepted before expectPeers";
  a->expectPeers({{endpoint}, rank1Endpoints()});
  EXPECT_NO_THROW(a->awaitAccepted(1, in(seconds(10))));
  opener.join();
  b->shutdown();
  a->shutdown();
}

TEST_F(VerbsPairTest, ConnectToNobodyEndsAtTheDeadline) {
  PathSpec spec;
  spec.peer = 0;
  spec.path = 5;
  spec.local_addr = vnics_[0];
  spec.remote_endpoint = vnics_[1] + ":1";  // nothing listens on port 1
  const auto start = Clock::now();
  try {
    t1_->connect(spec, helloFrom(1, 5), in(seconds(2)));
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadline"), std::string::npos) << e.what();
    std::printf("[ info     ] %s\n", e.what());
  }
  EXPECT_LT(Clock::now() - start, seconds(5));
}

// Runs with or without a device.
TEST(VerbsUsable, ExplainsWhyNot) {
  std::string why;
  EXPECT_FALSE(verbsUsableFor({"192.168.50.99"}, &why));
  EXPECT_FALSE(why.empty());
  const bool has_device = !rdmaDeviceNames().empty();
  if (has_device) {
    EXPECT_NE(why.find("192.168.50.99"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("no RDMA device"), std::string::npos) << why;
  }
  EXPECT_FALSE(verbsUsableFor({}, &why));
  const std::vector<std::string> vnics = vnicsFromEnv();
  if (has_device && !vnics.empty()) {
    EXPECT_TRUE(verbsUsableFor(vnics, &why)) << why;
  }
}

}  // namespace
}  // namespace verbs
}  // namespace transport
}  // namespace maestro
