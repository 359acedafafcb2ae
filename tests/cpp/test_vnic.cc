// Where the paths start when the user set no vNICs.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "multipath/vnic.h"

namespace maestro {
namespace multipath {
namespace {

// Across hosts with no vNICs set, a loopback source address is refused with
// the reason, instead of a connect error from the other hosts later.
TEST(Vnics, ALoopbackFallbackAcrossHostsIsRefusedWithItsCause) {
  Config config;
  for (const std::string host : {"127.0.0.1", ""}) {
    try {
      chooseVnics(config, /*all_ranks_on_this_host=*/false, host);
      FAIL() << "accepted a loopback address for ranks on several hosts (" << host << ")";
    } catch (const Error& e) {
      std::string what = e.what();
      EXPECT_NE(std::string::npos, what.find("loopback")) << what;
      EXPECT_NE(std::string::npos, what.find("MAESTRO_IFNAME")) << what;
      if (host.empty()) EXPECT_NE(std::string::npos, what.find("no MASTER_ADDR")) << what;
    }
  }
  // One host: the loopback aliases, as before.
  EXPECT_EQ(static_cast<size_t>(kLoopbackPaths), chooseVnics(config, true, "127.0.0.1").addresses.size());
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
