#include <gtest/gtest.h>

#include <fstream>

#include <sys/resource.h>

#include <cstdlib>
#include <limits>

#include "common/config.h"
#include "common/net.h"
#include "common/error.h"

namespace maestro {
namespace {

struct EnvGuard {
  explicit EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::string errorOf(const std::map<std::string, std::string>& o) {
  try {
    Config::resolve(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The paper's 50 KB chunks and 8 writes in flight on verbs; TCP pays per
// chunk in system calls and ACK frames, so its chunks are larger.
TEST(Config, DefaultsMatchThePaper) {
  Config c = Config::resolve();
  EXPECT_EQ(0u, c.chunk_size);  // auto: chosen with the transport
  EXPECT_EQ(51200u, chunkSizeFor("verbs"));
  EXPECT_EQ(262144u, chunkSizeFor("tcp"));
  EXPECT_EQ(8, c.window);
  EXPECT_EQ("default", c.provenance["chunk_size"].second);
  EXPECT_EQ("auto", c.provenance["chunk_size"].first);
  EXPECT_EQ(0u, Config::resolve({{"chunk_size", "auto"}}).chunk_size);
}

// auto: more reduce-scatter slots where the credits come back behind the
// peer's own data (two ranks); an explicit value wins.
TEST(Config, ScratchSlotsAutoDependsOnTheGroupSize) {
  EXPECT_EQ(0, Config::resolve().scratch_slots);  // auto
  EXPECT_EQ(4, scratchSlots(Config::resolve(), 4));
  EXPECT_EQ(16, scratchSlots(Config::resolve(), 2));
  EXPECT_EQ(6, scratchSlots(Config::resolve({{"scratch_slots", "6"}}), 2));
}

// auto: every all-to-all step in flight; an explicit value, bounded by the
// group's n-1 steps.
TEST(Config, AlltoallWindowAutoIsEveryStep) {
  EXPECT_EQ(0, Config::resolve().alltoall_window);  // auto
  EXPECT_EQ(3, alltoallWindow(Config::resolve(), 4)) << "auto: every step of 4 ranks";
  EXPECT_EQ(1, alltoallWindow(Config::resolve(), 2));
  EXPECT_EQ(2, alltoallWindow(Config::resolve({{"alltoall_window", "2"}}), 8));
  EXPECT_EQ(3, alltoallWindow(Config::resolve({{"alltoall_window", "5"}}), 4)) << "bounded by the steps";
}

// MAESTRO_REG_CACHE_BYTES=auto: half of a finite RLIMIT_MEMLOCK (verbs pins
// what the cache keeps), unbounded without a limit; an explicit size wins.
TEST(Config, RegCacheBytesAutoFollowsTheMemlockLimit) {
  const uint64_t unlimited = static_cast<uint64_t>(RLIM_INFINITY);
  EXPECT_EQ(0u, Config::resolve().reg_cache_bytes);  // auto
  EXPECT_EQ(32u << 20, regCacheBytes(Config::resolve(), 64u << 20));
  EXPECT_EQ(std::numeric_limits<size_t>::max(), regCacheBytes(Config::resolve(), unlimited));
  EXPECT_EQ(1u << 20, regCacheBytes(Config::resolve({{"reg_cache_bytes", "1M"}}), 64u << 20));
  EXPECT_EQ(1u << 20, regCacheBytes(Config::resolve({{"reg_cache_bytes", "1M"}}), unlimited));
  EXPECT_NE(std::string::npos, errorOf({{"reg_cache_bytes", "0"}}).find("MAESTRO_REG_CACHE_BYTES"));
}

TEST(Config, EnvironmentThenOptions) {
  EnvGuard g("MAESTRO_CHUNK_SIZE", "100K");
  Config c = Config::resolve();
  EXPECT_EQ(102400u, c.chunk_size);
  EXPECT_EQ("env", c.provenance["chunk_size"].second);
  Config d = Config::resolve({{"chunk_size", "64K"}});
  EXPECT_EQ(65536u, d.chunk_size);
  EXPECT_EQ("options", d.provenance["chunk_size"].second);
}

TEST(Config, BadValuesNameTheKnob) {
  EXPECT_NE(std::string::npos, errorOf({{"policy", "fastest"}}).find("MAESTRO_POLICY='fastest' is not one of"));
  EXPECT_NE(std::string::npos, errorOf({{"chunk_size", "-5"}}).find("MAESTRO_CHUNK_SIZE"));
  EXPECT_NE(std::string::npos, errorOf({{"chunk_size", "1000"}}).find("multiple of 64"));
  EXPECT_NE(std::string::npos, errorOf({{"min_chunk_size", "1000"}}).find("MAESTRO_MIN_CHUNK_SIZE=1000 must be a multiple"));
  EXPECT_NE(std::string::npos, errorOf({{"min_chunk_size", "128M"}}).find("between 4096 and 64M"));
  EXPECT_EQ(0u, Config::resolve({{"min_chunk_size", "auto"}}).min_chunk_size);
  EXPECT_EQ(16384u, Config::resolve({{"min_chunk_size", "16K"}}).min_chunk_size);
  EXPECT_NE(std::string::npos, errorOf({{"paths", "two"}}).find("not an integer"));
  EXPECT_NE(std::string::npos, errorOf({{"vnics", "10.0.0.1,bogus"}}).find("'bogus' is not an IP address"));
  EXPECT_NE(std::string::npos, errorOf({{"transport", "rdma"}}).find("MAESTRO_TRANSPORT"));
  EXPECT_NE(std::string::npos, errorOf({{"window", "0"}}).find("out of range"));
  EXPECT_NE(std::string::npos, errorOf({{"chunk_sise", "1M"}}).find("unknown maestro option 'chunk_sise'"));
  EnvGuard g("MAESTRO_SCRATCH_SLOTS", "1");
  EXPECT_NE(std::string::npos, errorOf({}).find("MAESTRO_SCRATCH_SLOTS=1 is out of range"));
}

TEST(Config, TcpCongestionIsCheckedAgainstTheKernel) {
  EXPECT_EQ("auto", Config::resolve().tcp_congestion);
  EXPECT_EQ("kernel", Config::resolve({{"tcp_congestion", "kernel"}}).tcp_congestion);
  EXPECT_NE(std::string::npos, errorOf({{"tcp_congestion", " "}}).find("give auto, kernel or"));
  EXPECT_EQ("reno", Config::resolve({{"tcp_congestion", " reno "}}).tcp_congestion);  // built into every kernel
  const std::string e = errorOf({{"tcp_congestion", "no_such_cc"}});
  EXPECT_NE(std::string::npos, e.find("MAESTRO_TCP_CONGESTION=no_such_cc: the kernel refuses")) << e;
  EXPECT_NE(std::string::npos, e.find("it has: ")) << e;
  EXPECT_NE(std::string::npos, e.find("reno")) << e;  // the list names what it has
}

std::string kernelCongestion() {
  std::string name;
  std::ifstream("/proc/sys/net/ipv4/tcp_congestion_control") >> name;
  return name;
}

// auto keeps the kernel's default unless it is bbr, and then picks one this
// process may use: cubic where allowed (root, or listed in
// tcp_allowed_congestion_control), else reno, which every process may use.
TEST(Config, AutoCongestionReplacesBbrOnly) {
  std::string why;
  EXPECT_EQ("", net::chooseCongestion("kernel", &why));
  EXPECT_NE(std::string::npos, why.find("the kernel's default")) << why;
  EXPECT_EQ("reno", net::chooseCongestion("reno", &why));
  const std::string chosen = net::chooseCongestion("auto", &why);
  if (kernelCongestion() == "bbr") {
    ASSERT_TRUE(chosen == "cubic" || chosen == "reno") << chosen;
    EXPECT_NO_THROW(net::checkCongestion(chosen, "test"));
    EXPECT_NE(std::string::npos, why.find("instead of the kernel's default (bbr)")) << why;
  } else {
    EXPECT_EQ("", chosen);
    EXPECT_NE(std::string::npos, why.find(kernelCongestion())) << why;
  }
}

TEST(Config, FingerprintCoversGroupWideKnobsOnly) {
  Config a = Config::resolve({{"chunk_size", "51200"}, {"window", "4"}});
  Config b = Config::resolve({{"chunk_size", "50K"}, {"window", "16"}});
  EXPECT_EQ(a.groupFingerprint(), b.groupFingerprint());  // same value, different spelling; window is local
  Config c = Config::resolve({{"chunk_size", "64K"}});
  EXPECT_NE(a.groupFingerprint(), c.groupFingerprint());
}

TEST(Config, EveryKnobIsDescribed) {
  std::string d = Config::resolve().describe();
  for (const auto& k : knobs()) EXPECT_NE(std::string::npos, d.find(k.env)) << k.env;
}

}  // namespace
}  // namespace maestro
