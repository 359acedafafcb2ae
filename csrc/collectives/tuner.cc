#include "collectives/tuner.h"

#include <algorithm>
#include <sstream>

#include "common/config.h"
#include "common/error.h"

namespace maestro {
namespace collectives {

uint64_t recursiveDoublingLimit(int ranks, bool spans_hosts, const std::string& transport) {
  (void)transport;  // verbs: not measured on a NIC; TCP's table stands in
  if (ranks < 2) return 0;
  return spans_hosts ? kRecursiveDoublingAcrossHosts : kRecursiveDoublingOneHost;
}

Algorithm tunedAlgorithm(const TuneFacts& f) {
  switch (f.kind) {
    case OpKind::kAllreduce:
      return f.bytes <= recursiveDoublingLimit(f.ranks, f.spans_hosts, f.transport) ? Algorithm::kRecursiveDoubling
                                                                                    : Algorithm::kRing;
    case OpKind::kReduce:
      return f.bytes <= kDirectReduceBytes ? Algorithm::kDirect
             : f.bytes <= kSmallReduceBytes ? Algorithm::kTree
                                            : Algorithm::kRing;
    default: return Algorithm::kRing;
  }
}

Choice choose(const Config& config, const TuneFacts& facts) {
  // Keyed by the operations' names (kAlgorithms uses opKindName's).
  auto it = config.algo.find(opKindName(facts.kind));
  if (it != config.algo.end())
    for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kDirect, Algorithm::kTree})
      if (it->second == algorithmName(a)) return Choice{a, true};
  return Choice{tunedAlgorithm(facts), false};
}

Choice choose(const multipath::Engine& engine, OpKind kind, uint64_t bytes) {
  TuneFacts f;
  f.kind = kind;
  f.bytes = bytes;
  f.ranks = engine.size();
  f.spans_hosts = ringSpansHosts(engine);
  f.transport = engine.transportName();
  return choose(engine.config(), f);
}

int exchangeWindow(const multipath::Engine& engine) {
  const int knob = engine.config().exchange_window;
  if (knob > 0) return knob;
  return ringSpansHosts(engine) ? kExchangeWindowAcrossHosts : 0;
}

std::string describeTuner(const multipath::Engine& engine) {
  const Config& c = engine.config();
  const bool spans = ringSpansHosts(engine);
  const uint64_t rd = recursiveDoublingLimit(engine.size(), spans, engine.transportName());
  std::ostringstream os;
  os << "tuner (" << engine.size() << " ranks, " << (spans ? "across hosts" : "one host") << ", "
     << engine.transportName() << ", " << engine.paths() << " paths";
  for (const auto& k : knobs())
    if (std::string(k.name) == "algo") os << "; " << k.env << "=" << k.show(c);
  os << "):\n";
  auto forced = [&](const char* op) {
    auto it = c.algo.find(op);
    return it == c.algo.end() ? std::string() : strcat(" -- forced: ", it->second, " at every size");
  };
  os << "  allreduce: "
     << (rd ? strcat("recursive_doubling up to ", rd, " bytes, ring above") : std::string("ring at every size"))
     << forced("allreduce") << "\n";
  os << "  reduce: direct up to " << kDirectReduceBytes << " bytes, tree up to " << kSmallReduceBytes
     << " bytes, ring above" << forced("reduce") << "\n";
  os << "  chunks: " << c.chunk_size << " bytes";
  if (c.min_chunk_size < c.chunk_size && engine.paths() > 1 && spans)
    os << "; a message under " << engine.paths() << " chunks to another host: one chunk per path, at least "
       << c.min_chunk_size << " bytes; a ring whose blocks are at most that per path: segments of "
       << c.min_chunk_size << " bytes, each forwarded as it lands";
  os << "; ring segments of " << c.segment_size << " bytes\n";
  os << "  all_to_all, gather, scatter: " << c.alltoall_window << " all-to-all step(s) in flight, at most "
     << (exchangeWindow(engine) > 0 ? std::min(exchangeWindow(engine), c.window) : c.window)
     << " chunks of them a path";
  if (kExchangeCut == multipath::Cut::kFine && c.min_chunk_size < c.chunk_size && spans)
    os << ", cut into chunks of " << c.min_chunk_size << " bytes to another host";
  return os.str();
}

}  // namespace collectives
}  // namespace maestro
