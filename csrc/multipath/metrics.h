// Metrics users can scrape: every MAESTRO_METRICS_INTERVAL seconds, the
// monitor appends one JSON line per path to the file MAESTRO_METRICS names,
// with the counters path_stats() returns (same field names and units).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"

namespace maestro {
namespace multipath {

struct PathStats;

// One path's line: {"time": unix seconds, "rank", "group", then the fields
// of maestro_torch.path_stats()}. Strings are JSON-escaped.
std::string metricsLine(const PathStats& s, double unix_time, int rank, uint32_t group);
// A file name with "{rank}" and "{group}" filled in.
std::string expandFileName(const std::string& name, int rank, uint32_t group);
// s as a JSON string literal, quotes included.
std::string jsonString(const std::string& s);

class MetricsFile {
 public:
  // `path` may hold "{rank}" and "{group}" (this rank in its group, and the
  // group's channel: 0 for the group that owns the paths); without them
  // every rank and group of a host appends to the one file (each line is one
  // append). Opened on the first write; a file that cannot be opened is
  // reported once and left alone.
  MetricsFile(std::string path, double interval_s, int rank, uint32_t group);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  bool due(Clock::time_point now) const { return now >= next_; }
  void write(const std::vector<PathStats>& stats, Clock::time_point now);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Clock::duration interval_;
  int rank_;
  uint32_t group_;
  int fd_ = -1;
  bool failed_ = false;
  Clock::time_point next_;
};

}  // namespace multipath
}  // namespace maestro
