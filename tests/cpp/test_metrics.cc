// MAESTRO_METRICS: the JSON lines the monitor appends, and where they go.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "multipath/engine.h"
#include "multipath/metrics.h"

namespace maestro {
namespace multipath {
namespace {

PathStats sample() {
  PathStats s;
  s.peer = 3;
  s.path = 1;
  s.state = "up";
  s.description = "10.0.0.1:5 <-> 10.0.0.2:6";
  s.last_error = "a \"quoted\"\nline\\ with \x01 control";
  s.bytes_sent = 1234567890123ull;
  s.resent = 2;
  s.throughput = 1.5e9;
  s.rtt = 0.000125;
  s.congestion = "cubic";
  s.path_counters = {{"bytes_retrans", 7}};
  return s;
}

TEST(Metrics, ALineIsOneJsonObjectWithEscapedStrings) {
  std::string line = metricsLine(sample(), 1700000000.25, 2, 1);
  ASSERT_EQ('\n', line.back());
  EXPECT_EQ(std::string::npos, line.substr(0, line.size() - 1).find('\n'));
  EXPECT_NE(std::string::npos, line.find("\"time\": 1700000000.250, \"rank\": 2, \"group\": 1, \"peer\": 3, \"path\": 1"));
  EXPECT_NE(std::string::npos, line.find("\"bytes_sent\": 1234567890123"));
  EXPECT_NE(std::string::npos, line.find("\"throughput_bps\": 1.5e+09"));
  EXPECT_NE(std::string::npos, line.find("\"rtt_s\": 0.000125"));
  EXPECT_NE(std::string::npos, line.find("\"last_error\": \"a \\\"quoted\\\"\\nline\\\\ with \\u0001 control\""));
  EXPECT_NE(std::string::npos, line.find("\"connection\": {\"bytes_retrans\": 7}"));
  EXPECT_EQ(std::string::npos, line.find("\"nic\""));  // none: no key
}

TEST(Metrics, TheFileNameTakesRankAndGroupAndRecordsComeAtTheInterval) {
  char dir[] = "/tmp/maestro-metrics-XXXXXX";
  ASSERT_NE(nullptr, ::mkdtemp(dir));
  MetricsFile file(std::string(dir) + "/m-{rank}-{group}.jsonl", 10.0, 4, 2);
  EXPECT_EQ(std::string(dir) + "/m-4-2.jsonl", file.path());
  const auto t0 = Clock::now();
  EXPECT_TRUE(file.due(t0));
  file.write({sample(), sample()}, t0);
  EXPECT_FALSE(file.due(t0 + std::chrono::seconds(9)));
  EXPECT_TRUE(file.due(t0 + std::chrono::seconds(10)));
  file.write({sample()}, t0 + std::chrono::seconds(10));
  std::ifstream in(file.path());
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(3u, lines.size());
  ::unlink(file.path().c_str());
  ::rmdir(dir);
}

TEST(Metrics, AFileThatCannotBeOpenedIsSkippedNotFatal) {
  MetricsFile file("/nonexistent-dir/m.jsonl", 1.0, 0, 0);
  file.write({sample()}, Clock::now());  // warns once
  file.write({sample()}, Clock::now());
  SUCCEED();
}

}  // namespace
}  // namespace multipath
}  // namespace maestro
