// The transport contract, as tests every transport must pass (tcp here,
// verbs inside the Soft-RoCE VM): instantiate TransportContract with a
// ContractParam naming the transport and the vNIC addresses to use.
#pragma once

#include "common/error.h"
#include "common/net.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "multipath/decomposer.h"
#include "recording_sink.h"
#include "test_util.h"
#include "transport/factory.h"

namespace maestro {
namespace testing {

struct ContractParam {
  std::string kind;                 // "tcp" | "verbs"
  std::vector<std::string> vnics;   // local addresses; path i uses vnics[i]
  bool single_copy = false;         // tcp: payloads by cross-memory attach (both ranks are this process)
};

inline std::string contractName(const ::testing::TestParamInfo<ContractParam>& info) {
  return info.param.kind + (info.param.single_copy ? "SingleCopy" : "");
}

// Two transports (ranks 0 and 1) in one process, `paths` paths between them,
// path i from rank 0's vnics[i] to rank 1's vnics[i].
class TransportContract : public ::testing::TestWithParam<ContractParam> {
 protected:
  void SetUp() override {
    const auto& p = GetParam();
    paths_ = static_cast<int>(p.vnics.size());
    for (int r = 0; r < 2; ++r) {
      transport::TransportOptions o;
      o.rank = r;
      o.world_size = 2;
      for (size_t i = 0; i < o.secret.size(); ++i) o.secret[i] = static_cast<uint8_t>(i * 7 + 1);
      o.sink = &sinks_[r];
      o.max_inflight_per_path = 8;
      o.single_copy = p.single_copy;
      secret_ = o.secret;
      t_[r] = transport::makeTransport(p.kind, o);
    }
    std::vector<std::string> endpoints;
    for (const auto& a : p.vnics) endpoints.push_back(t_[1]->listen(a));
    // Rank 0 opens path i from vnics[i] (the endpoints it would publish).
    std::vector<std::string> rank0;
    for (const auto& a : p.vnics) rank0.push_back(net::parseAddress(a, 1).str());
    t_[1]->expectPeers({rank0, endpoints});
    transport::Hello hello;
    std::memcpy(hello.secret, secret_.data(), secret_.size());
    hello.rank = 0;
    for (int i = 0; i < paths_; ++i) {
      transport::PathSpec spec{1, i, p.vnics[i], endpoints[i]};
      hello.path = i;
      t_[0]->connect(spec, hello, after(30));
    }
    t_[1]->awaitAccepted(paths_, after(30));
  }
  void TearDown() override {
    for (auto& t : t_)
      if (t) t->shutdown();
  }
  // Rank 0 writes `bytes` of `src` (inside `local`) to the same offsets of
  // `remote` in chunks of `chunk`, chunk i on path i mod paths, with wr_id
  // wr_base + i and, if imm_tag >= 0, the immediate (imm_tag, i). Returns
  // the chunks.
  std::vector<multipath::ChunkSpan> writeChunks(const Region& local, const uint8_t* src, const RemoteRegion& remote,
                                            size_t bytes, size_t chunk, uint64_t wr_base, int imm_tag = -1) {
    auto chunks = multipath::decompose(bytes, chunk);
    for (const auto& c : chunks) {
      transport::WriteRequest w;
      w.local = local;
      w.src = src + c.offset;
      w.length = c.length;
      w.remote = remote;
      w.remote_offset = c.offset;
      w.with_imm = imm_tag >= 0;
      if (w.with_imm) w.imm = multipath::encodeImm(static_cast<uint32_t>(imm_tag), c.index);
      w.wr_id = wr_base + c.index;
      t_[0]->postWrite(1, static_cast<int>(c.index % paths_), w);
    }
    return chunks;
  }

  std::unique_ptr<transport::Transport> t_[2];
  RecordingSink sinks_[2];
  std::array<uint8_t, transport::Hello::kSecretBytes> secret_{};
  int paths_ = 0;
};

// A multi-MB message cut into 50 KB chunks, round robin over every path,
// lands byte for byte; every immediate arrives exactly once; every write
// completes on the sender.
TEST_P(TransportContract, ChunkedWriteAcrossAllPaths) {
  const size_t bytes = 8 << 20, chunk = 50 * 1024;
  std::vector<uint8_t> src(bytes), dst(bytes + 128, 0xEE);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
  Region local = t_[0]->registerMemory(src.data(), src.size());
  Region remote = t_[1]->registerMemory(dst.data() + 64, bytes);  // guard bytes on both sides
  uint64_t key = t_[1]->expose(remote);
  RemoteRegion rr = toRemote(remote);
  rr.key = key;
  auto chunks = writeChunks(local, src.data(), rr, bytes, chunk, 1000, 5);
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.completed.size() == chunks.size(); }));
  ASSERT_TRUE(sinks_[1].waitFor([&](const auto& s) { return s.arrivals.size() == chunks.size(); }));
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data() + 64, bytes));
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(0xEE, dst[i]);
    EXPECT_EQ(0xEE, dst[64 + bytes + i]);
  }
  std::set<uint32_t> seen;
  for (auto& a : sinks_[1].now().arrivals) {
    EXPECT_EQ(5u, multipath::immTag(a.first));
    EXPECT_EQ(chunks[multipath::immChunk(a.first)].length, a.second);
    EXPECT_TRUE(seen.insert(a.first).second) << "immediate delivered twice";
  }
  EXPECT_EQ(chunks.size(), seen.size());
  EXPECT_EQ(static_cast<size_t>(paths_), sinks_[1].now().arrival_paths.size());
  std::vector<uint64_t> ids = sinks_[0].now().completed;
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(1000 + i, ids[i]);
  EXPECT_TRUE(sinks_[0].now().errors.empty() && sinks_[1].now().errors.empty());
  t_[1]->conceal(remote);
}

