#include "transport/tcp/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <future>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/net.h"
#include "common/thread.h"

namespace maestro {
namespace transport {
namespace tcp {
namespace {

constexpr uint64_t kWakeId = 0;  // registration ids start at 1
constexpr int kMaxEvents = 64;

}  // namespace

std::shared_ptr<EventLoop> EventLoop::shared() {
  static std::mutex mu;
  static std::weak_ptr<EventLoop> current;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<EventLoop> loop = current.lock();
  if (!loop) {
    loop = std::make_shared<EventLoop>();
    current = loop;
  }
  return loop;
}

EventLoop::EventLoop() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  MAESTRO_CHECK(epoll_fd_ >= 0, "epoll_create1: ", net::errnoText(errno));
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  MAESTRO_CHECK(wake_fd_ >= 0, "eventfd: ", net::errnoText(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  MAESTRO_CHECK(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) == 0, "epoll_ctl: ", net::errnoText(errno));
  thread_ = startNamedThread("maestro-io", [this] { run(); });
}

EventLoop::~EventLoop() {
  MAESTRO_CHECK(!inLoopThread(), "the event loop was released on its own thread");
  stopping_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

void EventLoop::wake() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
  (void)ignored;
}

uint64_t EventLoop::add(int fd, std::shared_ptr<Handler> handler, bool want_write) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    handlers_[id] = std::move(handler);
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want_write ? EPOLLOUT : 0u);
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int err = errno;
    std::lock_guard<std::mutex> lock(mu_);
    handlers_.erase(id);
    fail("epoll_ctl(ADD) of socket ", fd, ": ", net::errnoText(err));
  }
  return id;
}

void EventLoop::modify(uint64_t id, int fd, bool want_write) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want_write ? EPOLLOUT : 0u);
  ev.data.u64 = id;
  // ENOENT: removed meanwhile (the path failed); nothing to watch.
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::remove(uint64_t id, int fd) {
  std::shared_ptr<Handler> keep;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handlers_.find(id);
    if (it == handlers_.end()) return;
    keep = std::move(it->second);
    handlers_.erase(it);
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

void EventLoop::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  wake();
}

void EventLoop::postAfter(std::chrono::milliseconds delay, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    timers_.emplace(std::chrono::steady_clock::now() + delay, std::move(task));
  }
  wake();  // the loop may be sleeping past the new deadline
}

void EventLoop::quiesce() {
  if (inLoopThread() || stopping_.load()) return;
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  post([done] { done->set_value(); });  // tasks run after the handler calls of their round
  future.wait();
}

void EventLoop::busyPoll(bool on) {
  busy_pollers_ += on ? 1 : -1;
  wake();
}

size_t EventLoop::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handlers_.size();
}

void EventLoop::run() {
  thread_id_ = std::this_thread::get_id();
  epoll_event events[kMaxEvents];
  std::deque<std::function<void()>> tasks;
  while (!stopping_.load()) {
    int timeout = busy_pollers_.load() > 0 ? 0 : -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!timers_.empty() && timeout != 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(timers_.begin()->first -
                                                                          std::chrono::steady_clock::now());
        timeout = static_cast<int>(std::max<long long>(0, left.count() + 1));  // +1: never wake early
      }
    }
    int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      MAESTRO_WARN("tcp event loop: epoll_wait failed: ", net::errnoText(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kWakeId) {
        uint64_t count;
        ssize_t ignored = ::read(wake_fd_, &count, sizeof count);
        (void)ignored;
        continue;
      }
      std::shared_ptr<Handler> handler;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = handlers_.find(id);
        if (it == handlers_.end()) continue;  // removed after epoll_wait reported it
        handler = it->second;
      }
      try {
        handler->onEvents(events[i].events);
      } catch (const std::exception& e) {  // a handler reports its errors itself; this is a bug
        MAESTRO_WARN("tcp event loop: a handler threw: ", e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks.swap(tasks_);
      const auto now = std::chrono::steady_clock::now();
      while (!timers_.empty() && timers_.begin()->first <= now) {
        tasks.push_back(std::move(timers_.begin()->second));
        timers_.erase(timers_.begin());
      }
    }
    for (auto& task : tasks) {
      try {
        task();
      } catch (const std::exception& e) {
        MAESTRO_WARN("tcp event loop: a task threw: ", e.what());
      }
    }
    tasks.clear();
  }
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
