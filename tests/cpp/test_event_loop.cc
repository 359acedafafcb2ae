// The TCP transport's event loop: tasks run on its thread, removal is safe
// from any thread (also from a handler's own call), and the process has one
// loop however many transports it runs.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "test_util.h"
#include "transport/tcp/event_loop.h"

namespace maestro {
namespace testing {
namespace {

using transport::tcp::EventLoop;

// Reads whatever is there and counts its calls.
class CountingHandler : public EventLoop::Handler {
 public:
  explicit CountingHandler(int fd) : fd_(fd) {}
  void onEvents(uint32_t) override {
    char buf[256];
    while (::recv(fd_, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
    ++calls;
    if (on_call) on_call();
  }
  int fd_;
  std::atomic<int> calls{0};
  std::function<void()> on_call;
};

struct SocketPair {
  SocketPair() { EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds)); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void poke() { EXPECT_EQ(1, ::write(fds[1], "x", 1)); }
  int fds[2];
};

template <typename Pred>
bool eventually(Pred pred, double seconds = 5) {
  auto deadline = after(seconds);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

TEST(EventLoop, TasksRunOnTheLoopThread) {
  auto loop = EventLoop::shared();
  std::promise<bool> on_loop;
  loop->post([&] { on_loop.set_value(loop->inLoopThread()); });
  auto f = on_loop.get_future();
  ASSERT_EQ(std::future_status::ready, f.wait_for(std::chrono::seconds(5)));
  EXPECT_TRUE(f.get());
  EXPECT_FALSE(loop->inLoopThread());
}

TEST(EventLoop, ProcessHasOneLoopWhileHeld) {
  auto a = EventLoop::shared();
  auto b = EventLoop::shared();
  EXPECT_EQ(a.get(), b.get());
  // Exact, not eventually: the loops of earlier tests that are still being
  // reaped are not counted (maestroThreads).
  EXPECT_EQ(1, maestroThreads()["maestro-io"]);
}

TEST(EventLoop, NoCallAfterRemoveReturns) {
  auto loop = EventLoop::shared();
  SocketPair s;
  auto h = std::make_shared<CountingHandler>(s.fds[0]);
  uint64_t id = loop->add(s.fds[0], h, false);
  s.poke();
  ASSERT_TRUE(eventually([&] { return h->calls.load() >= 1; }));
  // Removed while the loop may be running it: once a task posted after the
  // removal has run, no call can be in progress or follow.
  loop->remove(id, s.fds[0]);
  std::promise<void> barrier;
  loop->post([&] { barrier.set_value(); });
  barrier.get_future().wait();
  int calls = h->calls.load();
  s.poke();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(calls, h->calls.load());
  EXPECT_EQ(1, h.use_count()) << "the loop let go of the handler";
}

// A handler that removes itself, after every other reference is gone, is
// kept alive until its call returns.
TEST(EventLoop, HandlerRemovingItselfOutlivesItsCall) {
  auto loop = EventLoop::shared();
  SocketPair s;
  auto h = std::make_shared<CountingHandler>(s.fds[0]);
  std::weak_ptr<CountingHandler> weak = h;
  std::atomic<uint64_t> id{0};
  std::atomic<bool> alive_after_remove{false};
  CountingHandler* raw = h.get();
  h->on_call = [&, raw] {
    loop->remove(id.load(), s.fds[0]);
    alive_after_remove = raw->calls.load() >= 1;  // touches the object after its removal
  };
  id = loop->add(s.fds[0], h, false);
  h.reset();  // the loop holds the only reference now
  s.poke();
  EXPECT_TRUE(eventually([&] { return weak.expired(); }));
  EXPECT_TRUE(alive_after_remove.load());
}

TEST(EventLoop, EventsOfAClosedRegistrationAreIgnored) {
  auto loop = EventLoop::shared();
  size_t before = loop->watched();
  {
    SocketPair s;
    auto h = std::make_shared<CountingHandler>(s.fds[0]);
    uint64_t id = loop->add(s.fds[0], h, true);  // writable at once: called repeatedly
    ASSERT_TRUE(eventually([&] { return h->calls.load() >= 3; }));
    loop->remove(id, s.fds[0]);
    loop->remove(id, s.fds[0]);  // idempotent
    // A call that was in progress may still be reading the socket: it has
    // ended once quiesce() returns, and only then may the socket be closed.
    loop->quiesce();
  }
  EXPECT_EQ(before, loop->watched());
}

}  // namespace
}  // namespace testing
}  // namespace maestro
