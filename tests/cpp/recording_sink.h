// A CompletionSink that records everything, for transport tests.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "transport/transport.h"

namespace maestro {
namespace testing {

// Records every completion; tests wait on it.
class RecordingSink : public transport::CompletionSink {
 public:
  void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) override {
    std::lock_guard<std::mutex> lock(mu);
    (ok ? completed : flushed).push_back(wr_id);
    cv.notify_all();
  }
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override {
    std::lock_guard<std::mutex> lock(mu);
    arrivals.push_back({imm, length});
    arrival_paths.insert(path);
    cv.notify_all();
  }
  void onMessage(int peer, int path, const uint8_t* data, size_t length) override {
    std::lock_guard<std::mutex> lock(mu);
    messages.emplace_back(reinterpret_cast<const char*>(data), length);
    cv.notify_all();
  }
  void onPathError(int peer, int path, const std::string& what) override {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(what);
    cv.notify_all();
  }
  void onPathUp(int peer, int path) override {
    std::lock_guard<std::mutex> lock(mu);
    ups.push_back(path);
    cv.notify_all();
  }
  template <typename Pred>
  bool waitFor(Pred pred, double seconds = 30) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_until(lock, after(seconds), [&] { return pred(); });
  }

  // The errors so far, read under the lock (a path may fail meanwhile on
  // the transport's thread).
  std::vector<std::string> errorsNow() {
    std::lock_guard<std::mutex> lock(mu);
    return errors;
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> completed, flushed;
  std::vector<std::pair<uint32_t, uint32_t>> arrivals;
  std::set<int> arrival_paths;
  std::vector<std::string> messages;
  std::vector<std::string> errors;
  std::vector<int> ups;
};

}  // namespace testing
}  // namespace maestro
