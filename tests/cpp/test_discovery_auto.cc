// MAESTRO_DISCOVERY=auto: a group runs discovery when a router
// MAESTRO_PROBE_TTL hops out answers some rank's probe towards its ring
// neighbour (the routes may be hashed), else not; and a process asks once
// per set of addresses: a later group between the same addresses takes the
// first answer, because routers answer only a few probes a second.
//
// Against a real router: two ranks in network namespaces of their own with
// a third namespace forwarding between them (the Linux router answers ICMP
// time-exceeded), each rank a thread that enters its namespace and a UTS
// namespace of its own (another host name, so the ranks are on two hosts).
// The ranks agree through the set-up's real steps (QpManager::plan) over an
// in-process store. Needs root (network namespaces).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/error.h"
#include "multipath/qp_manager.h"
#include "test_util.h"

namespace maestro {
namespace multipath {
namespace {

using testing::after;
using testing::errorText;
using testing::MemoryRendezvous;
using testing::runRanks;

// What one rank's set-up decided.
struct Decision {
  std::string discovery, why;
  int paths = 0;
  std::string paths_why;
};

class DiscoveryAuto : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
    // The decisions are kept for the life of the process, by address: every
    // run of a test here (--gtest_repeat) takes addresses of its own.
    static std::atomic<int> runs{0};
    net_ = 1 + runs++;
    ASSERT_LE(net_, 250) << "out of fresh addresses for this process";
    const std::string tag = strcat("mda", getpid(), "-", net_);
    a_ = tag + "a";
    b_ = tag + "b";
    r_ = tag + "r";
    // Rank 0 in a_ (10.N.1.1 and .2), rank 1 in b_ (10.N.2.1 and .2), the
    // router r_ between them (.254 on each side).
    const std::string n = std::to_string(net_);
    made_ = true;
    ASSERT_TRUE(sh("ip netns add " + a_ + " && ip netns add " + b_ + " && ip netns add " + r_ +
                   " && ip -n " + a_ + " link add a0 type veth peer name ra netns " + r_ +
                   " && ip -n " + b_ + " link add b0 type veth peer name rb netns " + r_ +
                   " && ip -n " + a_ + " addr add 10." + n + ".1.1/24 dev a0" +
                   " && ip -n " + a_ + " addr add 10." + n + ".1.2/24 dev a0" +
                   " && ip -n " + b_ + " addr add 10." + n + ".2.1/24 dev b0" +
                   " && ip -n " + b_ + " addr add 10." + n + ".2.2/24 dev b0" +
                   " && ip -n " + r_ + " addr add 10." + n + ".1.254/24 dev ra" +
                   " && ip -n " + r_ + " addr add 10." + n + ".2.254/24 dev rb" +
                   " && ip -n " + a_ + " link set lo up && ip -n " + a_ + " link set a0 up" +
                   " && ip -n " + b_ + " link set lo up && ip -n " + b_ + " link set b0 up" +
                   " && ip -n " + r_ + " link set ra up && ip -n " + r_ + " link set rb up" +
                   " && ip -n " + a_ + " route add default via 10." + n + ".1.254" +
                   " && ip -n " + b_ + " route add default via 10." + n + ".2.254" +
                   " && routerForwards 1"))
        << "cannot build the namespaces (ip from iproute2, root)";
  }
  void TearDown() override {
    if (made_) sh("ip netns del " + a_ + "; ip netns del " + b_ + "; ip netns del " + r_);
  }

  // A shell command; routerForwards V sets the router's forwarding to V.
  bool sh(const std::string& command) {
    const std::string fn = "routerForwards() { ip netns exec " + r_ + " sysctl -qw net.ipv4.ip_forward=$1; }; ";
    return std::system(("{ " + fn + command + "; } >/dev/null 2>&1").c_str()) == 0;
  }

  std::string addr(int rank, int which) const { return strcat("10.", net_, ".", rank + 1, ".", which); }

  // Both ranks' set-up with discovery auto, each in its network namespace,
  // from vNIC address .`which`, probing `ttl` hops out. `own_hosts`: each
  // rank with a host name of its own (two hosts), else one host name for
  // both -- which the set-up takes for one host.
  std::vector<Decision> plan(int ttl, int which = 1, bool own_hosts = true, const std::string& weights = "") {
    MemoryRendezvous store;
    std::vector<Decision> out(2);
    auto errors = runRanks(2, [&](int rank) {
      // This thread only: its network and its host name.
      const std::string path = "/var/run/netns/" + (rank == 0 ? a_ : b_);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      MAESTRO_CHECK(fd >= 0, "open ", path);
      const bool entered = ::setns(fd, CLONE_NEWNET) == 0;
      ::close(fd);
      MAESTRO_CHECK(entered && ::unshare(CLONE_NEWUTS) == 0, "cannot enter the namespaces of rank ", rank);
      const std::string host = own_hosts ? strcat("discovery-auto-rank", rank) : std::string("discovery-auto");
      MAESTRO_CHECK(::sethostname(host.c_str(), host.size()) == 0, "sethostname");
      QpManager qp(store, rank, 2, after(20));
      Config config = qp.agreeOnConfig({{"discovery", "auto"},
                                        {"transport", "tcp"},
                                        {"probe_ttl", std::to_string(ttl)},
                                        {"vnics", addr(rank, which)},
                                        {"weights", weights}});
      Mesh mesh = qp.plan(config, "");
      out[rank] = {mesh.discovery, mesh.discovery_why, mesh.paths, mesh.paths_why};
    });
    for (auto& e : errors) EXPECT_EQ("", errorText(e));
    return out;
  }

