// The receiver's registered regions, the target of every one-sided write
// that arrives from the wire.
//
// A write is granted only when the region exists, the key matches, the
// region is currently exposed, and [offset, offset+length) lies inside it.
// Each exposure of a region draws a fresh key; a write that presents one of
// the region's recent keys is "stale" (a late duplicate meant for an earlier
// operation): it is drained and acknowledged, never written. So is a write
// into a region removed a short while ago that presents one of its keys: a
// chunk re-sent after a path closed, for an operation that had completed on
// this side with the first copy (its tensor since freed).
// A grant pins the region's "writers" count until the payload is in place, so
// conceal()/remove() can wait for in-progress writes: once they return, no
// byte from the wire reaches that memory again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/transport.h"

namespace maestro {
namespace transport {
namespace tcp {

class RegionTable {
 public:
  struct Entry {
    uint8_t* addr = nullptr;
    uint64_t length = 0;
    uint64_t key = 0;                  // current key (guarded by the table's mutex)
    std::vector<uint64_t> old_keys;    // keys of recent exposures
    std::atomic<int> exposed{0};
    std::atomic<int> writers{0};
  };

  class Grant {
   public:
    Grant() = default;
    explicit Grant(std::shared_ptr<Entry> entry, uint8_t* dst) : entry_(std::move(entry)), dst_(dst) {}
    Grant(Grant&& other) noexcept : entry_(std::move(other.entry_)), dst_(other.dst_) {}
    Grant& operator=(Grant&& other) noexcept {
      release();
      entry_ = std::move(other.entry_);
      dst_ = other.dst_;
      return *this;
    }
    Grant(const Grant&) = delete;
    ~Grant() { release(); }
    explicit operator bool() const { return entry_ != nullptr; }
    uint8_t* dst() const { return dst_; }
    void release() {
      if (entry_) entry_->writers.fetch_sub(1);
      entry_.reset();
    }

   private:
    std::shared_ptr<Entry> entry_;
    uint8_t* dst_ = nullptr;
  };

  enum class Verdict { kGranted, kStale, kRejected };

  Region add(void* addr, size_t length);
  void remove(uint32_t id);
  uint64_t expose(uint32_t id);  // returns the key of this exposure
  void conceal(uint32_t id);
  // Checks a write from the wire. kGranted: *grant holds the destination;
  // kStale: drop the payload; kRejected: *why says what was wrong.
  Verdict grantWrite(uint32_t id, uint64_t key, uint64_t offset, uint64_t length, Grant* grant, std::string* why);
  size_t size() const;
  // Called with a region's id when remove()/conceal() finds a write still
  // landing in it after a short wait: its sender stopped in the middle of
  // the payload (a frozen peer). The revoker makes the receiving path drop
  // its grant (the rest of that payload is drained, not written); set once,
  // before the table is used.
  void setRevoker(std::function<void(uint32_t id)> revoke) { revoke_ = std::move(revoke); }

 private:
  void waitForWriters(const Entry& entry, uint32_t id);
  // How long conceal()/remove() let a write in progress finish before they
  // take its grant away (the rest of its payload is then drained).
  static constexpr std::chrono::microseconds kWriterGrace{1000};
  static constexpr size_t kRememberedKeys = 8;
  static constexpr size_t kRememberedRemovals = 256;
  bool removedWithKey(uint32_t id, uint64_t key) const;  // under mu_

  mutable std::mutex mu_;
  std::unordered_map<uint32_t, std::shared_ptr<Entry>> entries_;
  uint32_t next_id_ = 1;
  // The keys of the last regions removed, newest last (ids are never reused).
  std::deque<std::pair<uint32_t, std::vector<uint64_t>>> removed_;
  std::function<void(uint32_t)> revoke_;
};

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
