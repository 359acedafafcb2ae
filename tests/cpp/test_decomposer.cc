// Decomposer: the chunks of a message cover it exactly once, in order, for
// many message sizes, chunk sizes and path counts; round robin spreads them
// evenly over the paths.
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
