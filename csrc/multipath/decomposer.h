// Decomposer (paper §4.2): a message is cut into chunks of chunk_size bytes
// (the last one shorter); each chunk becomes one one-sided write on some path
// and carries its identity in the 32-bit immediate:
//
//     imm = channel (4 bits) << 28 | tag (13 bits) << 15 | chunk index (15 bits)
//
// The channel names the process group among those that share the paths
// (multipath/channel_mux.h); the engine of a group never sees it.
// The tag names the message among those in flight between two ranks (the
// collectives derive it from the operation and the step; point-to-point
// messages use tags the receiver hands out), the chunk index
// lets the receiver count each chunk exactly once even if a failover sends it
// twice. Both sides know chunk_size (a group-wide knob) and the message's
// length, so the receiver derives a chunk's offset and length from its index.
// A message too long for kMaxChunksPerMessage chunks of chunk_size is cut
// into that many larger chunks (messageChunkSize) instead.
#pragma once

#include <cstdint>
#include <vector>

namespace maestro {
namespace multipath {

constexpr int kChannelBits = 4;
constexpr int kTagBits = 13;
constexpr int kChunkBits = 15;
static_assert(kChannelBits + kTagBits + kChunkBits == 32, "the immediate is 32 bits");
constexpr int kChannelShift = kTagBits + kChunkBits;
constexpr uint32_t kMaxChannels = 1u << kChannelBits;
constexpr uint32_t kMaxTags = 1u << kTagBits;
constexpr uint32_t kMaxChunksPerMessage = 1u << kChunkBits;
// A tag's top bits are the epoch of its operation (seq mod 4), the rest the
// message's index within the operation.
constexpr int kEpochShift = 10;
// Tags below kP2PTagBase belong to collective operations (epoch in bits
// 10-11). The kP2PTags above it carry point-to-point messages, which run
// beside the collectives and outlive operations: the receiver hands them out
// (one per message piece) and takes one back only when the sender confirms
// its writes on it are over, so no epoch is needed to tell uses apart.
constexpr uint32_t kP2PTagBase = 1u << 12;
constexpr uint32_t kP2PTags = 1024;
constexpr uint32_t kUsedTags = kP2PTagBase + kP2PTags;  // tags in use (< kMaxTags)
static_assert(kUsedTags <= kMaxTags, "point-to-point tags must fit the immediate");
inline bool isP2PTag(uint32_t tag) { return tag >= kP2PTagBase && tag < kUsedTags; }

struct ChunkSpan {
  uint32_t index = 0;
  uint64_t offset = 0;  // within the message
  uint64_t length = 0;
};

// The chunk size a message is cut with: chunk_size, or larger where the
// message would need more than kMaxChunksPerMessage chunks.
uint64_t messageChunkSize(uint64_t message_bytes, uint64_t chunk_size);
// Number of chunks of a message (0 for an empty message).
uint32_t chunkCount(uint64_t message_bytes, uint64_t chunk_size);
// The index-th chunk of a message.
ChunkSpan chunkAt(uint64_t message_bytes, uint64_t chunk_size, uint32_t index);
// All chunks, in order.
std::vector<ChunkSpan> decompose(uint64_t message_bytes, uint64_t chunk_size);

// The immediate of a chunk, without its channel (the channel's transport
// adds it on the way out and the mux strips it on the way in).
inline uint32_t encodeImm(uint32_t tag, uint32_t chunk) { return (tag << kChunkBits) | chunk; }
inline uint32_t immTag(uint32_t imm) { return (imm >> kChunkBits) & (kMaxTags - 1); }
inline uint32_t immChunk(uint32_t imm) { return imm & (kMaxChunksPerMessage - 1); }
inline uint32_t immChannel(uint32_t imm) { return imm >> kChannelShift; }
inline uint32_t withChannel(uint32_t imm, uint32_t channel) {
  return (imm & ((1u << kChannelShift) - 1)) | (channel << kChannelShift);
}

}  // namespace multipath
}  // namespace maestro
