// The registration cache's evict-and-retry: a registration that fails
// because the process may pin no more memory (RLIMIT_MEMLOCK, the limit
// verbs registrations run into) is made once more after every registration
// no operation uses is dropped -- and only those: a running operation's
// registrations stay.
//
// The limit is the kernel's own. The tcp transport pins nothing, so the
// transport under the cache here registers with it and pins the memory with
// mlock(2), as ibv_reg_mr does; RLIMIT_MEMLOCK is lowered so that two
// buffers fit and a third does not. Root ignores the limit while it holds
// CAP_IPC_LOCK, so each test runs on a thread of its own that drops that
// capability from its own credentials (capabilities are per thread; the
// rest of the process keeps them). The pinning is the system call itself,
// not libc's mlock(): AddressSanitizer replaces that with one that does
// nothing, and under it the limit never bit.
#include <gtest/gtest.h>

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/net.h"
#include "multipath/registration_cache.h"
#include "recording_sink.h"
#include "transport/factory.h"

namespace maestro {
namespace multipath {
namespace {

// The tcp transport's registrations, each one's memory pinned as verbs pins
// it: a registration the memlock limit does not allow fails, with mlock's
// error, and deregistering unpins. (The cache holds memory alone.)
class PinningMemory : public transport::Memory {
 public:
  explicit PinningMemory(std::unique_ptr<transport::Transport> inner) : inner_(std::move(inner)) {}
  Region registerMemory(void* addr, size_t length) override {
    if (::syscall(SYS_mlock, addr, length) != 0) {
      refused++;
      fail("cannot pin ", length, " bytes for a registration: ", net::errnoText(errno));
    }
    pinned++;
    return inner_->registerMemory(addr, length);
  }
  void deregisterMemory(const Region& region) override {
    inner_->deregisterMemory(region);
    ::syscall(SYS_munlock, region.addr, region.length);
    pinned--;
  }
  uint64_t expose(const Region& region) override { return inner_->expose(region); }
  void conceal(const Region& region) override { inner_->conceal(region); }

  std::atomic<int> refused{0};  // registrations the memlock limit refused
  std::atomic<int> pinned{0};   // registrations holding pinned memory now

 private:
  std::unique_ptr<transport::Transport> inner_;
};

// Bytes this process has locked now (VmLck), which count against the limit.
size_t lockedBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    size_t kib = 0;
    if (key == "VmLck:" && status >> kib) return kib << 10;
    status.ignore(1 << 10, '\n');
  }
  return 0;
}

class RegistrationRetry : public ::testing::Test {
 protected:
  static constexpr size_t kBuffer = 64 << 10;

  void SetUp() override {
    transport::TransportOptions o;
    o.sink = &sink_;
    t_ = std::make_unique<PinningMemory>(transport::makeTransport("tcp", o));
    for (auto& b : buffers_) {
      void* p = ::mmap(nullptr, kBuffer, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(MAP_FAILED, p);
      b = p;
    }
  }
  void TearDown() override {
    for (void* b : buffers_)
      if (b) ::munmap(b, kBuffer);
  }

  // Runs `body` on a thread without CAP_IPC_LOCK, under a memlock limit that
  // leaves room for two buffers more than the process holds locked now, and
  // never three. The limit is put back afterwards.
  void underTheLimit(const std::function<void()>& body) {
    rlimit before{};
    ASSERT_EQ(0, getrlimit(RLIMIT_MEMLOCK, &before));
    std::string failure;
    std::thread([&] {
      __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};  // pid 0: this thread
      __user_cap_data_struct caps[2] = {};
      if (syscall(SYS_capget, &header, caps) != 0) {
        failure = "capget: " + net::errnoText(errno);
        return;
      }
      caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
      if (syscall(SYS_capset, &header, caps) != 0) {
        failure = "capset: " + net::errnoText(errno);
        return;
      }
      rlimit limit = before;
      limit.rlim_cur = lockedBytes() + 2 * kBuffer + kBuffer / 2;
      if (before.rlim_max != RLIM_INFINITY && limit.rlim_cur > before.rlim_max) {
        failure = "the hard memlock limit leaves no room for two buffers";
        return;
      }
      if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
        failure = "setrlimit: " + net::errnoText(errno);
        return;
      }
      try {
        body();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      setrlimit(RLIMIT_MEMLOCK, &before);
    }).join();
    EXPECT_EQ("", failure);
  }

