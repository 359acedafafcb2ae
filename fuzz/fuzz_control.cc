// libFuzzer target: control messages from a peer (descriptors, credits,
// point-to-point ready/grant/done,
// barrier tokens, aborts, pings, path-down notices, path hunting's
// asks/offers/picks -- hunting is on, so an ask really re-opens a path) fed to a live engine of
// a 2-rank group over loopback, as its transport delivers them. A message
// the protocol forbids must fail the peer with a message, never crash. The
// harness steers most inputs to a known type, a whole header and a near
// operation, so that most keep the peer alive.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "multipath/engine.h"
#include "test_util.h"

using maestro::multipath::Engine;

namespace {

struct Group {
  maestro::testing::MemoryRendezvous store;
  std::vector<std::unique_ptr<Engine>> engines{2};
  Group() {
    maestro::testing::runRanks(2, [&](int r) {
      engines[r] = std::make_unique<Engine>(std::map<std::string, std::string>{{"paths", "2"}, {"hunt", "on"}}, store, r, 2,
                                            maestro::testing::after(30));
    });
  }
};

std::unique_ptr<Group> group;
size_t since_rebuild = 0;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!group) group = std::make_unique<Group>();
  Engine& a = *group->engines[0];
  std::vector<uint8_t> msg(data, data + size);
  // Byte 0 == 0xEE keeps the input as it is (short, unknown type: the peer
  // is failed); otherwise it becomes a whole header of a known type.
  if (msg.empty() || msg[0] != 0xEE) {
    if (msg.empty()) msg.push_back(1);
    msg[0] = static_cast<uint8_t>(1 + msg[0] % 16);  // kDesc .. kFence
    if (msg.size() < 16) msg.resize(16, 0);
  }
  if (msg.size() >= 16 && msg[1] != 0xEE) {  // near operations but for 0xEE: far ones end the group
    uint64_t seq;
    std::memcpy(&seq, msg.data() + 8, 8);
    seq %= 4096;
    std::memcpy(msg.data() + 8, &seq, 8);
  }
  a.onMessage(1, size % 2, msg.data(), msg.size());
  // The peer is failed (with a message) by a message the protocol forbids.
  // A failed peer still parses what it gets, so the group is rebuilt (slow:
  // threads, sockets) only now and then to bring back the live states.
  if (++since_rebuild >= 2000) {
    try {
      a.checkPeer(1);
    } catch (const maestro::Error&) {
      group.reset();
      since_rebuild = 0;
    }
  }
  return 0;
}
