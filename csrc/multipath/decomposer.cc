#include "multipath/decomposer.h"

#include <algorithm>

#include "common/error.h"

namespace maestro {
namespace multipath {

uint64_t messageChunkSize(uint64_t message_bytes, uint64_t chunk_size) {
  MAESTRO_CHECK(chunk_size > 0, "chunk size must be positive");
  const uint64_t least = message_bytes / kMaxChunksPerMessage + (message_bytes % kMaxChunksPerMessage != 0);
  return std::max(chunk_size, least);
}

uint32_t chunkCount(uint64_t message_bytes, uint64_t chunk_size) {
  chunk_size = messageChunkSize(message_bytes, chunk_size);
  return static_cast<uint32_t>((message_bytes + chunk_size - 1) / chunk_size);
}

ChunkSpan chunkAt(uint64_t message_bytes, uint64_t chunk_size, uint32_t index) {
  chunk_size = messageChunkSize(message_bytes, chunk_size);
  ChunkSpan c;
  c.index = index;
  c.offset = static_cast<uint64_t>(index) * chunk_size;
  c.length = c.offset >= message_bytes ? 0 : std::min<uint64_t>(chunk_size, message_bytes - c.offset);
  return c;
}

std::vector<ChunkSpan> decompose(uint64_t message_bytes, uint64_t chunk_size) {
  uint32_t n = chunkCount(message_bytes, chunk_size);
  std::vector<ChunkSpan> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(chunkAt(message_bytes, chunk_size, i));
  return out;
}

}  // namespace multipath
}  // namespace maestro
