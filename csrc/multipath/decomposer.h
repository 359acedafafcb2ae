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
// twice. Both sides hold the same Chunking (group-wide knobs and the path
// count) and know the message's length, so the receiver derives a chunk's
// offset and length from its index.
//
// A message is cut into chunks of chunk_size, except:
//  - one shorter than `spread` (the paths per peer) such chunks is cut into
//    `spread` equal chunks (rounded up to 64 bytes) of at least min_chunk
//    bytes, so a mid-size message still reaches every path: with 256 KiB
//    chunks a 1 MiB allreduce on 4 ranks would send each ring step as one
//    chunk, on one path;
//  - one too long for kMaxChunksPerMessage chunks of chunk_size is cut into
//    that many larger chunks;
//  - one sent with Cut::kFine is cut as if chunk_size were min_chunk: its
//    last chunks then leave every path at about the same time, where whole
//    chunks would leave one path a chunk behind the others (the exchange's
//    blocks, collectives/tuner.h). A chunking without a smaller chunk (one
//    host, verbs) cuts it as usual. Sender and receiver pass the same Cut.
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

struct Chunking {
  uint64_t chunk_size = 0;  // the chunk of a long message
  uint64_t min_chunk = 0;   // the smallest chunk a mid-size message is cut into (>= chunk_size: never)
  uint32_t spread = 1;      // chunks a message is cut into at least, where min_chunk allows
  Chunking() = default;
  Chunking(uint64_t chunk_size) : chunk_size(chunk_size), min_chunk(chunk_size) {}  // NOLINT: plain chunk_size
  Chunking(uint64_t chunk_size, uint64_t min_chunk, uint32_t spread)
      : chunk_size(chunk_size), min_chunk(min_chunk), spread(spread) {}
};

// How a message is cut (see above).
enum class Cut {
  kDefault,  // chunks of chunk_size
  kFine,     // chunks of min_chunk
};
// The chunking a message sent with `cut` is cut with.
Chunking cutWith(const Chunking& chunking, Cut cut);

struct ChunkSpan {
  uint32_t index = 0;
  uint64_t offset = 0;  // within the message
  uint64_t length = 0;
};

// The chunk size a message is cut with (see above).
uint64_t messageChunkSize(uint64_t message_bytes, const Chunking& chunking);
// Number of chunks of a message (0 for an empty message).
uint32_t chunkCount(uint64_t message_bytes, const Chunking& chunking);
// The index-th chunk of a message.
ChunkSpan chunkAt(uint64_t message_bytes, const Chunking& chunking, uint32_t index);
// All chunks, in order.
std::vector<ChunkSpan> decompose(uint64_t message_bytes, const Chunking& chunking);

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
