#include <gtest/gtest.h>

#include "common/error.h"
#include "multipath/reassembler.h"

namespace maestro {
namespace multipath {
namespace {

TEST(Reassembler, CompletesWhenEveryChunkWasProcessedOnce) {
  Reassembler r(100);
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  auto hook = std::make_shared<ChunkHook>([&](uint64_t o, uint64_t l) { seen.emplace_back(o, l); });
  EXPECT_TRUE(r.expect(3, 250, hook).empty());
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  for (uint32_t c : {2u, 0u, 1u}) {
    ASSERT_EQ(Reassembler::Landed::kNew, r.land(3, c, c == 2 ? 50 : 100, &span, &h, &err)) << err;
    (*h)(span.offset, span.length);
    EXPECT_EQ(c == 1, r.processed(3));
  }
  EXPECT_TRUE(r.complete(3));
  EXPECT_EQ((std::vector<std::pair<uint64_t, uint64_t>>{{200, 50}, {0, 100}, {100, 100}}), seen);
}

TEST(Reassembler, DuplicatesAreCountedOnce) {
  Reassembler r(100);
  r.expect(1, 200, nullptr);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  EXPECT_EQ(Reassembler::Landed::kNew, r.land(1, 0, 100, &span, &h, &err));
  r.processed(1);
  EXPECT_EQ(Reassembler::Landed::kDuplicate, r.land(1, 0, 100, &span, &h, &err));
  EXPECT_FALSE(r.complete(1));
  EXPECT_EQ(Reassembler::Landed::kNew, r.land(1, 1, 100, &span, &h, &err));
  EXPECT_TRUE(r.processed(1));
}

// What the transport asks before placing a copy (landedAlready): a chunk
// is in place once land() took it, early or not, and every chunk of a
// released message counts as in place until its tags are reset.
TEST(Reassembler, SaysWhichChunksAreInPlace) {
  Reassembler r(100);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  EXPECT_FALSE(r.landed(5, 0));  // nothing yet, not even a table
  EXPECT_EQ(Reassembler::Landed::kEarly, r.land(5, 1, 100, &span, &h, &err));
  EXPECT_TRUE(r.landed(5, 1));
  EXPECT_FALSE(r.landed(5, 0));
  EXPECT_FALSE(r.landed(5, 130));  // beyond the bitmap
  r.expect(5, 300, nullptr);
  EXPECT_EQ(Reassembler::Landed::kNew, r.land(5, 0, 100, &span, &h, &err));
  EXPECT_TRUE(r.landed(5, 0));
  EXPECT_FALSE(r.landed(5, 2));
  r.release(5);
  EXPECT_TRUE(r.landed(5, 2));
  r.reset(5, 1);
  EXPECT_FALSE(r.landed(5, 0));
}

TEST(Reassembler, EarlyChunksAreHandedBackByExpect) {
  Reassembler r(100);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  EXPECT_EQ(Reassembler::Landed::kEarly, r.land(9, 1, 20, &span, &h, &err));
  EXPECT_EQ(Reassembler::Landed::kDuplicate, r.land(9, 1, 20, &span, &h, &err));
  auto early = r.expect(9, 120, nullptr);
  ASSERT_EQ(1u, early.size());
  EXPECT_EQ(100u, early[0].offset);
  EXPECT_EQ(20u, early[0].length);
  EXPECT_FALSE(r.processed(9));
  EXPECT_EQ(Reassembler::Landed::kNew, r.land(9, 0, 100, &span, &h, &err));
  EXPECT_TRUE(r.processed(9));
  r.release(9);
  EXPECT_EQ(0u, r.active());
}

// Early chunks of a message cut fine are checked against the fine cut the
// receiver names, not the peer's whole chunks.
TEST(Reassembler, EarlyChunksOfAFineCutMessageFitItsSmallestChunks) {
  Reassembler r(Chunking(100, 25, 2));
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  EXPECT_EQ(Reassembler::Landed::kEarly, r.land(4, 3, 25, &span, &h, &err));
  auto early = r.expect(4, 110, nullptr, Cut::kFine);
  ASSERT_EQ(1u, early.size());
  EXPECT_EQ(75u, early[0].offset);
  EXPECT_EQ(Reassembler::Landed::kNew, r.land(4, 4, 10, &span, &h, &err)) << err;
  EXPECT_EQ(100u, span.offset);
  EXPECT_EQ(Reassembler::Landed::kError, r.land(4, 5, 25, &span, &h, &err));  // 5 chunks only
  // The same early chunk does not fit a message cut whole.
  EXPECT_EQ(Reassembler::Landed::kEarly, r.land(6, 3, 25, &span, &h, &err));
  EXPECT_THROW(r.expect(6, 110, nullptr), Error);
}

TEST(Reassembler, InconsistentChunksAreErrors) {
  Reassembler r(100);
  r.expect(2, 150, nullptr);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  EXPECT_EQ(Reassembler::Landed::kError, r.land(2, 2, 100, &span, &h, &err));  // only 2 chunks
  EXPECT_EQ(Reassembler::Landed::kError, r.land(2, 1, 100, &span, &h, &err));  // last chunk is 50
  EXPECT_NE(std::string::npos, err.find("MAESTRO_CHUNK_SIZE"));
  EXPECT_THROW(r.expect(2, 150, nullptr), Error);  // tag in use
  EXPECT_EQ(Reassembler::Landed::kEarly, r.land(5, 3, 100, &span, &h, &err));
  EXPECT_THROW(r.expect(5, 150, nullptr), Error);  // early chunk does not fit
}

TEST(Reassembler, EmptyMessageIsCompleteAtOnce) {
  Reassembler r(100);
  r.expect(0, 0, nullptr);
  EXPECT_TRUE(r.complete(0));
}

TEST(Reassembler, ASecondCopyAfterReleaseIsDroppedNotKeptAsEarly) {
  // A failover re-sends a chunk whose first copy landed but whose ACK was
  // lost; the copy may arrive after the message was processed and released.
  // It must not pass for an early chunk of the tag's next use (which would
  // then count stale bytes as landed and drop the real chunk as a duplicate).
  Reassembler r(100);
  ChunkSpan span;
  std::shared_ptr<ChunkHook> h;
  std::string err;
  r.expect(7, 200, nullptr);
  for (uint32_t c = 0; c < 2; ++c) {
    ASSERT_EQ(Reassembler::Landed::kNew, r.land(7, c, 100, &span, &h, &err));
    r.processed(7);
  }
  ASSERT_TRUE(r.complete(7));
  r.release(7);
  EXPECT_EQ(Reassembler::Landed::kDuplicate, r.land(7, 1, 100, &span, &h, &err));
  r.reset(0, 16);  // the tag's next operation
  EXPECT_TRUE(r.expect(7, 200, nullptr).empty()) << "the stale copy came back as an early chunk";
  EXPECT_EQ(Reassembler::Landed::kNew, r.land(7, 1, 100, &span, &h, &err));
  EXPECT_FALSE(r.complete(7));
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
