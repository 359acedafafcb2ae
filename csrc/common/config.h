// Every tunable of maestro, declared once (NCCL_PARAM style).
//
// Each knob has an Options field name, a MAESTRO_* environment variable, a
// default, a parser that rejects bad values with a clear message, and a doc
// line. Precedence: default < environment < Options (pg_options). The Python
// package reads this table (maestro_torch.knobs()) rather than repeating it,
// and MAESTRO_DEBUG=INFO prints every knob with its value and where it came
// from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"

namespace maestro {

enum class Policy { kRoundRobin, kWeighted, kAdaptive, kLatency, kSingle };
// Every policy with its name (MAESTRO_POLICY's values): the one place they
// are declared; parsing, policyName(), the knob's text and each scheduler's
// name() come from it.
struct PolicyName {
  Policy policy;
  const char* name;
};
inline constexpr PolicyName kPolicies[] = {{Policy::kRoundRobin, "round_robin"},
                                           {Policy::kWeighted, "weighted"},
                                           {Policy::kAdaptive, "adaptive"},
                                           {Policy::kLatency, "latency"},
                                           {Policy::kSingle, "single"}};
const char* policyName(Policy policy);

// The collectives' algorithms that MAESTRO_ALGO may force, each with the
// operation that has it: the one place they are declared (the knob's
// parser and text come from it; collectives/tuner.h maps the names to the
// algorithms and chooses among them when nothing is forced).
struct AlgorithmName {
  const char* op;
  const char* name;
};
inline constexpr AlgorithmName kAlgorithms[] = {{"allreduce", "ring"},
                                                {"allreduce", "recursive_doubling"},
                                                {"reduce", "ring"},
                                                {"reduce", "direct"},
                                                {"reduce", "tree"}};

// The knobs as resolved (defaults < MAESTRO_* environment < options). A
// group settles every "auto" once, at its set-up, where the facts are
// known: the mesh's (transport, vNICs, paths, discovery, TCP congestion
// control, single copy) in QpManager::plan, from what the ranks measured
// and agreed on; the rest (chunk sizes, scratch slots, the registration
// cache's bound, hunting) in EngineCore::settle(), by the rules below
// (chunkSizeFor, minChunkFor, scratchSlots, alltoallWindow, regCacheBytes). What the layers
// above read from Engine::config() is settled.
struct Config {
  LogLevel debug = LogLevel::kWarn;
  std::string transport = "auto";       // auto | tcp | verbs
  std::vector<std::string> vnics;       // local vNIC addresses (IP literals)
  std::string ifname;                   // take the vNICs from this interface
  int paths = 0;                        // paths per peer; 0 = auto (QpManager::plan, autoPathCount)
  size_t chunk_size = 0;                // bytes per chunk; 0 = auto: chunkSizeFor(transport)
  size_t min_chunk_size = 0;            // smallest chunk of a mid-size message; 0 = auto: minChunkFor
  Policy policy = Policy::kAdaptive;     // ACK clocking: faster paths carry more
  std::vector<double> weights;          // for policy=weighted (empty: measured)
  int window = 8;                       // chunks in flight per path (paper: 8 WRs)
  size_t segment_size = 1 << 20;        // pipeline unit of the collectives
  int scratch_slots = 0;                // reduce-scatter receive slots (credits); 0 = auto (scratchSlots)
  int alltoall_window = 0;              // all-to-all peers written to at once; 0 = auto (alltoallWindow)
  int exchange_window = 0;              // chunks a path holds of an exchange's messages; 0 = auto (tuner.h)
  // Forced algorithms, operation -> algorithm name (kAlgorithms); an
  // operation not in it: the tuner chooses (collectives/tuner.h).
  std::map<std::string, std::string> algo;
  size_t reg_cache_size = 256;          // registrations kept per group
  size_t reg_cache_bytes = 0;           // bytes they may cover when idle; 0 = auto (regCacheBytes)
  size_t small_msg = 4 * 1024;          // adaptive, latency: a message up to this size is latency-bound
  size_t eager_size = 64 * 1024;        // point to point: messages up to this size go eager (0: off)
  bool busy_poll = false;               // spin on the completion queue (verbs) / event loop (tcp)
  double path_timeout = 2.0;            // the backstop: seconds with chunks and no progress before a path is declared down
  double probe_interval = 0.5;          // seconds between probes of idle / down paths
  double peer_timeout = 10.0;           // seconds a waited-on peer may answer nothing on every path; 0 = off
  std::string metrics;                  // JSON-lines file of per-path counters ("" = none)
  double metrics_interval = 10.0;       // seconds between two metrics records
  std::string dump;                     // flight-recorder file written when a group fails ("" = none)
  double connect_timeout = 5.0;         // seconds a path may take to connect at start-up
  // lazy: ring neighbours and barrier partners at start-up, any other peer
  // on first use | eager: every peer at start-up (a full mesh).
  std::string connect = "lazy";
  // A subgroup's traffic runs on the paths the process already has to each
  // peer (its default group's), kept apart by channel; off: it opens its own.
  bool share_paths = true;
  // auto: CUDA tensors travel through pinned host slabs (c10d/staging.hpp) |
  // force: CPU tensors too (tests the staging without a GPU) | off: CUDA refused.
  std::string staging = "auto";
  // Pieces of a staged allreduce's copies (c10d/staging.hpp); 0: whole copies.
  size_t staging_piece = size_t(2) << 20;
  // off | ttl: find disjoint routes among candidate connections | auto: ttl
  // where a router answers a probe between ranks (the QP manager resolves it
  // to off or ttl at set-up).
  std::string discovery = "auto";
  int probe_ttl = 2;                    // hops from a host to the core (spine) layer
  int candidates = 8;                   // discovery: most candidate connections per wanted path
  std::string tcp_congestion = "auto";  // tcp: auto | kernel | a congestion control (net::chooseCongestion)
  std::string tcp_single_copy = "auto"; // tcp: auto (same-host peers: cross-memory attach) | off
  // tcp: the listeners' ports, [port_lo, port_hi]; 0, 0 = the kernel picks (ephemeral).
  uint16_t port_lo = 0, port_hi = 0;
  // Path hunting: a path persistently slower than its siblings is re-opened
  // from a source port that lands on another core route.
  std::string hunt = "auto";            // auto (on where discovery runs) | on | off
  double hunt_ratio = 0.6;              // slow: throughput below this share of its siblings' median
  double hunt_after = 3.0;              // seconds of busy time a path must stay slow before it is re-opened
  double hunt_interval = 10.0;          // seconds between re-openings of one path (doubling while they repeat)
  bool hunting() const { return hunt == "on" || (hunt == "auto" && discovery == "ttl"); }

