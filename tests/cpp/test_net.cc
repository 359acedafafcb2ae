// Socket-level helpers that need no peer: the descriptor budget a group
// checks before it opens its paths.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>

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
