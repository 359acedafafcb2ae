// How a collective cuts its buffer: n blocks (one per rank), each block into
// G pipeline segments. A segment is one message (decomposed into chunks by
// the multipath engine); both sides of every message derive the same cut
// from the operation descriptor, so no sizes travel on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace maestro {
namespace collectives {

struct Span {
  uint64_t offset = 0;  // bytes
  uint64_t bytes = 0;
};

// count elements of elem bytes over n blocks; the first count % n blocks get
// one more element.
std::vector<Span> balancedBlocks(uint64_t count, size_t elem, int n);
// The order in which rank `rank` of a ring allreduce over n ranks first
// needs the bytes of its tensor (count elements of `elem` bytes): its
// reduce-scatter sends block r at step 0 and reduces into block r-1-s at
// step s, so blocks r, r-1, ..., r+1. Each block is cut into pieces of at
// most piece_bytes (whole elements): the order to stage a tensor in.
std::vector<Span> allreduceStagingOrder(uint64_t count, size_t elem, int rank, int n, uint64_t piece_bytes);
// n consecutive blocks of `bytes` each.
std::vector<Span> equalBlocks(uint64_t bytes, int n);

struct Segmentation {
  uint32_t per_block = 0;      // G: segments per block (some may be empty)
  uint64_t segment_bytes = 0;  // every segment but a block's last
};

// The longest of the blocks, in bytes.
uint64_t largestBlock(const std::vector<Span>& blocks);
// G segments of about target_bytes, at most max_segments per block. Segment
// sizes are multiples of 64 bytes (of every element size), so segments and
// the chunks inside them always hold whole elements.
Segmentation segmentBlocks(const std::vector<Span>& blocks, uint64_t target_bytes, uint32_t max_segments);
// The segment a ring cuts its blocks into: segment_size, except where the
// ring crosses hosts and a block is at most one smallest chunk per path
// (min_chunk, the decomposer's floor: a 1 MiB allreduce over 4 ranks and 4
// paths). Such a ring step goes as one message of one chunk per path, and
// the next step leaves only once its last chunk has landed; cut into
// min_chunk segments, each chunk is forwarded as it lands. Ranks of one host
// keep whole messages, as the decomposer does. Every rank of a group derives
// the same answer (knobs, paths and hosts are the group's).
uint64_t ringSegmentBytes(uint64_t largest_block, uint64_t segment_size, uint64_t chunk_size, uint64_t min_chunk,
                          int paths, bool spans_hosts);
// Segment g of a block (bytes may be 0).
Span segmentOf(const Span& block, const Segmentation& seg, uint32_t g);

}  // namespace collectives
}  // namespace maestro
