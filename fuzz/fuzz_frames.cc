// libFuzzer target: a byte stream from a TCP peer, as a path's receiver
// reads it -- frame headers checked by checkHeader(), WRITEs checked against
// a region table and landed with their full length (so AddressSanitizer sees
// any write a bounds check let through; a write by reference lands as many
// bytes, copied from the peer), SENDs, OFFERs and payloads skipped.
//
// The regions are exact-size heap allocations. A real key is 64 random bits
// the fuzzer cannot guess: a header whose key is 0x6b6579 ("key") is given
// the region's real key, so the granted path is reached too. The first input
// byte chooses which regions are exposed.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"

using maestro::transport::tcp::checkHeader;
using maestro::transport::tcp::FrameHeader;
using maestro::transport::tcp::FrameType;
using maestro::transport::tcp::RegionTable;

namespace {

constexpr uint64_t kUseRealKey = 0x6b6579;
constexpr size_t kSizes[] = {1, 64, 4096, 65536};

struct Table {
  RegionTable table;
  std::vector<std::unique_ptr<uint8_t[]>> memory;
  std::vector<maestro::Region> regions;
  std::vector<uint64_t> keys;
  std::vector<bool> exposed;
  Table() {
    for (size_t n : kSizes) {
      memory.emplace_back(new uint8_t[n]);
      regions.push_back(table.add(memory.back().get(), n));
      keys.push_back(0);
      exposed.push_back(false);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Table* t = new Table();
  if (size == 0) return 0;
  for (size_t i = 0; i < t->regions.size(); ++i) {
    const bool want = (data[0] >> i) & 1;
    if (want && !t->exposed[i]) t->keys[i] = t->table.expose(t->regions[i].id);
    if (!want && t->exposed[i]) t->table.conceal(t->regions[i].id);
    t->exposed[i] = want;
  }
  size_t at = 1;
  while (size - at >= sizeof(FrameHeader)) {
    FrameHeader h;
    std::memcpy(&h, data + at, sizeof h);
    at += sizeof h;
    if (!checkHeader(h).empty()) return 0;  // the path fails here
    const bool by_reference = h.type == static_cast<uint8_t>(FrameType::kWrite) &&
                              (h.flags & maestro::transport::tcp::kFlagByReference);
    // A write by reference carries the payload's address, not the payload.
    const size_t payload = static_cast<size_t>(std::min<uint64_t>(by_reference ? 8 : h.length, size - at));
    if (h.type == static_cast<uint8_t>(FrameType::kWrite)) {
      if (h.key == kUseRealKey)
        for (size_t i = 0; i < t->regions.size(); ++i)
          if (t->regions[i].id == h.region) h.key = t->keys[i];
      RegionTable::Grant grant;
      std::string why;
      auto verdict = t->table.grantWrite(h.region, h.key, h.offset, h.length, &grant, &why);
      if (verdict == RegionTable::Verdict::kRejected) return 0;  // the path fails here
      if (verdict == RegionTable::Verdict::kGranted) {
        std::memset(grant.dst(), 0xA5, h.length);  // every byte the frame may land
        if (!by_reference) std::memcpy(grant.dst(), data + at, payload);
      }
    }
    at += payload;
  }
  return 0;
}
