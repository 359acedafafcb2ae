// The tuner: the one place that chooses how a collective runs, per
// operation, message size, group size, paths and transport. Every rank of a
// group derives the same choice from facts they share (the agreed knobs,
// the settled transport and path count, whether the group spans hosts), so
// no choice travels on the wire; the choice also rides in the operation's
// descriptor, so ranks that disagree fail with a message instead of
// waiting for each other.
//
// Choices, and where their thresholds come from (docs/results.md, "Small
// and mid-size allreduce: the tuner's algorithm choice", is the run that
// measured them):
//   allreduce  recursive doubling (log2 n exchanges of the whole tensor,
//              collectives/recursive_doubling.cc) while the tensor is small
//              enough that the ring's 2(n-1) sequential steps, not the bytes,
//              are the cost; the ring (reduce-scatter + allgather, every
//              byte crossing each link (n-1)/n times twice) above.
//   reduce     direct (every rank writes into the root at once, one step)
//              up to kDirectReduceBytes; a binomial tree (log2 n steps, the
//              root taking log2 n partial results, tree_reduce.cc) up to
//              kSmallReduceBytes; the ring reduce above.
// How a message is cut into chunks (the decomposer's one chunk per path
// down to the smallest chunk, multipath/decomposer.h) and how a ring's
// blocks are segmented (plan.h, ringSegmentBytes) are decided below this
// layer, per message; describeTuner() prints those rules beside the table.
// MAESTRO_ALGO forces an algorithm (common/config.h, kAlgorithms).
#pragma once

#include <cstdint>
#include <string>

#include "collectives/op.h"
#include "multipath/engine.h"

namespace maestro {
namespace collectives {

// What a choice depends on; the same on every rank of a group.
struct TuneFacts {
  OpKind kind = OpKind::kAllreduce;
  uint64_t bytes = 0;  // the tensor (allreduce, reduce)
  int ranks = 1;
  bool spans_hosts = false;
  std::string transport;  // tcp | verbs (settled)
};

struct Choice {
  Algorithm algorithm = Algorithm::kRing;
  bool forced = false;  // by MAESTRO_ALGO
};

// The tuner's table, without the knob: exposed for tests.
Algorithm tunedAlgorithm(const TuneFacts& facts);
// The knob first (config.algo), then the table.
Choice choose(const Config& config, const TuneFacts& facts);
// For the engine's group: its facts filled in from the engine.
Choice choose(const multipath::Engine& engine, OpKind kind, uint64_t bytes);

// Largest allreduce that goes by recursive doubling, by group size and
// whether the group spans hosts (0: none). Recursive doubling sends
// log2(n) whole tensors where the ring sends 2(n-1)/n of one in 2(n-1)
// steps: it wins while a step's latency outweighs a tensor's time on the
// wire, which comes sooner where the wire is slow (across hosts: on the
// lab a message under 64 KiB is one chunk on one 200 Mbit/s path) than on
// one host. The limits are the largest sizes at which recursive doubling
// was faster than the ring with MAESTRO_ALGO forcing each, 4 ranks on the
// lab and 4 and 8 ranks over loopback (docs/results.md, "Small and
// mid-size allreduce: the tuner's algorithm choice", scripts/bench.sh
// --only tuner).
// The ring's steps grow with n and recursive doubling's with log2(n), so
// a larger group's crossover should be higher; over loopback 6 and 8 ranks
// crossed at 256 or 512 KiB from one run to the next, so one limit serves
// every group size, erring towards the ring.
constexpr uint64_t kRecursiveDoublingAcrossHosts = 4 << 10;
constexpr uint64_t kRecursiveDoublingOneHost = 256 << 10;
uint64_t recursiveDoublingLimit(int ranks, bool spans_hosts, const std::string& transport);
// The chunks a path may hold of an exchange's messages (all-to-all,
// gather, scatter: Engine::write's window), MAESTRO_EXCHANGE_WINDOW or,
// auto, kExchangeWindowAcrossHosts where the group spans hosts and the path
// window (0) on one host. Every pair's block is in flight at once; placed
// all at once on the first rate estimates, a block's last chunks queued
// behind the path that turned out slowest, while placed as completions come
// back they go where a path drained (docs/results.md, "Point to point and
// all-to-all", has the default beside exchange_window=8, the path window).
// Over loopback, where the paths share memory, not links, 2 chunks cost
// 12 % at 1 MiB and 3 % at 64 MiB in a probe: there the tuner leaves the
// path window.
constexpr int kExchangeWindowAcrossHosts = 2;
int exchangeWindow(const multipath::Engine& engine);
// How an exchange's messages are cut: in the smallest chunks
// (MAESTRO_MIN_CHUNK_SIZE, 64 KiB on TCP) to a rank on another host, not in
// whole ones (multipath/decomposer.h, Cut::kFine). Every pair's block is in
// flight at once and ends together; with 256 KiB chunks a block's last
// chunk keeps one path busy for a chunk's time after its siblings drained,
// and every block ends that way: on the pinned lab's 4 ranks all-to-all
// reached 0.85-0.88 of its limit at 16 MiB and 0.88-0.90 at 64 MiB with
// whole chunks, 0.89-0.92 and 0.93-0.94 with 64 KiB ones (ECMP alike);
// 32 KiB ones did no better at 64 MiB (probes; docs/results.md, "Point to
// point and all-to-all", has the default beside whole chunks,
// @min_chunk_size=256K). One host and verbs have no smaller chunk, so there
// the cut changes nothing.
constexpr multipath::Cut kExchangeCut = multipath::Cut::kFine;
// Largest reduce that goes direct, and largest by the tree (the limit
// measured for the direct reduce against the ring, before the tree). From
// probes with MAESTRO_ALGO forcing each (rank_bench sweep --collective
// reduce): on the pinned lab's 4 ranks the tree takes 1.0-1.1 ms at 64 KiB
// against direct's 3.4 (three ranks writing into the root at once meet at
// its link), direct 0.91-1.21 ms at 16 KiB against the tree's 1.10-1.36,
// a tie at 4 KiB; over loopback at 4 and 16 ranks the two are within 15 %
// either way. The tuner experiment records it (scripts/bench.sh --only
// tuner: the reduce table under the tuner's section of docs/results.md).
constexpr uint64_t kDirectReduceBytes = 16 << 10;
constexpr uint64_t kSmallReduceBytes = 64 << 10;

// The rules as they apply to this group (MAESTRO_DEBUG=INFO, describe()).
std::string describeTuner(const multipath::Engine& engine);

}  // namespace collectives
}  // namespace maestro