// The same registration serves many writes (registration is the expensive
// step on RDMA: paper §5.1).
TEST_P(TransportContract, RegistrationReusedAcrossIterations) {
  std::vector<uint32_t> src(64 * 1024), dst(64 * 1024);
  Region local = t_[0]->registerMemory(src.data(), src.size() * 4);
  Region remote = t_[1]->registerMemory(dst.data(), dst.size() * 4);
  for (int it = 0; it < 5; ++it) {
    std::iota(src.begin(), src.end(), static_cast<uint32_t>(it * 1000));
    uint64_t key = t_[1]->expose(remote);
    RemoteRegion rr = toRemote(remote);
    rr.key = key;
    size_t before = sinks_[0].now().completed.size();
    for (int p = 0; p < paths_; ++p) {
      size_t part = src.size() * 4 / paths_;
      transport::WriteRequest w{local, reinterpret_cast<uint8_t*>(src.data()) + p * part, part, rr, p * part,
                                true, static_cast<uint32_t>(it), static_cast<uint64_t>(p)};
      t_[0]->postWrite(1, p, w);
    }
    ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.completed.size() == before + paths_; }));
    EXPECT_EQ(src, dst) << "iteration " << it;
    t_[1]->conceal(remote);
  }
}

TEST_P(TransportContract, ControlMessagesOnEveryPath) {
  for (int p = 0; p < paths_; ++p) {
    std::string m = "hello on path " + std::to_string(p);
    t_[0]->postSend(1, p, m.data(), m.size());
    t_[1]->postSend(0, p, m.data(), m.size());
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(sinks_[r].waitFor([&](const auto& s) { return s.messages.size() == static_cast<size_t>(paths_); }));
    auto messages = sinks_[r].now().messages;
    std::set<std::string> got(messages.begin(), messages.end());
    for (int p = 0; p < paths_; ++p) EXPECT_TRUE(got.count("hello on path " + std::to_string(p)));
  }
}

// A write with a wrong key ends in a path error with a clear message on the
// receiver, ok=false completions on the sender, and no byte written.
TEST_P(TransportContract, WrongKeyFailsThePathNotTheProcess) {
  std::vector<uint8_t> src(4096, 0xAB), dst(4096, 0);
  Region local = t_[0]->registerMemory(src.data(), src.size());
  Region remote = t_[1]->registerMemory(dst.data(), dst.size());
  t_[1]->expose(remote);
  RemoteRegion rr = toRemote(remote);
  rr.key ^= 0x5a5a5a5a;  // wrong key
  transport::WriteRequest w{local, src.data(), src.size(), rr, 0, true, 7, 42};
  t_[0]->postWrite(1, 0, w);
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return !s.flushed.empty() || !s.errors.empty(); }));
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return !s.flushed.empty(); }));
  EXPECT_EQ(42u, sinks_[0].now().flushed[0]);
  EXPECT_TRUE(sinks_[0].now().completed.empty());
  EXPECT_TRUE(sinks_[1].now().arrivals.empty());
  for (uint8_t b : dst) ASSERT_EQ(0, b);
  // Later writes on the dead path are flushed too, never lost silently.
  w.remote = toRemote(remote);
  w.wr_id = 43;
  t_[0]->postWrite(1, 0, w);
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.flushed.size() == 2; }));
  EXPECT_EQ(43u, sinks_[0].now().flushed[1]);
  t_[1]->conceal(remote);
}

