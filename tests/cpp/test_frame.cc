// The receiver's checks, without a socket: header validation and the region
// table's grant for every way a write from the wire can be wrong.
#include <gtest/gtest.h>

#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"

namespace maestro {
namespace transport {
namespace tcp {
namespace {

TEST(FrameHeader, WellFormedFramesPass) {
  EXPECT_EQ("", checkHeader(writeFrame(1, 2, 3, 4, true, 5)));
  EXPECT_EQ("", checkHeader(writeFrame(1, 2, 3, 0, false, 0)));
  EXPECT_EQ("", checkHeader(sendFrame(kMaxControlBytes)));
  EXPECT_EQ("", checkHeader(ackFrame(17)));
  EXPECT_EQ("", checkHeader(offerFrame()));
  EXPECT_EQ("", checkHeader(acceptFrame()));
  FrameHeader by_reference = writeFrame(1, 2, 3, 4, true, 5);
  by_reference.flags |= kFlagByReference;
  EXPECT_EQ("", checkHeader(by_reference));
}

TEST(FrameHeader, EveryMalformedFieldIsRejected) {
  auto bad = [](FrameHeader h) { return !checkHeader(h).empty(); };
  FrameHeader w = writeFrame(1, 2, 3, 4, true, 5);
  FrameHeader h = w;
  h.magic ^= 1;
  EXPECT_TRUE(bad(h));
  h = w;
  h.type = 0;
  EXPECT_TRUE(bad(h));
  h.type = 4;
  EXPECT_TRUE(bad(h));
  h = w;
  h.reserved = 2;
  EXPECT_TRUE(bad(h));
  h = w;
  h.flags = 4;
  EXPECT_TRUE(bad(h));
  h = w;
  h.length = kMaxWritePayload + 1;
  EXPECT_TRUE(bad(h));
  FrameHeader s = sendFrame(8);
  for (int f = 0; f < 5; ++f) {
    h = s;
    if (f == 0) h.flags = 1;
    if (f == 1) h.region = 1;
    if (f == 2) h.imm = 1;
    if (f == 3) h.key = 1;
    if (f == 4) h.offset = 1;
    EXPECT_TRUE(bad(h)) << "SEND field " << f;
  }
  h = sendFrame(kMaxControlBytes + 1);
  EXPECT_TRUE(bad(h));
  FrameHeader a = ackFrame(1);
  h = a;
  h.length = 1;
  EXPECT_TRUE(bad(h));
  h = a;
  h.key = 1;
  EXPECT_TRUE(bad(h));
  // OFFER: exactly one same_host::Offer, no other field; ACCEPT: nothing.
  for (int f = 0; f < 7; ++f) {
    h = offerFrame();
    if (f == 0) h.flags = 1;
    if (f == 1) h.region = 1;
    if (f == 2) h.imm = 1;
    if (f == 3) h.key = 1;
    if (f == 4) h.offset = 1;
    if (f == 5) h.length -= 1;
    if (f == 6) h.length = kMaxControlBytes;
    EXPECT_TRUE(bad(h)) << "OFFER field " << f;
  }
  for (int f = 0; f < 3; ++f) {
    h = acceptFrame();
    if (f == 0) h.flags = 1;
    if (f == 1) h.length = 1;
    if (f == 2) h.offset = 1;
    EXPECT_TRUE(bad(h)) << "ACCEPT field " << f;
  }
}

class Regions : public ::testing::Test {
 protected:
  void SetUp() override {
    region_ = table_.add(memory_, sizeof memory_);
    key_ = table_.expose(region_.id);
  }
  RegionTable::Verdict grant(uint32_t id, uint64_t key, uint64_t off, uint64_t len, std::string* why = nullptr) {
    RegionTable::Grant g;
    std::string w;
    auto v = table_.grantWrite(id, key, off, len, &g, why ? why : &w);
    if (v == RegionTable::Verdict::kGranted) EXPECT_EQ(memory_ + off, g.dst());
    return v;
  }
  uint8_t memory_[1000];
  RegionTable table_;
  Region region_;
  uint64_t key_ = 0;
};

TEST_F(Regions, InBoundsWritesAreGranted) {
  EXPECT_EQ(RegionTable::Verdict::kGranted, grant(region_.id, key_, 0, 1000));
  EXPECT_EQ(RegionTable::Verdict::kGranted, grant(region_.id, key_, 999, 1));
  EXPECT_EQ(RegionTable::Verdict::kGranted, grant(region_.id, key_, 1000, 0));
}

TEST_F(Regions, OutOfBoundsAndOverflowsAreRejected) {
  std::string why;
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_, 1, 1000, &why));
  EXPECT_NE(std::string::npos, why.find("overruns"));
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_, 1001, 0));
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_, ~0ull, 2));
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_, 8, ~0ull - 3));
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_, 1ull << 63, 1ull << 63));
}

TEST_F(Regions, UnknownRegionsAndWrongKeysAreRejected) {
  std::string why;
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id + 1, key_, 0, 1, &why));
  EXPECT_NE(std::string::npos, why.find("unknown region"));
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_ + 2, 0, 1, &why));
  EXPECT_NE(std::string::npos, why.find("wrong key"));
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(0, key_, 0, 1));
}

TEST_F(Regions, ConcealedAndOldKeysAreStale) {
  table_.conceal(region_.id);
  EXPECT_EQ(RegionTable::Verdict::kStale, grant(region_.id, key_, 0, 1));
  uint64_t fresh = table_.expose(region_.id);
  EXPECT_NE(key_, fresh);
  EXPECT_EQ(RegionTable::Verdict::kStale, grant(region_.id, key_, 0, 1));
  EXPECT_EQ(RegionTable::Verdict::kGranted, grant(region_.id, fresh, 0, 1));
  // Nested exposure keeps the key.
  EXPECT_EQ(fresh, table_.expose(region_.id));
  table_.conceal(region_.id);
  EXPECT_EQ(RegionTable::Verdict::kGranted, grant(region_.id, fresh, 0, 1));
}

TEST_F(Regions, RemovedRegionsAreStaleWithTheirKeysAndIdsAreNotReused) {
  // A chunk re-sent after its path closed can arrive once the operation it
  // belonged to completed here and its tensor was freed (region removed):
  // with one of the region's keys it is a late duplicate, not an attack.
  table_.remove(region_.id);
  EXPECT_EQ(RegionTable::Verdict::kStale, grant(region_.id, key_, 0, 1));
  std::string why;
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_ + 2, 0, 1, &why));
  EXPECT_NE(std::string::npos, why.find("unknown region"));
  Region again = table_.add(memory_, sizeof memory_);
  EXPECT_NE(region_.id, again.id);
}

TEST_F(Regions, OnlyRecentRemovalsAreRemembered) {
  table_.remove(region_.id);
  for (int i = 0; i < 300; ++i) table_.remove(table_.add(memory_, sizeof memory_).id);
  EXPECT_EQ(RegionTable::Verdict::kRejected, grant(region_.id, key_, 0, 1));
  EXPECT_EQ(0u, table_.size());
}

}  // namespace
}  // namespace tcp
}  // namespace transport
}  // namespace maestro