  // name -> (value text, source: "default" | "env" | "options")
  std::map<std::string, std::pair<std::string, std::string>> provenance;

  // Resolve from defaults, the environment and explicit overrides
  // (Options field name -> value text). Throws maestro::Error naming the knob
  // for unknown names and bad values.
  static Config resolve(const std::map<std::string, std::string>& overrides = {});

  // The knobs that must be identical on every rank, as "name=value;...".
  std::string groupFingerprint() const;
  // The knob table with values and sources, one line per knob.
  std::string describe() const;
};

struct Knob {
  const char* name;           // Options field
  const char* env;            // environment variable
  const char* default_value;  // as text
  const char* doc;
  bool group_wide;            // must agree across ranks
  std::function<std::string(const Config&)> show;          // canonical value text
  std::function<void(Config&, const std::string&)> apply;  // parse, validate, store
};

const std::vector<Knob>& knobs();

// MAESTRO_CHUNK_SIZE=auto: the paper's 50 KiB on verbs, where a chunk costs
// one work request; 256 KiB on TCP, where each chunk costs system calls and
// an ACK frame on both sides (on a 2-core host 50 KiB chunks spent a fifth
// of the allreduce in that overhead, while on the lab every size from
// 12.5 to 400 KiB reached the same bandwidth).
size_t chunkSizeFor(const std::string& transport);

// MAESTRO_MIN_CHUNK_SIZE=auto: a message to a rank on another host shorter
// than one chunk per path is cut into one chunk per path, none smaller than
// this. On TCP 64 KiB: on the lab (4 ranks, 4 paths) the 1 and 2 MiB
// allreduces rise from 0.44 and 0.46 of the limit to 0.64 and 0.77
// (docs/results.md, "Mid-size messages"); in an unrecorded comparison 16 and
// 32 KiB were not clearly better. Ranks of one host never split (their paths
// share one memory bus; on loopback splitting cost a third at 1 MiB). On
// verbs the chunk size (off): not measured on a real NIC.
size_t minChunkFor(const std::string& transport, size_t chunk_size);

// MAESTRO_SCRATCH_SLOTS=auto: the reduce-scatter writer holds one credit per
// slot and gets it back from its right neighbour once the slot is reduced.
// In a ring of three or more that credit comes back on an otherwise idle
// direction, and 4 slots of a segment keep the paths busy (93 % of the lab's
// limit on 4 ranks). With two ranks the right neighbour is also the left
// one: the credit queues behind that peer's own reduce-scatter data (socket
// buffers, switch queues), and 4 slots left the lab's 2-rank allreduce at
// 0.78 of its limit, 16 at 0.90.
int scratchSlots(const Config& config, int group_size);
// The all-to-all's steps in flight: the knob, bounded by the group's n-1
// steps; auto: every step at once (each path's window bounds what it has in
// flight, to every peer alike).
int alltoallWindow(const Config& config, int group_size);

// MAESTRO_REG_CACHE_BYTES=auto: how many bytes the registrations a group's
// cache keeps while no operation uses them may cover. On verbs they are
// pinned, and pinned memory counts against RLIMIT_MEMLOCK, past which every
// registration (scratch buffers, the next tensor) fails: auto keeps them under
// half of that limit when it is finite, and does not bound them otherwise.
// `memlock` is the limit in bytes (RLIM_INFINITY: none). Registrations in use
// by a running operation are never dropped, whatever the bound.
size_t regCacheBytes(const Config& config, uint64_t memlock);

// Helpers shared by the parsers (exposed for tests).
size_t parseSize(const std::string& knob, const std::string& text);  // "51200", "50K", "1M"
std::vector<std::string> splitList(const std::string& text);         // comma separated, trimmed

}  // namespace maestro