// A region takes remote writes only while exposed, and each exposure has
// its own key: a write with an earlier exposure's key -- a late duplicate,
// or a peer that kept a key -- lands nowhere, whether the region is
// concealed or exposed again. (What the writer sees differs: TCP drains and
// acknowledges it; a verbs NIC refuses it and the writer's path fails.)
TEST_P(TransportContract, AWriteWithAnEarlierExposuresKeyLandsNowhere) {
  if (paths_ < 3) GTEST_SKIP() << "needs three paths";
  const size_t bytes = 64 * 1024;
  std::vector<uint8_t> first(bytes, 0x11), stale(bytes, 0x22), second(bytes, 0x33), dst(bytes, 0);
  Region r_first = t_[0]->registerMemory(first.data(), bytes);
  Region r_stale = t_[0]->registerMemory(stale.data(), bytes);
  Region r_second = t_[0]->registerMemory(second.data(), bytes);
  Region remote = t_[1]->registerMemory(dst.data(), bytes);
  auto finished = [&](uint64_t wr_id) {
    return sinks_[0].waitFor([&](const auto& s) {
      return std::count(s.completed.begin(), s.completed.end(), wr_id) + std::count(s.flushed.begin(), s.flushed.end(), wr_id) > 0;
    });
  };
  RemoteRegion rr = toRemote(remote);
  rr.key = t_[1]->expose(remote);
  const uint64_t first_key = rr.key;
  t_[0]->postWrite(1, 0, transport::WriteRequest{r_first, first.data(), bytes, rr, 0, true, 1, 1});
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return !s.completed.empty(); }));
  ASSERT_EQ(first, dst);
  t_[1]->conceal(remote);
  // Concealed: the first key opens nothing.
  t_[0]->postWrite(1, 0, transport::WriteRequest{r_stale, stale.data(), bytes, rr, 0, true, 2, 2});
  ASSERT_TRUE(finished(2));
  EXPECT_EQ(first, dst) << "a write landed in a concealed region";
  // Exposed again: a new key, and the first one still opens nothing.
  RemoteRegion now = toRemote(remote);
  now.key = t_[1]->expose(remote);
  EXPECT_NE(first_key, now.key) << "two exposures share a key";
  t_[0]->postWrite(1, 1, transport::WriteRequest{r_stale, stale.data(), bytes, rr, 0, true, 3, 3});
  ASSERT_TRUE(finished(3));
  EXPECT_EQ(first, dst) << "a write with the previous exposure's key landed";
  t_[0]->postWrite(1, 2, transport::WriteRequest{r_second, second.data(), bytes, now, 0, true, 4, 4});
  ASSERT_TRUE(finished(4));
  const auto done = sinks_[0].now().completed;
  EXPECT_EQ(1, std::count(done.begin(), done.end(), uint64_t{4})) << "the write with the current key failed";
  EXPECT_EQ(second, dst) << "the current exposure's key did not open the region";
  t_[1]->conceal(remote);
  t_[1]->deregisterMemory(remote);
  for (const Region& r : {r_first, r_stale, r_second}) t_[0]->deregisterMemory(r);
}

// closePath() raises one path error and flushes what was outstanding; the
// other paths keep working.
TEST_P(TransportContract, ClosePathFlushesAndOthersSurvive) {
  if (paths_ < 2) GTEST_SKIP() << "needs two paths";
  std::vector<uint8_t> src(1 << 20, 1), dst(1 << 20, 0);
  Region local = t_[0]->registerMemory(src.data(), src.size());
  Region remote = t_[1]->registerMemory(dst.data(), dst.size());
  RemoteRegion rr = toRemote(remote);
  rr.key = t_[1]->expose(remote);
  t_[0]->closePath(1, 0, "test closes path 0");
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.errors.size() == 1; }));
  EXPECT_NE(std::string::npos, sinks_[0].now().errors[0].find("test closes path 0"));
  transport::WriteRequest w{local, src.data(), src.size(), rr, 0, true, 1, 7};
  t_[0]->postWrite(1, 0, w);
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.flushed.size() == 1; }));
  w.wr_id = 8;
  t_[0]->postWrite(1, 1, w);
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.completed.size() == 1; }));
  EXPECT_EQ(8u, sinks_[0].now().completed[0]);
  EXPECT_EQ(src, dst);
  t_[1]->conceal(remote);
}

// A failed path is reopened by its initiator; both sides see it come up and
// it carries writes again.
TEST_P(TransportContract, ReconnectRestoresAFailedPath) {
  std::vector<uint8_t> src(64 * 1024, 7), dst(64 * 1024, 0);
  Region local = t_[0]->registerMemory(src.data(), src.size());
  Region remote = t_[1]->registerMemory(dst.data(), dst.size());
  RemoteRegion rr = toRemote(remote);
  rr.key = t_[1]->expose(remote);
  t_[0]->closePath(1, 0, "test takes path 0 down");
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.errors.size() == 1; }));
  size_t ups0 = sinks_[0].now().ups.size(), ups1 = sinks_[1].now().ups.size();
  ASSERT_TRUE(t_[0]->reconnect(1, 0, after(10)));
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.ups.size() > ups0; }));
  ASSERT_TRUE(sinks_[1].waitFor([&](const auto& s) { return s.ups.size() > ups1; }));
  transport::WriteRequest w{local, src.data(), src.size(), rr, 0, true, 3, 99};
  t_[0]->postWrite(1, 0, w);
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return !s.completed.empty(); }));
  EXPECT_EQ(99u, sinks_[0].now().completed.back());
  EXPECT_EQ(src, dst);
  t_[1]->conceal(remote);
}

