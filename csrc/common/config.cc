#include "common/config.h"

#include <arpa/inet.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "common/net.h"

namespace maestro {
namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

long long parseInt(const std::string& knob, const std::string& text, long long lo, long long hi) {
  std::string t = trim(text);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(t.c_str(), &end, 10);
  MAESTRO_CHECK(!t.empty() && end != nullptr && *end == '\0' && errno == 0, knob, "='", text,
                "' is not an integer");
  MAESTRO_CHECK(v >= lo && v <= hi, knob, "=", v, " is out of range [", lo, ", ", hi, "]");
  return v;
}

double parseNumber(const std::string& knob, const std::string& text, double lo, double hi, const char* what) {
  std::string t = trim(text);
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  MAESTRO_CHECK(!t.empty() && end != nullptr && *end == '\0' && std::isfinite(v), knob, "='",
                text, "' is not ", what);
  MAESTRO_CHECK(v >= lo && v <= hi, knob, "=", v, " is out of range [", lo, ", ", hi, "]");
  return v;
}

double parseSeconds(const std::string& knob, const std::string& text, double lo, double hi) {
  return parseNumber(knob, text, lo, hi, "a number of seconds");
}

double parseFraction(const std::string& knob, const std::string& text, double lo, double hi) {
  return parseNumber(knob, text, lo, hi, "a number");
}

bool parseBool(const std::string& knob, const std::string& text) {
  std::string t = lower(trim(text));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  fail(knob, "='", text, "' is not a boolean (use 0 or 1)");
}

std::string oneOf(const std::string& knob, const std::string& text,
                  const std::vector<std::string>& allowed) {
  std::string t = lower(trim(text));
  for (const auto& a : allowed)
    if (t == a) return a;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", " : "") + allowed[i];
  fail(knob, "='", text, "' is not one of ", list);
}

// MAESTRO_POLICY's text: the policies' names from kPolicies (a knob's text
// lives as long as the knob table).
const char* policyDoc() {
  static const std::string doc = [] {
    std::string d = "load balancer: ";
    for (size_t i = 0; i < std::size(kPolicies); ++i) d += strcat(i ? ", " : "", kPolicies[i].name);
    return d;
  }();
  return doc.c_str();
}

// MAESTRO_ALGO's text: the algorithms' names by operation, from kAlgorithms.
const char* algoDoc() {
  static const std::string doc = [] {
    std::string d = "the collectives' algorithms; auto: the tuner chooses per operation, size, group size and "
                    "transport (MAESTRO_DEBUG=INFO and describe() print its table); a name forces it on every "
                    "operation that has it, op:name on one (comma-separated). ";
    std::string op;
    for (const auto& a : kAlgorithms) {
      d += op == a.op ? strcat(", ", a.name) : strcat(op.empty() ? "" : "; ", a.op, ": ", a.name);
      op = a.op;
    }
    return d;
  }();
  return doc.c_str();
}

// MAESTRO_ALGO: "auto", or names and op:name pairs from kAlgorithms.
std::map<std::string, std::string> parseAlgo(const std::string& text) {
  std::map<std::string, std::string> out;
  const std::string t = lower(trim(text));
  if (t == "auto" || t.empty()) return out;
  for (const auto& item : splitList(t)) {
    const auto colon = item.find(':');
    const std::string op = colon == std::string::npos ? "" : trim(item.substr(0, colon));
    const std::string name = colon == std::string::npos ? item : trim(item.substr(colon + 1));
    bool known_op = op.empty(), any = false;
    for (const auto& a : kAlgorithms) {
      known_op = known_op || op == a.op;
      if (name != a.name || (!op.empty() && op != a.op)) continue;
      MAESTRO_CHECK(!out.count(a.op) || out[a.op] == name, "MAESTRO_ALGO='", text, "' forces two algorithms on ",
                    a.op);
      out[a.op] = name;
      any = true;
    }
    MAESTRO_CHECK(known_op, "MAESTRO_ALGO='", text, "': '", op, "' is not an operation with a choice of algorithm (",
                  algoDoc(), ")");
    MAESTRO_CHECK(any, "MAESTRO_ALGO='", text, "': '", name, "' is not an algorithm", op.empty() ? "" : " of ", op,
                  " (", algoDoc(), ")");
  }
  return out;
}

