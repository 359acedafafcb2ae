#include "collectives/plan.h"

#include <algorithm>

#include "common/error.h"

namespace maestro {
namespace collectives {

std::vector<Span> balancedBlocks(uint64_t count, size_t elem, int n) {
  std::vector<Span> out(n);
  uint64_t base = count / n, extra = count % n, at = 0;
  for (int i = 0; i < n; ++i) {
    uint64_t elems = base + (static_cast<uint64_t>(i) < extra ? 1 : 0);
    out[i] = {at * elem, elems * elem};
    at += elems;
  }
  return out;
}

std::vector<Span> allreduceStagingOrder(uint64_t count, size_t elem, int rank, int n, uint64_t piece_bytes) {
  MAESTRO_CHECK(n >= 1 && rank >= 0 && rank < n && elem > 0, "bad staging order parameters");
  const uint64_t piece = std::max<uint64_t>(elem, piece_bytes / elem * elem);
  const std::vector<Span> blocks = balancedBlocks(count, elem, n);
  std::vector<Span> out;
  for (int s = 0; s < n; ++s) {
    const Span& b = blocks[((rank - s) % n + n) % n];
    for (uint64_t at = 0; at < b.bytes; at += piece) out.push_back({b.offset + at, std::min(piece, b.bytes - at)});
  }
  return out;
}

std::vector<Span> equalBlocks(uint64_t bytes, int n) {
  std::vector<Span> out(n);
  for (int i = 0; i < n; ++i) out[i] = {static_cast<uint64_t>(i) * bytes, bytes};
  return out;
}

uint64_t largestBlock(const std::vector<Span>& blocks) {
  uint64_t largest = 0;
  for (const auto& b : blocks) largest = std::max(largest, b.bytes);
  return largest;
}

Segmentation segmentBlocks(const std::vector<Span>& blocks, uint64_t target_bytes, uint32_t max_segments) {
  MAESTRO_CHECK(max_segments >= 1 && target_bytes >= 64, "bad segmentation parameters");
  const uint64_t largest = largestBlock(blocks);
  Segmentation s;
  if (largest == 0) {
    s.per_block = 0;
    s.segment_bytes = target_bytes;
    return s;
  }
  uint64_t g = std::min<uint64_t>((largest + target_bytes - 1) / target_bytes, max_segments);
  uint64_t seg = (largest + g - 1) / g;
  seg = (seg + 63) / 64 * 64;
  s.segment_bytes = seg;
  s.per_block = static_cast<uint32_t>((largest + seg - 1) / seg);
  return s;
}

uint64_t ringSegmentBytes(uint64_t largest_block, uint64_t segment_size, uint64_t chunk_size, uint64_t min_chunk,
                          int paths, bool spans_hosts) {
  const bool cuts = spans_hosts && paths > 1 && min_chunk >= 64 && min_chunk < chunk_size;
  if (cuts && largest_block > min_chunk && largest_block <= static_cast<uint64_t>(paths) * min_chunk)
    return std::min(min_chunk, segment_size);
  return segment_size;
}

Span segmentOf(const Span& block, const Segmentation& seg, uint32_t g) {
  uint64_t start = static_cast<uint64_t>(g) * seg.segment_bytes;
  if (start >= block.bytes) return {block.offset + block.bytes, 0};
  return {block.offset + start, std::min(seg.segment_bytes, block.bytes - start)};
}

}  // namespace collectives
}  // namespace maestro
