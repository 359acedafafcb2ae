#include "multipath/decomposer.h"

#include <algorithm>

#include "common/error.h"

namespace maestro {
namespace multipath {

Chunking cutWith(const Chunking& chunking, Cut cut) {
  if (cut == Cut::kDefault || chunking.min_chunk >= chunking.chunk_size) return chunking;
  return Chunking(chunking.min_chunk, chunking.min_chunk, chunking.spread);
}

uint64_t messageChunkSize(uint64_t message_bytes, const Chunking& chunking) {
  MAESTRO_CHECK(chunking.chunk_size > 0 && chunking.spread > 0, "chunk size and spread must be positive");
  uint64_t size = chunking.chunk_size;
  if (chunking.min_chunk < chunking.chunk_size && message_bytes < chunking.spread * chunking.chunk_size) {
    // Rounded up to 64 bytes (the chunk size's unit): a coarser unit would
    // leave a path out (8 paths, 4 KiB: a 129 KiB message in 7 chunks).
    constexpr uint64_t kAlign = 64;
    const uint64_t share = (message_bytes + chunking.spread - 1) / chunking.spread;
    size = std::min(chunking.chunk_size, std::max(chunking.min_chunk, (share + kAlign - 1) / kAlign * kAlign));
  }
  const uint64_t least = message_bytes / kMaxChunksPerMessage + (message_bytes % kMaxChunksPerMessage != 0);
  return std::max(size, least);
}

uint32_t chunkCount(uint64_t message_bytes, const Chunking& chunking) {
  const uint64_t size = messageChunkSize(message_bytes, chunking);
  return static_cast<uint32_t>((message_bytes + size - 1) / size);
}

ChunkSpan chunkAt(uint64_t message_bytes, const Chunking& chunking, uint32_t index) {
  const uint64_t size = messageChunkSize(message_bytes, chunking);
  ChunkSpan c;
  c.index = index;
  c.offset = static_cast<uint64_t>(index) * size;
  c.length = c.offset >= message_bytes ? 0 : std::min<uint64_t>(size, message_bytes - c.offset);
  return c;
}

std::vector<ChunkSpan> decompose(uint64_t message_bytes, const Chunking& chunking) {
  const uint32_t n = chunkCount(message_bytes, chunking);
  std::vector<ChunkSpan> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(chunkAt(message_bytes, chunking, i));
  return out;
}

}  // namespace multipath
}  // namespace maestro
