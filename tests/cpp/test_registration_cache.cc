#include <gtest/gtest.h>

#include <memory>

#include "multipath/registration_cache.h"
#include "transport/factory.h"
#include "recording_sink.h"

namespace maestro {
namespace multipath {
namespace {

class Cache : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::TransportOptions o;
    o.sink = &sink_;
    t_ = transport::makeTransport("tcp", o);
  }
  testing::RecordingSink sink_;
  std::unique_ptr<transport::Transport> t_;
};

TEST_F(Cache, ReusesRegistrationsOfLiveOwners) {
  RegistrationCache c(t_.get(), 8);
  std::vector<char> buf(100);
  auto owner = std::make_shared<int>(0);
  std::weak_ptr<int> weak = owner;
  Region a = c.acquire(owner.get(), buf.data(), buf.size(), [weak] { return !weak.expired(); });
  c.unpin(owner.get());
  Region b = c.acquire(owner.get(), buf.data(), buf.size(), [weak] { return !weak.expired(); });
  c.unpin(owner.get());
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(1u, c.hits());
  EXPECT_EQ(1u, c.misses());
}

TEST_F(Cache, NeverReturnsARegistrationOfFreedMemory) {
  RegistrationCache c(t_.get(), 8);
  std::vector<char> buf(100);
  auto owner = std::make_shared<int>(0);
  const void* key = owner.get();
  std::weak_ptr<int> weak = owner;
  Region a = c.acquire(key, buf.data(), buf.size(), [weak] { return !weak.expired(); });
  c.unpin(key);
  owner.reset();  // the storage died; its address may be reused
  bool alive = true;
  Region b = c.acquire(key, buf.data(), buf.size(), [&] { return alive; });
  EXPECT_NE(a.id, b.id) << "a dead owner's registration was reused";
  c.unpin(key);
  alive = false;
  c.sweep();
  EXPECT_EQ(0u, c.size());
}

// A freed tensor's registration goes at the next acquire of any tensor, not
// when the cache is full.
TEST_F(Cache, ADeadOwnersRegistrationGoesAtTheNextAcquire) {
  RegistrationCache c(t_.get(), 256);
  std::vector<char> x(100), y(100);
  auto owner = std::make_shared<int>(0);
  std::weak_ptr<int> weak = owner;
  c.acquire(owner.get(), x.data(), x.size(), [weak] { return !weak.expired(); });
  c.unpin(weak.lock().get());
  owner.reset();
  int other = 0;
  c.acquire(&other, y.data(), y.size(), [] { return true; });
  c.unpin(&other);
  EXPECT_EQ(1u, c.size()) << "the dead owner's registration is still held";
  EXPECT_EQ(1u, c.evictions());
}

TEST_F(Cache, ChangedMemoryIsRegisteredAgain) {
  RegistrationCache c(t_.get(), 8);
  std::vector<char> x(100), y(200);
  int owner = 0;
  Region a = c.acquire(&owner, x.data(), x.size(), [] { return true; });
  c.unpin(&owner);
  Region b = c.acquire(&owner, y.data(), y.size(), [] { return true; });
  c.unpin(&owner);
  EXPECT_NE(a.id, b.id);
  EXPECT_EQ(y.data(), b.addr);
}

TEST_F(Cache, BoundedLeastRecentlyUsedButPinnedEntriesStay) {
  RegistrationCache c(t_.get(), 2);
  std::vector<char> buf(64);
  int owners[4];
  c.acquire(&owners[0], buf.data(), 64, [] { return true; });  // stays pinned
  for (int i = 1; i < 4; ++i) {
    c.acquire(&owners[i], buf.data(), 64, [] { return true; });
    c.unpin(&owners[i]);
  }
  EXPECT_EQ(2u, c.size());
  Region again = c.acquire(&owners[0], buf.data(), 64, [] { return true; });
  EXPECT_EQ(1u, c.hits()) << "the pinned entry was evicted";
  (void)again;
}

// What the idle registrations cover is bounded in bytes (on verbs they are
// pinned): the least recently used go first, before the new one is made.
TEST_F(Cache, IdleRegistrationsAreBoundedInBytes) {
  RegistrationCache c(t_.get(), 256, 250);
  std::vector<char> buf(300);
  int owners[3];
  for (int& o : owners) {
    c.acquire(&o, buf.data(), 100, [] { return true; });
    c.unpin(&o);
    EXPECT_LE(c.bytes(), 250u);
  }
  EXPECT_EQ(2u, c.size());
  EXPECT_EQ(200u, c.bytes());
  c.acquire(&owners[0], buf.data(), 100, [] { return true; });  // the oldest went
  c.unpin(&owners[0]);
  EXPECT_EQ(0u, c.hits());
  c.acquire(&owners[2], buf.data(), 100, [] { return true; });  // the newest stayed
  c.unpin(&owners[2]);
  EXPECT_EQ(1u, c.hits());
}

// A running operation's registrations stay whatever the bound; once they
// are idle the cache comes back under it.
TEST_F(Cache, RegistrationsInUseMayPassTheByteBoundUntilUnpinned) {
  RegistrationCache c(t_.get(), 256, 150);
  std::vector<char> buf(300);
  int owners[3];
  for (int& o : owners) c.acquire(&o, buf.data(), 100, [] { return true; });
  EXPECT_EQ(3u, c.size());
  EXPECT_EQ(300u, c.bytes());
  for (int& o : owners) c.unpin(&o);
  EXPECT_EQ(1u, c.size());
  EXPECT_EQ(100u, c.bytes());
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
