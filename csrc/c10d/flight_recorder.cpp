#include "c10d/flight_recorder.hpp"

#include <chrono>
#include <cstdio>

#include "common/error.h"
#include "multipath/metrics.h"

namespace maestro {
namespace c10d_glue {
namespace {

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string seconds(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", t);
  return buf;
}

}  // namespace

void FlightRecorder::queued(uint64_t seq, const char* op, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.seq = seq;
  e.op = op;
  e.bytes = bytes;
  e.queued = unixNow();
  ring_.push_back(std::move(e));
  if (ring_.size() > kEntries) ring_.pop_front();
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t seq) {
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it)
    if (it->seq == seq) return &*it;
  return nullptr;
}

void FlightRecorder::started(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(seq)) {
    e->started = unixNow();
    e->state = "running";
  }
}

void FlightRecorder::finished(uint64_t seq, const std::exception_ptr& error) {
  std::string what;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
      what = "unknown error";
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(seq)) {
    e->ended = unixNow();
    e->state = error ? "failed" : "completed";
    e->error = std::move(what);
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {ring_.begin(), ring_.end()};
}

std::string FlightRecorder::json(int rank, int size, uint32_t group,
                                 const std::vector<multipath::PathStats>& paths) const {
  const double now = unixNow();
  std::string out = strcat("{\"rank\": ", rank, ", \"size\": ", size, ", \"group\": ", group,
                           ", \"time\": ", seconds(now), ", \"ops\": [");
  bool first = true;
  for (const Entry& e : entries()) {
    out += strcat(first ? "" : ", ", "{\"seq\": ", e.seq, ", \"op\": ", multipath::jsonString(e.op),
                  ", \"bytes\": ", e.bytes, ", \"state\": \"", e.state, "\", \"queued\": ", seconds(e.queued),
                  ", \"started\": ", seconds(e.started), ", \"ended\": ", seconds(e.ended),
                  ", \"error\": ", multipath::jsonString(e.error), "}");
    first = false;
  }
  out += "], \"paths\": [";
  first = true;
  for (const auto& s : paths) {
    std::string line = multipath::metricsLine(s, now, rank, group);
    line.pop_back();  // its newline
    out += (first ? "" : ", ") + line;
    first = false;
  }
  return out + "]}\n";
}

}  // namespace c10d_glue
}  // namespace maestro
