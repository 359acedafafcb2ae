#include <gtest/gtest.h>

#include <cstdlib>

#include "common/config.h"
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

TEST(Config, DefaultsMatchThePaper) {
  Config c = Config::resolve();
  EXPECT_EQ(51200u, c.chunk_size);
  EXPECT_EQ(8, c.window);
  EXPECT_EQ("default", c.provenance["chunk_size"].second);
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
  EXPECT_NE(std::string::npos, errorOf({{"paths", "two"}}).find("not an integer"));
  EXPECT_NE(std::string::npos, errorOf({{"vnics", "10.0.0.1,bogus"}}).find("'bogus' is not an IP address"));
  EXPECT_NE(std::string::npos, errorOf({{"transport", "rdma"}}).find("MAESTRO_TRANSPORT"));
  EXPECT_NE(std::string::npos, errorOf({{"window", "0"}}).find("out of range"));
  EXPECT_NE(std::string::npos, errorOf({{"chunk_sise", "1M"}}).find("unknown maestro option 'chunk_sise'"));
  EnvGuard g("MAESTRO_SCRATCH_SLOTS", "1");
  EXPECT_NE(std::string::npos, errorOf({}).find("MAESTRO_SCRATCH_SLOTS=1 is out of range"));
}

TEST(Config, TcpCongestionIsCheckedAgainstTheKernel) {
  EXPECT_EQ("", Config::resolve().tcp_congestion);  // the kernel's default
  EXPECT_EQ("reno", Config::resolve({{"tcp_congestion", " reno "}}).tcp_congestion);  // built into every kernel
  const std::string e = errorOf({{"tcp_congestion", "no_such_cc"}});
  EXPECT_NE(std::string::npos, e.find("MAESTRO_TCP_CONGESTION=no_such_cc: the kernel refuses")) << e;
  EXPECT_NE(std::string::npos, e.find("it has: ")) << e;
  EXPECT_NE(std::string::npos, e.find("reno")) << e;  // the list names what it has
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
