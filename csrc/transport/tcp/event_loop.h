// The TCP transport's progress engine: one epoll loop per process drives
// every path of every process group, so a rank runs O(1) I/O threads however
// many peers and paths it has (Gloo's tcp::Loop, NCCL's proxy thread).
//
// Sockets are non-blocking and level-triggered. A handler is called on the
// loop thread with the epoll events of its socket; it reads and writes what
// it can without blocking and returns. Threads other than the loop may still
// write to a socket themselves (a path sends inline from the posting thread,
// under its own lock) and ask for EPOLLOUT only when the kernel's buffer is
// full.
//
// Lifetime rules that make removal safe from any thread without waiting:
//   * the loop holds a shared_ptr to each registered handler, and copies it
//     for the duration of a call, so a handler removed while it runs lives
//     until it returns;
//   * a handler never closes its descriptor before its destructor, so the
//     descriptor number cannot be reused by another socket under a call
//     still running;
//   * events for a removed registration are ignored (registrations have ids,
//     never reused; the descriptor number is not the key).
// Removal does not wait for a call in progress, so a handler's *sink* may
// still be in use after remove(): quiesce() is the barrier a transport passes
// before the sink it reports to is destroyed.
// Tasks posted with post() run on the loop thread between handler calls:
// the way other threads hand work that touches loop-owned state (a path's
// receive state) or that must not run under their locks (completions).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace maestro {
namespace transport {
namespace tcp {

class EventLoop {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // EPOLLIN / EPOLLOUT / EPOLLERR / EPOLLHUP bits of the descriptor.
    virtual void onEvents(uint32_t events) = 0;
  };

  // The process's loop, started on first use and stopped when the last
  // holder lets go. Must not be released on the loop thread itself.
  static std::shared_ptr<EventLoop> shared();

  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Watch `fd` for input (and output if `want_write`). Returns the
  // registration id for modify()/remove().
  uint64_t add(int fd, std::shared_ptr<Handler> handler, bool want_write);
  void modify(uint64_t id, int fd, bool want_write);
  // No new calls after this returns; a call in progress on the loop thread
  // finishes (see the lifetime rules above). Idempotent.
  void remove(uint64_t id, int fd);
  // Run `task` on the loop thread, soon.
  void post(std::function<void()> task);
  // Run `task` on the loop thread once `delay` has passed (a deadline: a
  // task must check itself whether what it guards is still there).
  void postAfter(std::chrono::milliseconds delay, std::function<void()> task);
  // Return once every handler call and task that was in progress or queued
  // when it was called has finished (no-op on the loop thread). What a
  // transport calls before its completion sink may go away.
  void quiesce();
  bool inLoopThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  // Spin on epoll_wait(0) instead of sleeping in it while at least one
  // holder asks for it (lower latency, one core busy).
  void busyPoll(bool on);
  // Registrations now watched (for tests and diagnostics).
  size_t watched() const;

 private:
  void run();
  void wake();

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: post(), busyPoll() and shutdown wake the loop
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Handler>> handlers_;
  std::deque<std::function<void()>> tasks_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> timers_;
  uint64_t next_id_ = 1;
  std::atomic<int> busy_pollers_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;
};

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
