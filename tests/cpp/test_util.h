// Helpers for the C++ tests: an in-process rendezvous store and ranks run as
// threads (Gloo's model), over real sockets.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
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
