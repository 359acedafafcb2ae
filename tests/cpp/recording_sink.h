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
#include "transport/completion_sink.h"

namespace maestro {
namespace testing {

// Records every completion; tests wait on it. The transport's threads keep
// appending while a test reads, so the record is reachable only under the
// lock: waitFor() hands it to the predicate, now() returns a copy.
class RecordingSink : public transport::CompletionSink {
 public:
  struct Record {
    std::vector<uint64_t> completed, flushed, withdrawn;
    std::vector<std::pair<uint32_t, uint32_t>> arrivals;  // (immediate, length)
    std::set<int> arrival_paths;
    std::vector<std::string> messages;
    std::vector<std::string> errors;
    std::vector<int> ups;
    // onPathFenced: (mark, errors and flushed writes recorded before it)
    struct Fence {
      uint64_t mark;
      size_t errors_before, flushed_before;
    };
    std::vector<Fence> fences;
  };

  void onWriteComplete(int peer, int path, uint64_t wr_id, bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    (ok ? r_.completed : r_.flushed).push_back(wr_id);
    cv_.notify_all();
  }
  void onWriteWithdrawn(int peer, int path, uint64_t wr_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    r_.withdrawn.push_back(wr_id);
    cv_.notify_all();
  }
  void onWriteArrived(int peer, int path, uint32_t imm, uint32_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    r_.arrivals.push_back({imm, length});
    r_.arrival_paths.insert(path);
    cv_.notify_all();
  }
  void onMessage(int peer, int path, const uint8_t* data, size_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    r_.messages.emplace_back(reinterpret_cast<const char*>(data), length);
    cv_.notify_all();
  }
  void onPathError(int peer, int path, const std::string& what) override {
    std::lock_guard<std::mutex> lock(mu_);
    r_.errors.push_back(what);
    cv_.notify_all();
  }
  void onPathFenced(int peer, int path, uint64_t mark) override {
    std::lock_guard<std::mutex> lock(mu_);
    r_.fences.push_back({mark, r_.errors.size(), r_.flushed.size()});
    cv_.notify_all();
  }
  void onPathUp(int peer, int path) override {
    std::lock_guard<std::mutex> lock(mu_);
    r_.ups.push_back(path);
    cv_.notify_all();
  }

  // Waits until pred(record) holds; false after `seconds`.
  template <typename Pred>
  bool waitFor(Pred pred, double seconds = 30) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, after(seconds), [&] { return pred(static_cast<const Record&>(r_)); });
  }

  // A copy of the record so far.
  Record now() {
    std::lock_guard<std::mutex> lock(mu_);
    return r_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Record r_;
};

}  // namespace testing
}  // namespace maestro