  int net_ = 0;
  bool made_ = false;
  std::string a_, b_, r_;
};

// The router one hop out answers: discovery runs, on both ranks. The
// survey found one core hop, not more than the one vNIC, so paths=auto
// stays at one path per vNIC and says why.
TEST_F(DiscoveryAuto, ARouterAtTheProbeTtlTurnsDiscoveryOn) {
  for (const Decision& d : plan(1)) {
    EXPECT_EQ("ttl", d.discovery) << d.why;
    EXPECT_EQ("routers between the ranks answered probes", d.why);
    EXPECT_EQ(1, d.paths);
    EXPECT_EQ("auto: one per vNIC (route probes found 1 core hop towards the ring neighbours)", d.paths_why);
  }
  // Weights name the paths one by one: auto does not add paths beside them.
  for (const Decision& d : plan(1, 2, true, "1")) {
    EXPECT_EQ("ttl", d.discovery) << d.why;
    EXPECT_EQ(1, d.paths);
    EXPECT_EQ("auto: one per vNIC (MAESTRO_WEIGHTS gives one weight per path)", d.paths_why);
  }
}

// Two hops out is the peer itself (it refuses the SYN): no router tells
// the paths apart there, so discovery stays off. Nor does it run where the
// ranks share a host: ranks that the set-up takes for one host (one host
// name; the network namespace it compares is the process's) do not probe,
// though here a probe would find the router.
TEST_F(DiscoveryAuto, NoRouterAtTheProbeTtlOrOneHostLeavesItOff) {
  auto two_hops = plan(2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ("off", two_hops[r].discovery) << two_hops[r].why;
    EXPECT_EQ(strcat("no router 2 hops towards rank ", 1 - r), two_hops[r].why);
  }
  for (const Decision& d : plan(1, 2, false)) {
    EXPECT_EQ("off", d.discovery) << d.why;
    EXPECT_EQ("every rank is on this host", d.why);
  }
}

// One rank's answer decides for the group: the router does not forward
// what comes from rank 1's side (it answers "unreachable", not "time
// exceeded"), so only rank 0's probe finds it -- and both ranks run discovery.
TEST_F(DiscoveryAuto, OneRanksAnswerDecidesForEveryRank) {
  ASSERT_TRUE(sh("ip netns exec " + r_ + " sysctl -qw net.ipv4.conf.rb.forwarding=0"));
  for (const Decision& d : plan(1)) {
    EXPECT_EQ("ttl", d.discovery) << d.why;
    EXPECT_EQ("routers between the ranks answered probes", d.why);
  }
  // The control: from neither side, discovery stays off.
  ASSERT_TRUE(sh("routerForwards 0"));
  for (const Decision& d : plan(1, 2)) EXPECT_EQ("off", d.discovery) << d.why;
}

// A later group between the same addresses takes the first answer: with
// the router silent now, the same addresses still run discovery, while
// addresses not asked about before are probed afresh and find no router --
// the answer the first ones would get now. Answers that found none are
// kept too, and say so.
TEST_F(DiscoveryAuto, TheFirstAnswerIsKeptForLaterGroupsBetweenTheSameAddresses) {
  for (const Decision& d : plan(1)) ASSERT_EQ("ttl", d.discovery) << d.why;
  ASSERT_TRUE(sh("routerForwards 0"));
  for (const Decision& d : plan(1)) {
    EXPECT_EQ("ttl", d.discovery) << "the first answer was not kept: " << d.why;
  }
  auto fresh = plan(1, 2);
  for (const Decision& d : fresh) {
    EXPECT_EQ("off", d.discovery) << "the silent router answered: the test proves nothing";
    EXPECT_EQ(std::string::npos, d.why.find("earlier group")) << d.why;
  }
  ASSERT_TRUE(sh("routerForwards 1"));  // it answers again, but the answer was kept
  for (const Decision& d : plan(1, 2)) {
    EXPECT_EQ("off", d.discovery) << d.why;
    EXPECT_NE(std::string::npos, d.why.find("(probed by an earlier group of this process)")) << d.why;
  }
  // The probe's depth is part of what was asked: another TTL is asked afresh.
  for (const Decision& d : plan(2)) EXPECT_EQ(std::string::npos, d.why.find("earlier group")) << d.why;
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
