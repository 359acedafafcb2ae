#include "multipath/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "multipath/engine.h"

namespace maestro {
namespace multipath {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string replaceAll(std::string s, const std::string& what, const std::string& with) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size()))
    s.replace(at, what.size(), with);
  return s;
}

}  // namespace

std::string expandFileName(const std::string& name, int rank, uint32_t group) {
  return replaceAll(replaceAll(name, "{rank}", std::to_string(rank)), "{group}", std::to_string(group));
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string metricsLine(const PathStats& s, double unix_time, int rank, uint32_t group) {
  char time[32];
  std::snprintf(time, sizeof time, "%.3f", unix_time);  // milliseconds
  std::string out = strcat("{\"time\": ", time, ", \"rank\": ", rank, ", \"group\": ", group,
                           ", \"peer\": ", s.peer, ", \"path\": ", s.path, ", \"state\": ", jsonString(s.state),
                           ", \"addresses\": ", jsonString(s.description), ", \"route\": ", jsonString(s.route),
                           ", \"bytes_sent\": ", s.bytes_sent, ", \"bytes_received\": ", s.bytes_received,
                           ", \"chunks_sent\": ", s.chunks_sent, ", \"chunks_received\": ", s.chunks_received,
                           ", \"errors\": ", s.errors, ", \"resent\": ", s.resent, ", \"reconnects\": ", s.reconnects,
                           ", \"hunts\": ", s.hunts, ", \"throughput_bps\": ", number(s.throughput),
                           ", \"chunk_time_s\": ", number(s.completion_time), ", \"rtt_s\": ", number(s.rtt),
                           ", \"last_error\": ", jsonString(s.last_error));
  if (!s.congestion.empty()) out += ", \"congestion\": " + jsonString(s.congestion);
  for (const auto* counters : {&s.path_counters, &s.nic_counters}) {
    if (counters->empty()) continue;
    out += counters == &s.path_counters ? ", \"connection\": {" : ", \"nic\": {";
    bool first = true;
    for (const auto& [name, value] : *counters) {
      out += strcat(first ? "" : ", ", jsonString(name), ": ", value);
      first = false;
    }
    out += "}";
  }
  return out + "}\n";
}

MetricsFile::MetricsFile(std::string path, double interval_s, int rank, uint32_t group)
    : path_(expandFileName(path, rank, group)),
      interval_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s))),
      rank_(rank),
      group_(group),
      next_(Clock::now()) {}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsFile::write(const std::vector<PathStats>& stats, Clock::time_point now) {
  next_ = now + interval_;
  if (failed_) return;
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      failed_ = true;
      MAESTRO_WARN("MAESTRO_METRICS: cannot open ", path_, " (", std::strerror(errno), "); no metrics are written");
      return;
    }
  }
  const double unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& s : stats) {
    const std::string line = metricsLine(s, unix_time, rank_, group_);
    // One write per line: with O_APPEND, lines of several ranks sharing the
    // file do not interleave.
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      failed_ = true;
      MAESTRO_WARN("MAESTRO_METRICS: writing ", path_, " failed (", std::strerror(errno), "); no more metrics");
      return;
    }
  }
}

}  // namespace multipath
}  // namespace maestro
