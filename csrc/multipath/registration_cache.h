// Memory registration cache (paper §5.1): a tensor's memory is registered on
// first use and the registration is reused on later iterations (DDP reuses
// its gradient buckets), because registering is expensive on RDMA.
//
// Entries are keyed by an owner (the tensor's storage) and hold an `alive`
// probe for it: an entry whose owner died, or whose owner now has other
// memory, is deregistered and never returned -- the cache never hands out a
// registration of freed memory. Dead entries are dropped on every acquire,
// so freed memory does not stay registered until the cache fills. Entries in
// use by a running operation are pinned and never evicted; the rest are
// bounded by `capacity` entries and `max_bytes` bytes (on verbs registered
// memory is pinned), least recently used first. A registration that fails
// (verbs: RLIMIT_MEMLOCK reached) is tried once more after every idle entry
// is dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <list>
#include <mutex>
#include <unordered_map>

#include "transport/memory.h"

namespace maestro {
namespace multipath {

class RegistrationCache {
 public:
  using Alive = std::function<bool()>;  // false once the owner's memory is gone

  RegistrationCache(transport::Memory* memory, size_t capacity,
                    size_t max_bytes = std::numeric_limits<size_t>::max());
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A registration covering [addr, addr+length), pinned until unpin(owner).
  Region acquire(const void* owner, void* addr, size_t length, Alive alive);
  void unpin(const void* owner);
  // Drop every entry whose owner died.
  void sweep();

  size_t size() const;
  size_t bytes() const;  // covered by the entries, in use or not
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    void* addr = nullptr;
    size_t length = 0;
    Alive alive;
    Region region;
    int pins = 0;
    std::list<const void*>::iterator lru;
  };
  void evict(std::unordered_map<const void*, Entry>::iterator it);  // mu_ held
  size_t evictIdle(bool only_dead);  // mu_ held; entries no operation uses (only_dead: whose owner died)
  void trim(size_t room = 0);  // mu_ held; evict idle entries until `room` more bytes fit

  transport::Memory* const memory_;
  const size_t capacity_;
  const size_t max_bytes_;
  size_t bytes_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<const void*, Entry> entries_;
  std::list<const void*> lru_;  // front = most recently used
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace multipath
}  // namespace maestro
