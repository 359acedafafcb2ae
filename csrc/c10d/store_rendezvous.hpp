// The engine's rendezvous (common/rendezvous.h) through the c10d store the
// process group was given (already prefixed per group).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/rendezvous.h"

namespace maestro {
namespace c10d_glue {

class StoreRendezvous : public Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const c10::DistNetworkError& e) {
      lost(key, e.what());
    }
  }
  std::string get(const std::string& key, Deadline deadline) override {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) fail("timed out waiting for '", key, "' in the store (did every rank start?)");
      try {
        store_->wait({key}, std::min(left, std::chrono::milliseconds(5000)));
        auto v = store_->get(key);
        return std::string(v.begin(), v.end());
      } catch (const c10::DistNetworkError& e) {
        lost(key, e.what());
      } catch (const c10::DistStoreError&) {
        // The store's own timeout slice passed; loop to our deadline.
      }
    }
  }
  void erase(const std::string& key) override {
    try {
      store_->deleteKey(key);
    } catch (const c10::Error&) {  // a store that cannot delete: blank the value
      Rendezvous::erase(key);
    }
  }
  bool tryGet(const std::string& key, std::string* value) override {
    try {
      if (!store_->check({key})) return false;
      auto v = store_->get(key);
      value->assign(v.begin(), v.end());
      return true;
    } catch (const c10::DistNetworkError& e) {
      lost(key, e.what());
    }
  }

 private:
  [[noreturn]] static void lost(const std::string& key, const std::string& what) {
    fail("lost the rendezvous store at '", key, "' (the rank hosting it, usually rank 0, exited -- look for its "
         "error): ", what.substr(0, what.find('\n')));
  }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace c10d_glue
}  // namespace maestro
