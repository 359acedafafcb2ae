#include "multipath/registration_cache.h"

#include <vector>

#include "common/error.h"

namespace maestro {
namespace multipath {

RegistrationCache::RegistrationCache(transport::Memory* memory, size_t capacity, size_t max_bytes)
    : memory_(memory), capacity_(capacity), max_bytes_(max_bytes) {}

RegistrationCache::~RegistrationCache() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!entries_.empty()) evict(entries_.begin());
}

void RegistrationCache::evict(std::unordered_map<const void*, Entry>::iterator it) {
  memory_->deregisterMemory(it->second.region);
  bytes_ -= it->second.length;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  ++evictions_;
}

size_t RegistrationCache::evictIdle(bool only_dead) {
  std::vector<const void*> idle;
  for (auto& kv : entries_)
    if (kv.second.pins == 0 && (!only_dead || !kv.second.alive())) idle.push_back(kv.first);
  for (const void* owner : idle) evict(entries_.find(owner));
  return idle.size();
}

void RegistrationCache::trim(size_t room) {
  evictIdle(true);
  auto over = [&] {
    return entries_.size() + (room > 0 ? 1 : 0) > capacity_ || bytes_ > max_bytes_ || room > max_bytes_ - bytes_;
  };
  std::vector<const void*> oldest_first(lru_.rbegin(), lru_.rend());
  for (const void* owner : oldest_first) {
    if (!over()) break;
    auto it = entries_.find(owner);
    if (it->second.pins == 0) evict(it);
  }
}

Region RegistrationCache::acquire(const void* owner, void* addr, size_t length, Alive alive) {
  std::lock_guard<std::mutex> lock(mu_);
  // Registrations of tensors that died since go now, not when the cache is
  // full: their memory must not stay pinned (verbs) or reachable by a key a
  // peer once learned. At most `capacity` cheap liveness checks.
  evictIdle(true);
  auto it = entries_.find(owner);
  if (it != entries_.end()) {
    Entry& e = it->second;
    if (e.addr == addr && e.length == length && e.alive()) {
      ++hits_;
      ++e.pins;
      lru_.splice(lru_.begin(), lru_, e.lru);
      return e.region;
    }
    // The owner died or changed its memory (resize, set_): a stale entry.
    MAESTRO_CHECK(e.pins == 0, "registration of a buffer changed while an operation uses it");
    evict(it);
  }
  ++misses_;
  Entry e;
  e.addr = addr;
  e.length = length;
  e.alive = std::move(alive);
  trim(length);  // make room first: on verbs the new registration needs pinnable memory
  try {
    e.region = memory_->registerMemory(addr, length);
  } catch (const Error&) {
    // Out of pinnable memory (RLIMIT_MEMLOCK) or registrations: what no
    // operation uses goes, and the registration is tried once more.
    if (evictIdle(false) == 0) throw;
    e.region = memory_->registerMemory(addr, length);
  }
  bytes_ += length;
  e.pins = 1;
  lru_.push_front(owner);
  e.lru = lru_.begin();
  Region r = e.region;
  entries_.emplace(owner, std::move(e));
  return r;
}

void RegistrationCache::unpin(const void* owner) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(owner);
  if (it != entries_.end() && it->second.pins > 0) --it->second.pins;
  if (entries_.size() > capacity_ || bytes_ > max_bytes_) trim();
}

void RegistrationCache::sweep() {
  std::lock_guard<std::mutex> lock(mu_);
  evictIdle(true);
}

size_t RegistrationCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t RegistrationCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace multipath
}  // namespace maestro