// ---- the optional parts -----------------------------------------------------
// A transport answers for them explicitly: capabilities() names the optional
// interfaces its accessors return, and a kind declares, before any transport
// of it exists, what its transports answer. Where a part is there, it works
// (tcp has both; verbs neither, and these pass there with nothing to try).

TEST_P(TransportContract, CapabilitiesAgreeWithTheKindAndTheAccessors) {
  for (auto& t : t_) {
    const transport::Capabilities c = t->capabilities();
    EXPECT_TRUE(transport::capabilities(GetParam().kind) == c) << "the kind declares other capabilities";
    EXPECT_EQ(c.route_control, t->routeControl() != nullptr);
    EXPECT_EQ(c.fencing, t->fencing() != nullptr);
  }
}

// Route control: a live path re-opened from a reserved source port comes
// back on that port (the old connection fails first) and carries writes;
// probes answer one hop (or "") per probe.
TEST_P(TransportContract, RouteControlReopensAPathFromAReservedPort) {
  transport::RouteControl* routes = t_[0]->routeControl();
  if (routes == nullptr) return;  // verbs: checked above
  const std::string& vnic = GetParam().vnics[0];
  const uint16_t port = routes->reservePort(vnic);
  ASSERT_NE(0, port);
  std::string why;  // (towards a port nobody listens on, as the route survey probes)
  const auto hops = routes->probeRoutes({{strcat(vnic, ":", port), strcat(GetParam().vnics.back(), ":9")}}, 1,
                                        after(2), &why);
  EXPECT_EQ(1u, hops.size());
  size_t ups0 = sinks_[0].now().ups.size(), ups1 = sinks_[1].now().ups.size();
  ASSERT_TRUE(routes->reopen(1, 0, port, after(10)));
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return s.errors.size() == 1 && s.ups.size() > ups0; }));
  ASSERT_TRUE(sinks_[1].waitFor([&](const auto& s) { return s.ups.size() > ups1; }));
  EXPECT_EQ(0u, t_[0]->describePath(1, 0).find(strcat(vnic, ":", port, " "))) << t_[0]->describePath(1, 0);
  std::vector<uint8_t> src(64 * 1024, 9), dst(64 * 1024, 0);
  Region local = t_[0]->registerMemory(src.data(), src.size());
  Region remote = t_[1]->registerMemory(dst.data(), dst.size());
  RemoteRegion rr = toRemote(remote);
  rr.key = t_[1]->expose(remote);
  t_[0]->postWrite(1, 0, transport::WriteRequest{local, src.data(), src.size(), rr, 0, true, 1, 5});
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return !s.completed.empty(); }));
  EXPECT_EQ(src, dst);
  t_[1]->conceal(remote);
  routes->releasePort(vnic, port);
}

// Fencing: a fence on a path with nothing in flight takes nothing back, and
// what is posted after it lands, whether the peer hears of the fence before
// the mark arrives or after.
TEST_P(TransportContract, FencingTakesBackNothingIdleAndHoldsNothingAfterTheMark) {
  transport::Fencing* fences = t_[0]->fencing();
  if (fences == nullptr) return;  // verbs: checked above
  std::vector<uint8_t> src(4096, 3), dst(4096, 0);
  Region local = t_[0]->registerMemory(src.data(), src.size());
  Region remote = t_[1]->registerMemory(dst.data(), dst.size());
  RemoteRegion rr = toRemote(remote);
  rr.key = t_[1]->expose(remote);
  const uint64_t mark = fences->withdrawWrites(1, 0);
  ASSERT_GT(mark, 0u) << "the path is up";
  t_[1]->fencing()->dropWritesUntil(0, 0, mark);
  t_[0]->postWrite(1, 0, transport::WriteRequest{local, src.data(), src.size(), rr, 0, true, 2, 6});
  ASSERT_TRUE(sinks_[0].waitFor([&](const auto& s) { return !s.completed.empty(); }));
  ASSERT_TRUE(sinks_[1].waitFor([&](const auto& s) { return !s.arrivals.empty(); }));
  EXPECT_EQ(src, dst);
  EXPECT_TRUE(sinks_[0].now().withdrawn.empty());
  t_[1]->conceal(remote);
}

}  // namespace testing
}  // namespace maestro
