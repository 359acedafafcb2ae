// Decomposer: the chunks of a message cover it exactly once, in order, for
// many message sizes, chunk sizes and path counts; round robin spreads them
// evenly over the paths; a mid-size message is cut into one chunk per path.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"
#include "multipath/decomposer.h"
#include "multipath/scheduler.h"

namespace maestro {
namespace multipath {
namespace {

TEST(Decomposer, ChunksCoverEveryMessageExactlyOnce) {
  const uint64_t chunk_sizes[] = {4096, 50 * 1024, 51200 + 64, 1 << 20};
  const uint64_t sizes[] = {0, 1, 7, 4095, 4096, 4097, 50 * 1024 - 1, 50 * 1024, 50 * 1024 + 1, 999999, 1 << 20,
                            (1 << 20) + 3, 64ull << 20, (64ull << 20) - 1};
  const Config cfg = Config::resolve({{"policy", "round_robin"}});
  for (uint64_t chunk : chunk_sizes)
    for (uint64_t size : sizes)
      for (int paths = 1; paths <= 8; ++paths) {
        auto chunks = decompose(size, chunk);
        ASSERT_EQ((size + chunk - 1) / chunk, chunks.size()) << size << "/" << chunk;
        auto sched = makeScheduler(cfg);
        std::vector<PathView> views(paths);
        std::vector<uint64_t> per_path(paths, 0);
        uint64_t at = 0;
        for (size_t i = 0; i < chunks.size(); ++i) {
          const ChunkSpan& c = chunks[i];
          ASSERT_EQ(i, c.index);
          ASSERT_EQ(at, c.offset);  // contiguous, no gap, no overlap
          ASSERT_GT(c.length, 0u);
          ASSERT_LE(c.length, chunk);
          if (i + 1 < chunks.size()) ASSERT_EQ(chunk, c.length);  // only the last may be short
          EXPECT_EQ(c.offset, chunkAt(size, chunk, c.index).offset);
          at += c.length;
          int p = sched->assign(views, size);
          ASSERT_EQ(static_cast<int>(i % paths), p);
          per_path[p] += 1;
        }
        ASSERT_EQ(size, at) << "chunks must cover the whole message";
        // Fair share: chunk counts per path differ by at most one.
        auto [lo, hi] = std::minmax_element(per_path.begin(), per_path.end());
        ASSERT_LE(*hi - *lo, 1u);
      }
}

TEST(Decomposer, ImmediateRoundTrips) {
  for (uint32_t channel : {0u, 1u, kMaxChannels - 1})
    for (uint32_t tag : {0u, 1u, 1023u, 4095u, kUsedTags - 1})
      for (uint32_t chunk : {0u, 1u, 7777u, kMaxChunksPerMessage - 1}) {
        const uint32_t imm = withChannel(encodeImm(tag, chunk), channel);
        EXPECT_EQ(channel, immChannel(imm));
        EXPECT_EQ(tag, immTag(imm));
        EXPECT_EQ(chunk, immChunk(imm));
        EXPECT_EQ(encodeImm(tag, chunk), withChannel(imm, 0));
      }
}

TEST(Decomposer, MidSizeMessagesAreCutIntoOneChunkPerPath) {
  const uint64_t K = 1024;
  const Chunking tcp(256 * K, 64 * K, 4);  // the TCP defaults on four paths
  // A 4-rank ring step of a 1 MiB allreduce: 256 KiB, one chunk per path.
  EXPECT_EQ(64 * K, messageChunkSize(256 * K, tcp));
  EXPECT_EQ(4u, chunkCount(256 * K, tcp));
  EXPECT_EQ(128 * K, messageChunkSize(512 * K, tcp));
  // Shares round up to 64 bytes: 300,000 bytes give 4 chunks of 75,008 (the last shorter).
  EXPECT_EQ(75008u, messageChunkSize(300000, tcp));
  EXPECT_EQ(4u, chunkCount(300000, tcp));
  // Never below the floor: 128 KiB makes 2 chunks, 64 KiB one, a small message one.
  EXPECT_EQ(2u, chunkCount(128 * K, tcp));
  EXPECT_EQ(1u, chunkCount(64 * K, tcp));
  EXPECT_EQ(1u, chunkCount(100, tcp));
  // At spread x chunk_size and beyond, chunk_size as before.
  EXPECT_EQ(256 * K, messageChunkSize(1024 * K, tcp));
  EXPECT_EQ(256 * K, messageChunkSize(1024 * K + 1, tcp));
  EXPECT_EQ(256 * K, messageChunkSize(64 * K * K, tcp));
  // Off: a floor at the chunk size (verbs' auto), or one path.
  EXPECT_EQ(256 * K, messageChunkSize(256 * K, Chunking(256 * K, 256 * K, 4)));
  EXPECT_EQ(256 * K, messageChunkSize(256 * K, Chunking(256 * K, 64 * K, 1)));
  EXPECT_EQ(256 * K, messageChunkSize(256 * K, Chunking(256 * K)));
  // Every message is covered exactly once, whatever the cut.
  for (uint32_t spread : {1u, 2u, 3u, 4u, 8u, 64u})
    for (uint64_t bytes : {1ull, 4095ull, 4097ull, 65537ull, 262143ull, 262145ull, 999999ull, 1048575ull, 4194305ull}) {
      const Chunking c(256 * K, 16 * K, spread);
      const uint64_t size = messageChunkSize(bytes, c);
      ASSERT_GE(size, std::min<uint64_t>(16 * K, 256 * K));
      ASSERT_LE(size, 256 * K);
      ASSERT_EQ(0u, size % 64) << bytes << "/" << spread;
      uint64_t at = 0;
      for (const auto& span : decompose(bytes, c)) {
        ASSERT_EQ(at, span.offset);
        ASSERT_GT(span.length, 0u);
        at += span.length;
      }
      ASSERT_EQ(bytes, at);
      if (bytes >= spread * 16 * K && bytes < spread * 256 * K) ASSERT_EQ(spread, chunkCount(bytes, c)) << bytes;
    }
}

// A fine cut is the chunking with its smallest chunk as the chunk; where
// there is none smaller (one host, verbs), the chunking itself.
TEST(Decomposer, AFineCutTakesTheSmallestChunk) {
  const uint64_t K = 1024;
  const Chunking tcp(256 * K, 64 * K, 4);
  EXPECT_EQ(256 * K, messageChunkSize(4096 * K, cutWith(tcp, Cut::kDefault)));
  EXPECT_EQ(64 * K, messageChunkSize(4096 * K, cutWith(tcp, Cut::kFine)));
  EXPECT_EQ(64u, chunkCount(4096 * K, cutWith(tcp, Cut::kFine)));
  // A mid-size message: still one chunk per path, none under the floor.
  EXPECT_EQ(64 * K, messageChunkSize(200 * K, cutWith(tcp, Cut::kFine)));
  EXPECT_EQ(1u, chunkCount(64 * K, cutWith(tcp, Cut::kFine)));
  for (const Chunking& whole : {Chunking(256 * K), Chunking(50 * K, 50 * K, 4), Chunking(64 * K, 256 * K, 4)}) {
    const Chunking c = cutWith(whole, Cut::kFine);
    EXPECT_EQ(whole.chunk_size, c.chunk_size);
    EXPECT_EQ(whole.min_chunk, c.min_chunk);
  }
  // Beyond the chunk limit the chunks grow, as with any cut.
  const uint64_t huge = static_cast<uint64_t>(kMaxChunksPerMessage) * 64 * K + 1;
  EXPECT_EQ(kMaxChunksPerMessage, chunkCount(huge, cutWith(tcp, Cut::kFine)));
}

TEST(Decomposer, MessagesBeyondTheChunkLimitGetLargerChunks) {
  const uint64_t most = static_cast<uint64_t>(kMaxChunksPerMessage) * 4096;
  EXPECT_EQ(4096u, messageChunkSize(most, 4096));
  EXPECT_EQ(kMaxChunksPerMessage, chunkCount(most, 4096));
  // One byte more: every chunk grows by one byte, the count stays at the limit.
  EXPECT_EQ(4097u, messageChunkSize(most + 1, 4096));
  for (uint64_t bytes : {most + 1, 3 * most + 12345, 1000 * most}) {
    auto chunks = decompose(bytes, 4096);
    ASSERT_LE(chunks.size(), kMaxChunksPerMessage);
    uint64_t at = 0;
    for (const auto& c : chunks) {
      ASSERT_EQ(at, c.offset);
      ASSERT_EQ(c.offset, chunkAt(bytes, 4096, c.index).offset);
      at += c.length;
    }
    EXPECT_EQ(bytes, at);
  }
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