  testing::RecordingSink sink_;
  std::unique_ptr<PinningMemory> t_;
  void* buffers_[3] = {};
  int owners_[3] = {};
};

// The limit bites: a third registration cannot be made while two are
// pinned by running operations -- nothing may be evicted, so the failure
// reaches the caller. (What the tests below count on.)
TEST_F(RegistrationRetry, AThirdBufferDoesNotFitWhileTwoAreInUse) {
  underTheLimit([&] {
    RegistrationCache c(t_.get(), 256);
    c.acquire(&owners_[0], buffers_[0], kBuffer, [] { return true; });
    c.acquire(&owners_[1], buffers_[1], kBuffer, [] { return true; });
    try {
      c.acquire(&owners_[2], buffers_[2], kBuffer, [] { return true; });
      ADD_FAILURE() << "a third buffer was registered beyond the memlock limit";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot pin"), std::string::npos) << e.what();
    }
    EXPECT_EQ(2u, c.size());
    EXPECT_EQ(0u, c.evictions()) << "a registration in use was dropped";
    EXPECT_EQ(2, t_->pinned.load());
    c.unpin(&owners_[0]);
    c.unpin(&owners_[1]);
  });
}

// Two idle registrations fill the limit; the third fails once, the idle
// ones go, and the second try succeeds.
TEST_F(RegistrationRetry, IdleRegistrationsAreDroppedAndTheRegistrationIsTriedAgain) {
  underTheLimit([&] {
    RegistrationCache c(t_.get(), 256);
    for (int i = 0; i < 2; ++i) {
      c.acquire(&owners_[i], buffers_[i], kBuffer, [] { return true; });
      c.unpin(&owners_[i]);
    }
    ASSERT_EQ(0, t_->refused.load());
    Region r = c.acquire(&owners_[2], buffers_[2], kBuffer, [] { return true; });
    EXPECT_TRUE(r.valid());
    EXPECT_EQ(buffers_[2], r.addr);
    EXPECT_EQ(1, t_->refused.load()) << "the first try was not refused: the limit did not bite";
    EXPECT_EQ(2u, c.evictions());
    EXPECT_EQ(1u, c.size());
    EXPECT_EQ(1, t_->pinned.load()) << "evicted registrations stayed pinned";
    c.unpin(&owners_[2]);
  });
}

// One registration in use, one idle: only the idle one goes, the retry fits
// beside the one in use, and that one is still cached (a hit, same region).
TEST_F(RegistrationRetry, ARegistrationInUseSurvivesTheEviction) {
  underTheLimit([&] {
    RegistrationCache c(t_.get(), 256);
    Region in_use = c.acquire(&owners_[0], buffers_[0], kBuffer, [] { return true; });
    c.acquire(&owners_[1], buffers_[1], kBuffer, [] { return true; });
    c.unpin(&owners_[1]);
    Region r = c.acquire(&owners_[2], buffers_[2], kBuffer, [] { return true; });
    EXPECT_TRUE(r.valid());
    EXPECT_EQ(1, t_->refused.load()) << "the first try was not refused: the limit did not bite";
    EXPECT_EQ(1u, c.evictions());
    EXPECT_EQ(2u, c.size());
    EXPECT_EQ(2, t_->pinned.load());
    const uint64_t hits = c.hits();
    Region again = c.acquire(&owners_[0], buffers_[0], kBuffer, [] { return true; });
    EXPECT_EQ(hits + 1, c.hits()) << "the registration in use was evicted";
    EXPECT_EQ(in_use.id, again.id);
    c.unpin(&owners_[0]);
    c.unpin(&owners_[0]);
    c.unpin(&owners_[2]);
  });
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
