// Memory, the first part of the transport contract (transport.h): a region
// is registered first (-> Region: id, key); a peer that learned its
// RemoteRegion may write into it one-sidedly at any offset that stays inside
// it, presenting the key, while the region is exposed.
//
// The layers that only register memory (the registration cache, the c10d
// staging pool) hold a Memory, not a whole transport.
#pragma once

#include <cstddef>
#include <cstdint>

namespace maestro {

// A registered local memory region.
struct Region {
  uint32_t id = 0;      // transport-local handle (TCP region table id)
  uint64_t key = 0;     // remote key: what a peer must present to write (rkey)
  uint32_t lkey = 0;    // local key (verbs) / unused (tcp)
  void* addr = nullptr;
  size_t length = 0;
  bool valid() const { return id != 0; }
};

// What a peer needs to write into one of our regions.
struct RemoteRegion {
  uint32_t id = 0;
  uint64_t key = 0;
  uint64_t addr = 0;    // base virtual address (verbs needs it; tcp ignores it)
  uint64_t length = 0;
};

inline RemoteRegion toRemote(const Region& r) {
  return RemoteRegion{r.id, r.key, reinterpret_cast<uint64_t>(r.addr), r.length};
}

namespace transport {

class Memory {
 public:
  virtual ~Memory() = default;
  virtual Region registerMemory(void* addr, size_t length) = 0;
  virtual void deregisterMemory(const Region& region) = 0;
  // Remote writes are accepted into a region only while it is exposed
  // (expose/conceal nest). expose() returns the key peers must present for
  // this exposure: the TCP transport draws a fresh one each time the region
  // goes from concealed to exposed, so a late duplicate of a write meant for
  // an earlier operation is recognised and dropped instead of landing in the
  // buffer of the next one. A transport whose hardware checks keys on its own
  // (verbs without memory windows) may return the region's key and treat
  // these as no-ops. conceal() returns only when no remote write into the
  // region is in progress.
  virtual uint64_t expose(const Region& region) = 0;
  virtual void conceal(const Region& region) = 0;
};

}  // namespace transport
}  // namespace maestro
