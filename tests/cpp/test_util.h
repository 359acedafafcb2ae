// Helpers for the C++ tests: an in-process rendezvous store and ranks run as
// threads (Gloo's model), over real sockets.
#pragma once

#include <dirent.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/rendezvous.h"

namespace maestro {
namespace testing {

class MemoryRendezvous : public Rendezvous {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
  }
  std::string get(const std::string& key, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return kv_.count(key) > 0; }))
      fail("rendezvous: timed out waiting for ", key);
    return kv_[key];
  }
  bool tryGet(const std::string& key, std::string* value) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kv_.find(key);
    if (it == kv_.end()) return false;
    *value = it->second;
    return true;
  }
  void erase(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_.erase(key);
  }
  bool has(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return kv_.count(key) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

// Run fn(rank) on `size` threads; returns each rank's exception (or null).
inline std::vector<std::exception_ptr> runRanks(int size, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// maestro's long-lived threads in this process, by name: the event loop
// (maestro-io), each engine's monitor and reconnector, point to point's
// thread, ... Exact at any moment: maestro names every thread it starts
// before the start returns (startNamedThread); its transient helpers
// (maestro-connect), which a count taken while they run would include, are
// left out; and so are threads that are exiting -- a joined thread can still
// be listed for a moment after its join returned (its exit woke the joiner
// before the kernel reaped it), so its task carries PF_EXITING.
inline std::map<std::string, int> maestroThreads() {
  constexpr unsigned long kPfExiting = 0x4;
  std::map<std::string, int> named;
  DIR* dir = ::opendir("/proc/self/task");
  if (!dir) return named;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string stat;
    std::getline(in, stat);
    // "tid (name) state ppid pgrp session tty tpgid flags ..."
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;  // it ended meanwhile
    const std::string name = stat.substr(open + 1, close - open - 1);
    std::istringstream rest(stat.substr(close + 1));
    std::string field;
    unsigned long flags = 0;
    for (int i = 0; i < 6; ++i) rest >> field;
    rest >> flags;
    if (name.rfind("maestro-", 0) != 0 || name == "maestro-connect" || (flags & kPfExiting)) continue;
    ++named[name];
  }
  ::closedir(dir);
  return named;
}

inline std::string errorText(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "unknown exception";
}

inline Deadline after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace testing
}  // namespace maestro
