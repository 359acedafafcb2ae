// Between two RDMA devices: runs only under `scripts/softroce/run.sh
// --two-vms -- <this binary> --gtest_filter='VerbsTwoVms.*'`, where each VM
// runs this binary with MAESTRO_VM_INDEX (= rank), its own MAESTRO_VNICS and
// a shared folder MAESTRO_SOFTROCE_OUT to rendezvous through. Inside one VM
// rxe hands packets to itself; here every packet crosses the emulated wire.
//
// Rank 0 listens on its four vNICs and publishes the endpoints and its
// target region; rank 1 opens path i from its vNIC i to rank 0's vNIC i and
// writes a chunked message over the four paths; rank 0 checks every byte
// and immediate, then they say goodbye with control messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "../recording_sink.h"
#include "common/error.h"
#include "transport/verbs/verbs_transport.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

using testing::RecordingSink;

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

uint8_t pattern(size_t i) { return static_cast<uint8_t>(i * 167 + (i >> 11) + 3); }

TEST(VerbsTwoVms, ChunkedWriteBetweenTwoRdmaDevices) {
  if (env("MAESTRO_VM_INDEX").empty()) GTEST_SKIP() << "only under scripts/softroce/run.sh --two-vms";
  const int rank = std::atoi(env("MAESTRO_VM_INDEX").c_str());
  const std::vector<std::string> vnics = splitCommas(env("MAESTRO_VNICS"));
  const std::string run_id = env("MAESTRO_SOFTROCE_RUN_ID");
  const std::string file = env("MAESTRO_SOFTROCE_OUT") + "/two_vms_rendezvous.txt";
  ASSERT_EQ(vnics.size(), 4u);
  std::string why;
  ASSERT_TRUE(verbsUsableFor(vnics, &why)) << why;

  constexpr size_t kBytes = 4 << 20, kChunk = 50 * 1024;
  const size_t chunks = (kBytes + kChunk - 1) / kChunk;
  RecordingSink sink;
  TransportOptions options;
  options.rank = rank;
  options.world_size = 2;
  options.secret.fill(0x5e);
  options.sink = &sink;
  auto t = makeVerbsTransport(options);
  std::vector<uint8_t> buffer(kBytes, 0);

  if (rank == 0) {
    std::string endpoints;
    std::vector<std::string> mine;
    for (const auto& a : vnics) {
      mine.push_back(t->listen(a));
      endpoints += (endpoints.empty() ? "" : ",") + mine.back();
    }
    // Rank 1 opens path p from its alias p (what it would publish).
    std::vector<std::string> peer;
    for (const auto& a : splitCommas(env("MAESTRO_PEER_VNICS"))) peer.push_back(a + ":1");
    ASSERT_EQ(peer.size(), 4u);
    t->expectPeers({mine, peer});
    const Region region = t->registerMemory(buffer.data(), kBytes);
    const uint64_t key = t->expose(region);
    {
      std::ofstream out(file + ".tmp");
      out << run_id << "\n" << endpoints << "\n" << reinterpret_cast<uint64_t>(buffer.data()) << " " << key << " "
          << kBytes << "\n";
    }
    ASSERT_EQ(std::rename((file + ".tmp").c_str(), file.c_str()), 0);
    // The other VM may boot a good deal later.
    t->awaitAccepted(4, Clock::now() + std::chrono::seconds(240));
    ASSERT_TRUE(sink.waitFor([&](const auto& s) { return s.arrivals.size() >= chunks || !s.errors.empty(); }, 120))
        << sink.now().arrivals.size() << " of " << chunks << " chunks arrived";
    ASSERT_TRUE(sink.now().errors.empty()) << sink.now().errors[0];
    std::set<uint32_t> imms;
    for (const auto& a : sink.now().arrivals) EXPECT_TRUE(imms.insert(a.first).second) << "immediate " << a.first << " twice";
    EXPECT_EQ(imms.size(), chunks);
    EXPECT_EQ(sink.now().arrival_paths.size(), 4u);
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += buffer[i] != pattern(i);
    EXPECT_EQ(wrong, 0u) << "bytes differ";
    t->postSend(1, 0, "verified", 8);
    EXPECT_TRUE(sink.waitFor([&](const auto& s) { return !s.messages.empty(); }, 60)) << "no goodbye from rank 1";
    t->conceal(region);
  } else {
    std::vector<std::string> endpoints;
    uint64_t addr = 0, key = 0, length = 0;
    const auto until = Clock::now() + std::chrono::seconds(240);
    for (;;) {
      std::ifstream in(file);
      std::string id, eps;
      if (in && std::getline(in, id) && id == run_id && std::getline(in, eps) && (in >> addr >> key >> length)) {
        endpoints = splitCommas(eps);
        break;
      }
      ASSERT_LT(Clock::now(), until) << "rank 0 never published its endpoints in " << file;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_EQ(endpoints.size(), 4u);
    for (int p = 0; p < 4; ++p) {
      Hello hello;
      std::memset(hello.secret, 0x5e, sizeof(hello.secret));
      hello.rank = 1;
      hello.path = p;
      t->connect(PathSpec{0, p, vnics[p], endpoints[p]}, hello, Clock::now() + std::chrono::seconds(60));
      std::printf("[ info     ] path %d: %s\n", p, t->describePath(0, p).c_str());
    }
    for (size_t i = 0; i < kBytes; ++i) buffer[i] = pattern(i);
    const Region local = t->registerMemory(buffer.data(), kBytes);
    const RemoteRegion remote{0, key, addr, length};
    const auto start = Clock::now();
    for (size_t c = 0; c < chunks; ++c) {
      WriteRequest req;
      req.local = local;
      req.src = buffer.data() + c * kChunk;
      req.length = std::min(kChunk, kBytes - c * kChunk);
      req.remote = remote;
      req.remote_offset = c * kChunk;
      req.with_imm = true;
      req.imm = static_cast<uint32_t>(c);
      req.wr_id = c;
      t->postWrite(0, static_cast<int>(c % 4), req);  // beyond the window: the backlog holds the rest
    }
    ASSERT_TRUE(sink.waitFor([&](const auto& s) { return s.completed.size() >= chunks || !s.flushed.empty(); }, 120))
        << sink.now().completed.size() << " of " << chunks << " writes completed";
    ASSERT_TRUE(sink.now().flushed.empty()) << sink.now().errors.at(0);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("[ info     ] %zu chunks VM to VM over 4 paths: %.1f MB/s\n", chunks, kBytes / secs / 1e6);
    ASSERT_TRUE(sink.waitFor([&](const auto& s) { return !s.messages.empty(); }, 60)) << "rank 0 never confirmed";
    EXPECT_EQ(sink.now().messages[0], "verified");
    t->postSend(0, 0, "bye", 3);
    // Rank 0 shuts down once it has the goodbye; its DISCONNECTs end the wait.
    EXPECT_TRUE(sink.waitFor([&](const auto& s) { return !s.errors.empty(); }, 60));
  }
  t->shutdown();
}

}  // namespace
}  // namespace verbs
}  // namespace transport
}  // namespace maestro
