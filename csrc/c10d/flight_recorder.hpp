// maestro's flight recorder: the last operations of one group, what state
// each reached and how it ended, for maestro_torch.dump() and for the file
// MAESTRO_DUMP names, written when an operation fails or times out. Torch's
// own recorder (FlightRecorderHook.attach(pg)) sees the calls; this one
// sees maestro's side of them: when the worker took each up, when it ended,
// its error, and the paths' state at the dump.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "multipath/engine.h"

namespace maestro {
namespace c10d_glue {

class FlightRecorder {
 public:
  struct Entry {
    uint64_t seq = 0;
    std::string op;
    uint64_t bytes = 0;                                 // the call's input tensors
    double queued = 0, started = 0, ended = 0;          // unix seconds; 0: not yet
    std::string state = "queued";                       // queued | running | completed | failed
    std::string error;
  };
  static constexpr size_t kEntries = 64;

  void queued(uint64_t seq, const char* op, uint64_t bytes);
  void started(uint64_t seq);
  void finished(uint64_t seq, const std::exception_ptr& error);
  std::vector<Entry> entries() const;
  // {"rank", "size", "group", "time", "ops": [...oldest first], "paths": [path_stats() lines]}
  std::string json(int rank, int size, uint32_t group, const std::vector<multipath::PathStats>& paths) const;

 private:
  Entry* find(uint64_t seq);  // under mu_
  mutable std::mutex mu_;
  std::deque<Entry> ring_;
};

}  // namespace c10d_glue
}  // namespace maestro
