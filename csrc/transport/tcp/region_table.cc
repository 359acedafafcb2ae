#include "transport/tcp/region_table.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/random.h"

namespace maestro {
namespace transport {
namespace tcp {

Region RegionTable::add(void* addr, size_t length) {
  MAESTRO_CHECK(addr != nullptr || length == 0, "cannot register a null buffer");
  auto entry = std::make_shared<Entry>();
  entry->addr = static_cast<uint8_t*>(addr);
  entry->length = length;
  entry->key = randomU64() | 1;  // never 0
  std::lock_guard<std::mutex> lock(mu_);
  MAESTRO_CHECK(next_id_ != 0, "region ids exhausted");
  uint32_t id = next_id_++;  // ids are never reused: a stale id can only miss
  entries_[id] = entry;
  Region r;
  r.id = id;
  r.key = entry->key;
  r.addr = addr;
  r.length = length;
  return r;
}

void RegionTable::waitForWriters(const Entry& entry, uint32_t id) {
  // A write in progress usually finishes within one payload receive: give
  // it a moment. A moment of time, not a count of yields: on a busy host
  // each yield can hand the core away for a whole time slice, and a thousand
  // of them took seconds.
  const auto until = std::chrono::steady_clock::now() + kWriterGrace;
  while (entry.writers.load() > 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  if (entry.writers.load() == 0) return;
  // Not finishing: the sender stopped in the middle of the payload. Nobody
  // needs the rest (the region is being closed to the peers), so the path
  // lets go of it rather than wait for a peer that may never go on.
  if (revoke_) revoke_(id);
  while (entry.writers.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void RegionTable::remove(uint32_t id) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    entry = it->second;
    entries_.erase(it);
    std::vector<uint64_t> keys = entry->old_keys;
    keys.push_back(entry->key);
    removed_.emplace_back(id, std::move(keys));
    if (removed_.size() > kRememberedRemovals) removed_.pop_front();
  }
  entry->exposed.store(0);
  waitForWriters(*entry, id);
}

uint64_t RegionTable::expose(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  MAESTRO_CHECK(it != entries_.end(), "expose: region ", id, " is not registered");
  Entry& e = *it->second;
  if (e.exposed.load() == 0) {
    // A fresh key per exposure; remember a few old ones to recognise stale
    // duplicates of earlier operations' writes.
    e.old_keys.push_back(e.key);
    if (e.old_keys.size() > kRememberedKeys) e.old_keys.erase(e.old_keys.begin());
    e.key = randomU64() | 1;
  }
  e.exposed.fetch_add(1);
  return e.key;
}

void RegionTable::conceal(uint32_t id) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    entry = it->second;
  }
  if (entry->exposed.fetch_sub(1) == 1) waitForWriters(*entry, id);
}

RegionTable::Verdict RegionTable::grantWrite(uint32_t id, uint64_t key, uint64_t offset, uint64_t length,
                                             Grant* grant, std::string* why) {
  std::shared_ptr<Entry> entry;
  bool key_ok = false, stale = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it != entries_.end()) {
      entry = it->second;
      key_ok = entry->key == key;
      for (uint64_t k : entry->old_keys) stale = stale || k == key;
    }
  }
  if (!entry) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (removedWithKey(id, key)) return Verdict::kStale;
    }
    *why = strcat("write into unknown region ", id);
    return Verdict::kRejected;
  }
  // Overflow-safe bounds check: length <= size and offset <= size - length.
  if (length > entry->length || offset > entry->length - length) {
    *why = strcat("write of ", length, " bytes at offset ", offset, " overruns region ", id, " (", entry->length,
                  " bytes)");
    return Verdict::kRejected;
  }
  if (!key_ok) {
    if (stale) return Verdict::kStale;
    *why = strcat("write into region ", id, " with a wrong key");
    return Verdict::kRejected;
  }
  // Count ourselves as a writer *before* checking exposure: conceal() clears
  // exposure first and then waits for writers, so one of the two sees the
  // other (sequentially consistent atomics).
  entry->writers.fetch_add(1);
  if (entry->exposed.load() <= 0) {
    entry->writers.fetch_sub(1);
    // Concealed after its last exposure: a late duplicate, not an attack on
    // memory (the key was valid for this region).
    return Verdict::kStale;
  }
  *grant = Grant(entry, entry->addr + offset);
  return Verdict::kGranted;
}

bool RegionTable::removedWithKey(uint32_t id, uint64_t key) const {
  for (auto it = removed_.rbegin(); it != removed_.rend(); ++it)
    if (it->first == id) return std::find(it->second.begin(), it->second.end(), key) != it->second.end();
  return false;
}

size_t RegionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
