// The NIC counter reader on a sysfs-shaped directory (the real files are
// read in the Soft-RoCE VM test, tests/cpp/verbs): only the congestion and
// loss counters are taken, unreadable ones are skipped.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "transport/nic_counters.h"

namespace maestro {
namespace {

TEST(NicCounters, ReadsTheCongestionAndLossCountersPresent) {
  char tmpl[] = "/tmp/maestro-nic-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string port = tmpl;
  ASSERT_EQ(0, mkdir((port + "/hw_counters").c_str(), 0755));
  auto put = [&](const std::string& name, const std::string& text) {
    std::ofstream(port + "/hw_counters/" + name) << text;
  };
  put("np_cnp_sent", "12\n");
  put("rcvd_seq_err", "3\n");
  put("rcvd_pkts", "999\n");       // not a congestion or loss counter
  put("rp_cnp_handled", "junk\n"); // unreadable: skipped
  auto c = transport::readNicCounters(port);
  EXPECT_EQ((std::map<std::string, uint64_t>{{"np_cnp_sent", 12}, {"rcvd_seq_err", 3}}), c);
  EXPECT_TRUE(transport::readNicCounters(port + "/nonexistent").empty());
  EXPECT_EQ("/sys/class/infiniband/mlx5_0/ports/1", transport::nicPortDir("mlx5_0", 1));
  for (const char* f : {"np_cnp_sent", "rcvd_seq_err", "rcvd_pkts", "rp_cnp_handled"})
    unlink((port + "/hw_counters/" + f).c_str());
  rmdir((port + "/hw_counters").c_str());
  rmdir(port.c_str());
}

}  // namespace
}  // namespace maestro
