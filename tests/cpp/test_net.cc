// Socket-level helpers that need no peer: the descriptor budget a group
// checks before it opens its paths.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/net.h"

namespace maestro {
namespace testing {
namespace {

// Runs `body` in a child process (limits changed there stay there); returns
// its exit status.
int inChild(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

// A listener's port is its own unless it is shared on purpose: route
// discovery sends SYNs from the listener's address and port (the reverse
// direction of a path), which only SO_REUSEPORT on both sockets allows.
TEST(Listener, PortIsNotSharedUnlessAsked) {
  int own = net::listenOn("127.0.0.1", 0);
  net::SockAddr at = net::localAddress(own);
  EXPECT_THROW(::close(net::bindReusable(at)), Error) << "another socket bound a listener's port";
  ::close(own);
  int shared = net::listenOn("127.0.0.1", 0, 16, true);
  at = net::localAddress(shared);
  int probe = net::startProbe(net::parseEndpoint(at.str()), net::parseEndpoint("127.0.0.1:9"), 1);
  EXPECT_GE(probe, 0);
  ::close(probe);
  ::close(shared);
}

// Both ends probe a candidate at once, each in its direction. Where no
// router lies between (two ranks on one leaf), one end's SYN reaches the
// other's listener and becomes a connection, so the other end's probe of the
// same 5-tuple cannot start. That is an answer ("no router between"), not a
// probe lost to a router's ICMP rate limit.
TEST(RouteProbe, APeersProbeThatReachedUsCountsAsReached) {
  int listener = net::listenOn("127.0.0.1", 0, 16, true);
  net::SockAddr at = net::localAddress(listener);
  int peer = net::bindReusable(net::parseAddress("127.0.0.2", 0));
  net::SockAddr from = net::localAddress(peer);
  ASSERT_EQ(0, ::connect(peer, at.get(), at.length));  // the peer's probe, arrived
  EXPECT_EQ(-1, net::startProbe(at, from, 1));
  std::string why;
  auto hops = net::probeHops({{at, from}}, 1, Clock::now() + std::chrono::seconds(2), &why);
  EXPECT_EQ(std::vector<std::string>{""}, hops);
  EXPECT_EQ("", why) << "a probe that met the peer's own was taken for a lost one";
  ::close(peer);
  ::close(listener);
}

TEST(Addresses, LoopbackIsRecognised) {
  for (const char* ip : {"127.0.0.1", "127.0.1.1", "127.255.0.9", "::1", "::ffff:127.0.0.1"})
    EXPECT_TRUE(net::isLoopbackAddress(ip)) << ip;
  for (const char* ip : {"10.0.0.1", "128.0.0.1", "::2", "fd00::1", "::ffff:10.0.0.1", "localhost", ""})
    EXPECT_FALSE(net::isLoopbackAddress(ip)) << ip;
}

TEST(Descriptors, SoftLimitIsRaisedTowardsTheHardOne) {
  EXPECT_EQ(0, inChild([] {
    rlimit l{64, 4096};
    if (::setrlimit(RLIMIT_NOFILE, &l) != 0) return 2;
    net::reserveDescriptors(1000, "a test group");
    ::getrlimit(RLIMIT_NOFILE, &l);
    return l.rlim_cur >= 1000 ? 0 : 3;
  }));
}

TEST(Descriptors, BeyondTheHardLimitSaysWhatToRaise) {
  EXPECT_EQ(0, inChild([] {
    rlimit l{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &l) != 0) return 2;
    try {
      net::reserveDescriptors(1000, "a group of 501 ranks with 2 paths per peer");
    } catch (const Error& e) {
      std::string what = e.what();
      bool names = what.find("a group of 501 ranks") != std::string::npos &&
                   what.find("RLIMIT_NOFILE") != std::string::npos && what.find("ulimit -n") != std::string::npos;
      return names ? 0 : 4;
    }
    return 5;  // no error
  }));
}

}  // namespace
}  // namespace testing
}  // namespace maestro