std::string showAlgo(const std::map<std::string, std::string>& algo) {
  if (algo.empty()) return "auto";
  std::string out;
  for (const auto& [op, name] : algo) out += strcat(out.empty() ? "" : ",", op, ":", name);
  return out;
}

bool isIpLiteral(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + v[i];
  return out;
}

std::string levelText(LogLevel level) {
  switch (level) {
    case LogLevel::kNone: return "NONE";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
  }
  return "?";
}

std::string joinDoubles(const std::vector<double>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

// Knobs whose value is "auto" or a number, with 0 standing for auto in the
// Config (settled at the group's set-up: config.h).
template <typename T>
std::string autoOrNumber(T value) {
  return value == 0 ? std::string("auto") : std::to_string(value);
}

template <typename T, typename Parse>
void setAutoOrNumber(T& field, const std::string& text, Parse parse) {
  field = trim(text) == "auto" ? T{0} : static_cast<T>(parse(text));
}

// A chunk size knob: "auto", or bytes (K/M suffixes), a multiple of 64
// between 4 KiB and 64 MiB.
void setChunkBytes(size_t& field, const char* env, const std::string& text) {
  setAutoOrNumber(field, text, [env](const std::string& v) {
    size_t s = parseSize(env, v);
    MAESTRO_CHECK(s >= 4096 && s <= (64u << 20) && s % 64 == 0, env, "=", s,
                  " must be a multiple of 64 between 4096 and 64M");
    return s;
  });
}

// Which transport, which vNICs, how many paths.
std::vector<Knob> pathKnobs() {
  return {
      {"debug", "MAESTRO_DEBUG", "WARN", "log level: NONE, WARN, INFO (knobs, path table, stats), TRACE",
       false, [](const Config& c) { return levelText(c.debug); },
       [](Config& c, const std::string& v) { c.debug = parseLogLevel(trim(v)); }},
      {"transport", "MAESTRO_TRANSPORT", "auto",
       "auto (verbs when an RDMA device has a GID for every vNIC, else tcp), tcp, verbs", true,
       [](const Config& c) { return c.transport; },
       [](Config& c, const std::string& v) {
         c.transport = oneOf("MAESTRO_TRANSPORT", v, {"auto", "tcp", "verbs"});
       }},
      {"vnics", "MAESTRO_VNICS", "",
       "comma-separated local vNIC addresses (IP aliases), one path each; default: loopback "
       "127.0.0.1-4 when all ranks share one host, else the one address that reaches MASTER_ADDR (refused if "
       "it is a loopback one)",
       false,
       [](const Config& c) { return join(c.vnics); },
       [](Config& c, const std::string& v) {
         c.vnics = splitList(v);
         for (const auto& a : c.vnics)
           MAESTRO_CHECK(isIpLiteral(a), "MAESTRO_VNICS: '", a, "' is not an IP address");
       }},
      {"ifname", "MAESTRO_IFNAME", "", "take the vNIC addresses from this interface's addresses",
       false, [](const Config& c) { return c.ifname; },
       [](Config& c, const std::string& v) { c.ifname = trim(v); }},
      {"paths", "MAESTRO_PATHS", "auto",
       "paths per peer, up to 64 (more than the vNICs reuses them with new source ports); auto: one per vNIC, or "
       "one per core hop the set-up's route probes find where routers hash flows over more spines than there are "
       "vNICs (at most 16; one per vNIC where MAESTRO_WEIGHTS is set)",
       true, [](const Config& c) { return autoOrNumber(c.paths); },
       [](Config& c, const std::string& v) {
         setAutoOrNumber(c.paths, v, [](const std::string& t) { return parseInt("MAESTRO_PATHS", t, 0, 64); });
       }},
  };
}

// How messages are cut and spread over the paths, and the buffers they use.
std::vector<Knob> schedulingKnobs() {
  return {
      {"chunk_size", "MAESTRO_CHUNK_SIZE", "auto",
       "bytes per chunk, the unit spread over paths (K/M suffixes; multiple of 64); auto: 50K on verbs, "
       "256K on tcp",
       true, [](const Config& c) { return autoOrNumber(c.chunk_size); },
       [](Config& c, const std::string& v) { setChunkBytes(c.chunk_size, "MAESTRO_CHUNK_SIZE", v); }},
      {"min_chunk_size", "MAESTRO_MIN_CHUNK_SIZE", "auto",
       "smallest chunk of a mid-size message: a message to a rank on another host shorter than one chunk per "
       "path is cut into one chunk per path, none smaller than this, so it still uses every path; a ring across "
       "hosts whose blocks are at most this per path sends them in messages of this size, each forwarded as it "
       "lands; all-to-all, gather and scatter cut their messages to another host into chunks of this size, so "
       "that every path's last chunk ends at about the same time (K/M suffixes; multiple of 64); auto: 64K on "
       "tcp, the chunk size (off) on verbs; at least the chunk size: off",
       true, [](const Config& c) { return autoOrNumber(c.min_chunk_size); },
       [](Config& c, const std::string& v) { setChunkBytes(c.min_chunk_size, "MAESTRO_MIN_CHUNK_SIZE", v); }},
      {"policy", "MAESTRO_POLICY", "adaptive", policyDoc(), true,
       [](const Config& c) { return std::string(policyName(c.policy)); },
       [](Config& c, const std::string& v) {
         std::vector<std::string> names;
         for (const auto& p : kPolicies) names.push_back(p.name);
         const std::string name = oneOf("MAESTRO_POLICY", v, names);
         for (const auto& p : kPolicies)
           if (name == p.name) c.policy = p.policy;
       }},
      {"weights", "MAESTRO_WEIGHTS", "",
       "policy=weighted: comma-separated relative path weights (empty: measured throughput)",
       false,
       [](const Config& c) { return joinDoubles(c.weights); },
       [](Config& c, const std::string& v) {
         c.weights.clear();
         for (const auto& w : splitList(v)) {
           char* end = nullptr;
           double d = std::strtod(w.c_str(), &end);
           MAESTRO_CHECK(end && *end == '\0' && std::isfinite(d) && d >= 0, "MAESTRO_WEIGHTS: '",
                         w, "' is not a non-negative number");
           c.weights.push_back(d);
         }
       }},
      {"window", "MAESTRO_WINDOW", "8", "chunks in flight per path (paper: 8 outstanding WRs)",
       false, [](const Config& c) { return std::to_string(c.window); },
       [](Config& c, const std::string& v) {
         c.window = static_cast<int>(parseInt("MAESTRO_WINDOW", v, 1, 1024));
       }},
      {"segment_size", "MAESTRO_SEGMENT_SIZE", "1M",
       "collective pipeline segment (reduce one while the next arrives); grown for huge tensors",
       true,
       [](const Config& c) { return std::to_string(c.segment_size); },
       [](Config& c, const std::string& v) {
         size_t s = parseSize("MAESTRO_SEGMENT_SIZE", v);
         MAESTRO_CHECK(s >= 4096 && s <= (1u << 30) && s % 64 == 0, "MAESTRO_SEGMENT_SIZE=", s,
                       " must be a multiple of 64 between 4096 and 1G");
         c.segment_size = s;
       }},
      {"scratch_slots", "MAESTRO_SCRATCH_SLOTS", "auto",
       "reduce-scatter receive slots per group = credits the writer holds; auto: 4, or 16 in a group of two "
       "ranks, whose credits come back behind the peer's own data",
       true,
       [](const Config& c) { return autoOrNumber(c.scratch_slots); },
       [](Config& c, const std::string& v) {
         setAutoOrNumber(c.scratch_slots, v,
                         [](const std::string& v) { return parseInt("MAESTRO_SCRATCH_SLOTS", v, 2, 256); });
       }},
      {"alltoall_window", "MAESTRO_ALLTOALL_WINDOW", "auto",
       "all-to-all steps in flight per rank (peers it writes to at once, each step a permutation); auto: every "
       "step, each path's window bounding its chunks in flight",
       false,
       [](const Config& c) { return autoOrNumber(c.alltoall_window); },
       [](Config& c, const std::string& v) {
         setAutoOrNumber(c.alltoall_window, v,
                         [](const std::string& v) { return parseInt("MAESTRO_ALLTOALL_WINDOW", v, 1, 1 << 20); });
       }},
      {"algo", "MAESTRO_ALGO", "auto", algoDoc(), true, [](const Config& c) { return showAlgo(c.algo); },
       [](Config& c, const std::string& v) { c.algo = parseAlgo(v); }},
      {"exchange_window", "MAESTRO_EXCHANGE_WINDOW", "auto",
       "chunks of all-to-all's, gather's and scatter's messages a path holds at once (MAESTRO_WINDOW bounds it "
       "too): every pair's block is in flight together, and with fewer chunks a path the rest are placed as "
       "completions say which path drains first; auto: 2 where the group spans hosts, the path window on one host",
       false, [](const Config& c) { return autoOrNumber(c.exchange_window); },
       [](Config& c, const std::string& v) {
         setAutoOrNumber(c.exchange_window, v,
                         [](const std::string& v) { return parseInt("MAESTRO_EXCHANGE_WINDOW", v, 1, 1024); });
       }},
      {"reg_cache_size", "MAESTRO_REG_CACHE_SIZE", "256", "memory registrations cached per group",
       false, [](const Config& c) { return std::to_string(c.reg_cache_size); },
       [](Config& c, const std::string& v) {
         c.reg_cache_size = static_cast<size_t>(parseInt("MAESTRO_REG_CACHE_SIZE", v, 1, 1 << 20));
       }},
      {"reg_cache_bytes", "MAESTRO_REG_CACHE_BYTES", "auto",
       "bytes the cached registrations of a group may cover while no operation uses them (least recently used "
       "go first); auto: half of RLIMIT_MEMLOCK where it is finite (verbs pins them), else unbounded",
       false,
       [](const Config& c) { return autoOrNumber(c.reg_cache_bytes); },
       [](Config& c, const std::string& v) {
         setAutoOrNumber(c.reg_cache_bytes, v, [](const std::string& v) {
           size_t s = parseSize("MAESTRO_REG_CACHE_BYTES", v);
           MAESTRO_CHECK(s > 0, "MAESTRO_REG_CACHE_BYTES must be auto or a positive size, got '", v, "'");
           return s;
         });
       }},
      {"small_msg", "MAESTRO_SMALL_MSG", "4K",
       "policy=adaptive: a message up to this many bytes goes whole to the idle path with the lowest RTT (none "
       "idle: in turn); policy=latency: to the lowest-RTT path, idle or not", true,
       [](const Config& c) { return std::to_string(c.small_msg); },
       [](Config& c, const std::string& v) { c.small_msg = parseSize("MAESTRO_SMALL_MSG", v); }},
      {"eager_size", "MAESTRO_EAGER_SIZE", "64K",
       "point to point: a message up to this many bytes is written at once into a slot its receiver lends the "
       "sender, and copied out when a recv takes it, without the READY/GRANT round trip before the data; larger "
       "ones, and any while every slot is taken, wait for the receiver's buffer (K/M suffixes; at most 1M; 0: off)",
       false, [](const Config& c) { return std::to_string(c.eager_size); },
       [](Config& c, const std::string& v) {
         const size_t s = parseSize("MAESTRO_EAGER_SIZE", v);
         MAESTRO_CHECK(s <= (size_t(1) << 20), "MAESTRO_EAGER_SIZE=", s, " is out of range [0, 1M]");
         c.eager_size = s;
       }},
      {"busy_poll", "MAESTRO_BUSY_POLL", "0",
       "spin instead of sleeping while waiting for completions (verbs: the completion queue; tcp: the "
       "process's event loop, while any of its groups asks): lower latency, one core kept busy", false,
       [](const Config& c) { return std::string(c.busy_poll ? "1" : "0"); },
       [](Config& c, const std::string& v) { c.busy_poll = parseBool("MAESTRO_BUSY_POLL", v); }},
  };
}

// When a path or a peer counts as failed; how pairs connect.
std::vector<Knob> failureKnobs() {
  return {
      {"path_timeout", "MAESTRO_PATH_TIMEOUT", "2",
       "the backstop: seconds a path may hold chunks without progress before it is declared down whatever else (a blackholed TCP path is found sooner, from its ACKs; an idle path: twice this without an answer to its probe)", false,
       [](const Config& c) { return strcat(c.path_timeout); },
       [](Config& c, const std::string& v) {
         c.path_timeout = parseSeconds("MAESTRO_PATH_TIMEOUT", v, 0.05, 3600);
       }},
      {"peer_timeout", "MAESTRO_PEER_TIMEOUT", "10",
       "seconds a peer that an operation waits on may answer nothing on any of its paths -- no data, no "
       "completion, no answer to the probes -- before its operations fail (a stopped process, a hung host, every "
       "route to it lost); 0: wait for the operation's own timeout", false,
       [](const Config& c) { return strcat(c.peer_timeout); },
       [](Config& c, const std::string& v) {
         c.peer_timeout = parseSeconds("MAESTRO_PEER_TIMEOUT", v, 0, 86400);
         MAESTRO_CHECK(c.peer_timeout == 0 || c.peer_timeout >= 0.5,
                       "MAESTRO_PEER_TIMEOUT must be 0 (off) or at least 0.5 s, got '", v, "'");
       }},
      {"connect_timeout", "MAESTRO_CONNECT_TIMEOUT", "5",
       "seconds a path may take to connect (at start-up or on first use); a path that does not starts down and is "
       "retried", false,
       [](const Config& c) { return strcat(c.connect_timeout); },
       [](Config& c, const std::string& v) {
         c.connect_timeout = parseSeconds("MAESTRO_CONNECT_TIMEOUT", v, 0.05, 3600);
       }},
      {"connect", "MAESTRO_CONNECT", "lazy",
       "lazy: connect to the ring neighbours and the barrier's partners (2^k ranks away) at start-up, and to any "
       "other rank when an operation first needs it (point to point, all-to-all, gather, scatter, a reduce of up "
       "to 64 KiB); eager: to every rank at start-up (a full mesh)",
       true, [](const Config& c) { return c.connect; },
       [](Config& c, const std::string& v) { c.connect = oneOf("MAESTRO_CONNECT", v, {"lazy", "eager"}); }},
      {"share_paths", "MAESTRO_SHARE_PATHS", "1",
       "a subgroup (new_group, split_group, DeviceMesh) sends on the paths the process already has to each peer, "
       "its traffic kept apart by group, where its path knobs match the default group's; 0: it opens its own",
       true, [](const Config& c) { return std::string(c.share_paths ? "1" : "0"); },
       [](Config& c, const std::string& v) { c.share_paths = parseBool("MAESTRO_SHARE_PATHS", v); }},
  };
}

// CUDA tensors through host memory.
std::vector<Knob> stagingKnobs() {
  return {
      {"staging", "MAESTRO_STAGING", "auto",
       "auto: CUDA tensors travel through pinned host slabs registered once (copies on a side stream, stream "
       "order as NCCL's); force: CPU tensors take the same steps (a test of the staging without a GPU); off: "
       "CUDA tensors are refused",
       false, [](const Config& c) { return c.staging; },
       [](Config& c, const std::string& v) { c.staging = oneOf("MAESTRO_STAGING", v, {"auto", "force", "off"}); }},
      {"staging_piece", "MAESTRO_STAGING_PIECE", "2M",
       "a staged allreduce's copies in and back are cut into pieces of this size, so that the ring sends the first "
       "while the next are copied and each part goes back as soon as it is final; 0: copy the whole tensor in "
       "before the operation and back after it",
       false, [](const Config& c) { return std::to_string(c.staging_piece); },
       [](Config& c, const std::string& v) {
         size_t s = parseSize("MAESTRO_STAGING_PIECE", v);
         MAESTRO_CHECK(s == 0 || (s >= 4096 && s <= (size_t(1) << 30)), "MAESTRO_STAGING_PIECE=", s,
                       " must be 0 (whole copies) or between 4096 and 1G");
         c.staging_piece = s;
       }},
  };
}

// Routes: discovery, TCP congestion control and ports, single copy, hunting, probes.
std::vector<Knob> routeKnobs() {
  return {
      {"discovery", "MAESTRO_DISCOVERY", "auto",
       "ttl: open candidate connections, learn each one's core hop with TTL-limited probes on its own 5-tuple, "
       "keep one per distinct hop (for ECMP-hashed networks); auto: ttl when a probe from some rank towards its "
       "ring neighbour is answered by a router MAESTRO_PROBE_TTL hops out (tcp only), else off; off",
       true, [](const Config& c) { return c.discovery; },
       [](Config& c, const std::string& v) { c.discovery = oneOf("MAESTRO_DISCOVERY", v, {"auto", "off", "ttl"}); }},
      {"probe_ttl", "MAESTRO_PROBE_TTL", "2", "discovery: hops from a host to the routers that tell the paths apart",
       true, [](const Config& c) { return std::to_string(c.probe_ttl); },
       [](Config& c, const std::string& v) { c.probe_ttl = static_cast<int>(parseInt("MAESTRO_PROBE_TTL", v, 1, 64)); }},
      {"candidates", "MAESTRO_CANDIDATES", "8",
       "discovery: at most this many candidate connections per wanted path (opened in rounds until enough "
       "distinct hops are found)",
       true, [](const Config& c) { return std::to_string(c.candidates); },
       [](Config& c, const std::string& v) {
         c.candidates = static_cast<int>(parseInt("MAESTRO_CANDIDATES", v, 1, 64));
       }},
      {"tcp_congestion", "MAESTRO_TCP_CONGESTION", "auto",
       "tcp: congestion control of every path's socket: auto (the kernel's default, unless that is bbr, "
       "which loses heavily on shallow switch buffers: then cubic, or reno where cubic is not allowed), "
       "kernel (the kernel's default), or a name such as cubic or dctcp (see docs/performance.md)",
       false, [](const Config& c) { return c.tcp_congestion; },
       [](Config& c, const std::string& v) {
         const std::string name = trim(v);
         MAESTRO_CHECK(!name.empty(), "MAESTRO_TCP_CONGESTION is empty: give auto, kernel or a congestion control");
         if (name != "auto" && name != "kernel") net::checkCongestion(name, "MAESTRO_TCP_CONGESTION");
         c.tcp_congestion = name;
       }},
      {"port_range", "MAESTRO_PORT_RANGE", "",
       "tcp: the ports the listeners bind, FIRST-LAST (e.g. 40000-40999), for a firewall to open: each rank "
       "takes one free port per vNIC, and a subgroup that opens its own paths one more per vNIC; connections "
       "still leave from ephemeral ports. Empty = the kernel picks (net.ipv4.ip_local_port_range); verbs: "
       "not used (RoCE's connections travel as UDP to port 4791)",
       false,
       [](const Config& c) { return c.port_lo == 0 ? std::string() : strcat(c.port_lo, "-", c.port_hi); },
       [](Config& c, const std::string& v) {
         const std::string t = trim(v);
         if (t.empty()) {
           c.port_lo = c.port_hi = 0;
           return;
         }
         const size_t dash = t.find('-');
         MAESTRO_CHECK(dash != std::string::npos, "MAESTRO_PORT_RANGE='", v,
                       "' is not a range of ports: give FIRST-LAST, e.g. 40000-40999");
         const int64_t lo = parseInt("MAESTRO_PORT_RANGE", t.substr(0, dash), 1, 65535);
         const int64_t hi = parseInt("MAESTRO_PORT_RANGE", t.substr(dash + 1), 1, 65535);
         MAESTRO_CHECK(lo <= hi, "MAESTRO_PORT_RANGE='", v, "': the first port is above the last");
         c.port_lo = static_cast<uint16_t>(lo);
         c.port_hi = static_cast<uint16_t>(hi);
       }},
      {"tcp_single_copy", "MAESTRO_TCP_SINGLE_COPY", "auto",
       "tcp: auto = a peer that proves it is a process of this host, in this network namespace, gets "
       "write payloads by reference and copies them straight from the sender's memory (process_vm_readv: one "
       "copy, no TCP stack; needs the kernel to let the ranks read each other, as for ptrace); off = payloads "
       "always cross the socket",
       false, [](const Config& c) { return c.tcp_single_copy; },
       [](Config& c, const std::string& v) {
         c.tcp_single_copy = oneOf("MAESTRO_TCP_SINGLE_COPY", v, {"auto", "off"});
       }},
      {"hunt", "MAESTRO_HUNT", "auto",
       "path hunting: re-open a path that stays much slower than its siblings from a source port that ECMP "
       "hashes onto another core route (predicted by discovery's probes; blind re-hash without discovery); "
       "auto = on where discovery runs, on, off",
       true, [](const Config& c) { return c.hunt; },
       [](Config& c, const std::string& v) { c.hunt = oneOf("MAESTRO_HUNT", v, {"auto", "on", "off"}); }},
      {"hunt_ratio", "MAESTRO_HUNT_RATIO", "0.6",
       "path hunting: a path is slow while its delivery rate while busy is below this share of its siblings' "
       "median",
       true, [](const Config& c) { return strcat(c.hunt_ratio); },
       [](Config& c, const std::string& v) { c.hunt_ratio = parseFraction("MAESTRO_HUNT_RATIO", v, 0.05, 0.95); }},
      {"hunt_after", "MAESTRO_HUNT_AFTER", "3",
       "path hunting: seconds of busy time a path must be slow, more than it was fine meanwhile, before it is "
       "re-opened", true,
       [](const Config& c) { return strcat(c.hunt_after); },
       [](Config& c, const std::string& v) { c.hunt_after = parseSeconds("MAESTRO_HUNT_AFTER", v, 0.1, 3600); }},
      {"hunt_interval", "MAESTRO_HUNT_INTERVAL", "10",
       "path hunting: seconds at least between two re-openings of one path; doubles (up to 16x) while a "
       "path keeps being slow after re-opening, so hunting never flaps",
       true, [](const Config& c) { return strcat(c.hunt_interval); },
       [](Config& c, const std::string& v) {
         c.hunt_interval = parseSeconds("MAESTRO_HUNT_INTERVAL", v, 0.1, 86400);
       }},
      {"probe_interval", "MAESTRO_PROBE_INTERVAL", "0.5",
       "seconds between RTT probes of idle paths and reconnect attempts of down paths", false,
       [](const Config& c) { return strcat(c.probe_interval); },
       [](Config& c, const std::string& v) {
         c.probe_interval = parseSeconds("MAESTRO_PROBE_INTERVAL", v, 0.01, 3600);
       }},
  };
}

// What the engine writes out: metrics, dumps.
std::vector<Knob> reportKnobs() {
  return {
      {"metrics", "MAESTRO_METRICS", "",
       "append every path's counters (path_stats() fields) as JSON lines to this file every "
       "MAESTRO_METRICS_INTERVAL seconds (on the path monitor's tick: 0.5 s at the finest by default) and as the "
       "group goes; {rank} and {group} in the name become this rank in its group and the group's channel "
       "(without them the ranks of a host share the file); empty = off",
       false, [](const Config& c) { return c.metrics; }, [](Config& c, const std::string& v) { c.metrics = trim(v); }},
      {"dump", "MAESTRO_DUMP", "",
       "when an operation fails or times out (the group is then unusable), write the group's flight record -- "
       "its last 64 operations with their states, times and errors, and every path's counters -- as JSON to "
       "this file ({rank} and {group} as for MAESTRO_METRICS); maestro_torch.dump() returns the same at any "
       "time; empty = off",
       false, [](const Config& c) { return c.dump; }, [](Config& c, const std::string& v) { c.dump = trim(v); }},
      {"metrics_interval", "MAESTRO_METRICS_INTERVAL", "10", "seconds between two MAESTRO_METRICS records", false,
       [](const Config& c) { return strcat(c.metrics_interval); },
       [](Config& c, const std::string& v) {
         c.metrics_interval = parseSeconds("MAESTRO_METRICS_INTERVAL", v, 0.1, 86400);
       }},
  };
}

std::vector<Knob> buildKnobs() {
  std::vector<Knob> knobs;
  for (auto group : {pathKnobs, schedulingKnobs, failureKnobs, stagingKnobs, routeKnobs, reportKnobs}) {
    std::vector<Knob> more = group();
    knobs.insert(knobs.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return knobs;
}

}  // namespace

size_t chunkSizeFor(const std::string& transport) { return transport == "verbs" ? 50 * 1024 : 256 * 1024; }

size_t minChunkFor(const std::string& transport, size_t chunk_size) {
  return transport == "tcp" ? std::min<size_t>(64 * 1024, chunk_size) : chunk_size;
}

int scratchSlots(const Config& config, int group_size) {
  if (config.scratch_slots > 0) return config.scratch_slots;
  return group_size == 2 ? 16 : 4;
}

int alltoallWindow(const Config& config, int group_size) {
  const int steps = std::max(1, group_size - 1);
  return config.alltoall_window > 0 ? std::min(config.alltoall_window, steps) : steps;
}

size_t regCacheBytes(const Config& config, uint64_t memlock) {
  if (config.reg_cache_bytes > 0) return config.reg_cache_bytes;
  if (memlock == static_cast<uint64_t>(RLIM_INFINITY)) return std::numeric_limits<size_t>::max();
  return static_cast<size_t>(std::max<uint64_t>(memlock / 2, 1));
}

const char* policyName(Policy policy) {
  for (const auto& p : kPolicies)
    if (p.policy == policy) return p.name;
  return "?";
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = buildKnobs();
  return table;
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(text);
  while (std::getline(is, cur, ',')) {
    cur = trim(cur);
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

size_t parseSize(const std::string& knob, const std::string& text) {
  std::string t = trim(text);
  MAESTRO_CHECK(!t.empty(), knob, " is empty");
  size_t mult = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? 1024 : last == 'M' ? (1u << 20) : (1u << 30);
    t.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  MAESTRO_CHECK(!t.empty() && t[0] != '-' && end && *end == '\0' && errno == 0, knob, "='", text,
                "' is not a size (bytes, optionally with K, M or G)");
  return static_cast<size_t>(v) * mult;
}

Config Config::resolve(const std::map<std::string, std::string>& overrides) {
  for (const auto& kv : overrides) {
    bool known = false;
    for (const auto& k : knobs()) known = known || kv.first == k.name;
    if (!known) {
      std::string list;
      for (const auto& k : knobs()) list += std::string(list.empty() ? "" : ", ") + k.name;
      fail("unknown maestro option '", kv.first, "' (known: ", list, ")");
    }
  }
  Config c;
  for (const auto& k : knobs()) {
    std::string value = k.default_value, source = "default";
    if (const char* env = std::getenv(k.env)) {
      value = env;
      source = "env";
    }
    auto it = overrides.find(k.name);
    if (it != overrides.end()) {
      value = it->second;
      source = "options";
    }
    try {
      k.apply(c, value);
    } catch (const Error& e) {
      // Name the knob the way the user set it.
      std::string msg = e.what();
      if (source == "options") msg = strcat("Options(", k.name, "=...): ", msg);
      throw Error(msg);
    }
    c.provenance[k.name] = {value, source};
  }
  if (c.policy == Policy::kWeighted && !c.weights.empty() && c.paths > 0)
    MAESTRO_CHECK(static_cast<int>(c.weights.size()) == c.paths, "MAESTRO_WEIGHTS has ",
                  c.weights.size(), " weights but MAESTRO_PATHS=", c.paths);
  MAESTRO_CHECK(c.segment_size >= c.chunk_size, "MAESTRO_SEGMENT_SIZE (", c.segment_size,
                ") must be at least MAESTRO_CHUNK_SIZE (", c.chunk_size, ")");
  setLogLevel(c.debug);
  return c;
}

std::string Config::groupFingerprint() const {
  std::string out;
  for (const auto& k : knobs())
    if (k.group_wide) out += strcat(k.name, "=", k.show(*this), ";");
  return out;
}

std::string Config::describe() const {
  std::ostringstream os;
  for (const auto& k : knobs()) {
    auto it = provenance.find(k.name);
    std::string value = k.show(*this);
    os << "  " << k.env << "=" << (value.empty() ? "(unset)" : value) << "  ["
       << (it == provenance.end() ? "" : it->second.second) << "]  " << k.doc << "\n";
  }
  return os.str();
}

}  // namespace maestro
