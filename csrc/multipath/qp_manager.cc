#include "multipath/qp_manager.h"

#include "multipath/discovery.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/net.h"
#include "common/thread.h"
#include "common/random.h"

namespace maestro {
namespace multipath {
namespace {

// Every step of the start-up, in order; an error is published under all of
// them so that a peer waiting at any step sees it.
const std::vector<std::string> kSteps = {"host", "config", "vnics", "secret", "transport", "routed", "endpoints"};

std::string hex(const uint8_t* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[data[i] >> 4]);
    s.push_back(digits[data[i] & 15]);
  }
  return s;
}

void unhex(const std::string& s, uint8_t* out, size_t n) {
  MAESTRO_CHECK(s.size() == 2 * n, "malformed group secret in the store");
  auto val = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(val(s[2 * i]) << 4 | val(s[2 * i + 1]));
}

std::string key(const std::string& step, int rank) { return strcat("maestro/", step, "/", rank); }

// Discovery's key of pair (a, b), either way round.
int pairKey(int a, int b, int size) { return std::min(a, b) * size + std::max(a, b); }

// Pair (a, b)'s first n candidates as the probes of both directions found
// them ("" where a probe got no answer).
std::vector<Candidate> candidatesOf(const std::vector<std::string>& fwd, const std::vector<std::string>& bwd, int n) {
  std::vector<Candidate> cands(n);
  for (int c = 0; c < n; ++c) {
    if (c < static_cast<int>(fwd.size())) cands[c].forward = fwd[c];
    if (c < static_cast<int>(bwd.size())) cands[c].backward = bwd[c];
  }
  return cands;
}

// Which directions of pair (a, b), a < b, must be disjoint: a ring
// neighbour's ring direction (both with two ranks); both where the two are
// not neighbours, since any operation may use either.
void directionsOf(int a, int b, int size, bool* forward, bool* backward) {
  *forward = b == (a + 1) % size || size == 2;
  *backward = a == (b + 1) % size || size == 2;
  if (!*forward && !*backward) *forward = *backward = true;
}

}  // namespace

std::vector<RankPair> QpManager::startUpPairs(int size, bool eager) {
  auto atStart = [&](int a, int b) {
    if (eager) return true;
    for (int d = 1; d < size; d *= 2)
      if ((a + d) % size == b || (b + d) % size == a) return true;
    return false;
  };
  std::vector<RankPair> pairs;
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b)
      if (atStart(a, b)) pairs.emplace_back(a, b);
  return pairs;
}

QpManager::QpManager(Rendezvous& store, int rank, int size, Deadline deadline)
    : store_(store), rank_(rank), size_(size), deadline_(deadline) {}

void QpManager::publishError(const std::string& message) {
  // Under every step not yet published, and the rounds of the connection
  // phase: a peer waiting at any of them sees the error.
  std::vector<std::string> steps = kSteps;
  steps.push_back("connected");
  for (int round = 0; round < 64; ++round) {
    steps.push_back(strcat("candidates.", round));
    steps.push_back(strcat("routes.", round));
  }
  for (const auto& step : steps) {
    bool done = false;
    for (const auto& p : published_) done = done || p == step;
    if (!done) store_.set(key(step, rank_), "error:" + message);
  }
  // Rank 0 usually hosts the store (torchrun, env://): if it exited now, the
  // others would lose the store before reading why and report a network
  // error instead. Let them fail with the message first (bounded wait).
  store_.set(key("failed", rank_), "1");
  if (rank_ != 0) return;
  auto until = std::min(deadline_, Clock::now() + std::chrono::seconds(10));
  for (int r = 1; r < size_; ++r) {
    std::string ignored;
    while (!store_.tryGet(key("failed", r), &ignored) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> QpManager::allGather(const std::string& step, const std::string& value) {
  store_.set(key(step, rank_), "ok:" + value);
  published_.push_back(step);
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) {
    std::string v = r == rank_ ? "ok:" + value : store_.get(key(step, r), deadline_);
    if (v.rfind("error:", 0) == 0) throw Error(strcat("rank ", r, " failed to join the maestro group: ", v.substr(6)));
    MAESTRO_CHECK(v.rfind("ok:", 0) == 0, "malformed maestro start-up record from rank ", r);
    out[r] = v.substr(3);
  }
  return out;
}

Config QpManager::agreeOnConfig(const std::map<std::string, std::string>& overrides) {
  Config config;
  try {
    config = Config::resolve(overrides);
  } catch (const Error& e) {
    publishError(e.what());
    throw;
  }
  try {
    std::vector<std::string> prints = allGather("config", config.groupFingerprint());
    for (int r = 0; r < size_; ++r) {
      if (prints[r] == prints[0]) continue;
      // Name the knobs that differ.
      std::string diff;
      auto split = [](const std::string& s) {
        std::vector<std::string> v;
        size_t b = 0, e;
        while ((e = s.find(';', b)) != std::string::npos) {
          v.push_back(s.substr(b, e - b));
          b = e + 1;
        }
        return v;
      };
      auto a = split(prints[0]), b = split(prints[r]);
      for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        if (a[i] != b[i]) diff += strcat(diff.empty() ? "" : ", ", "rank 0 has ", a[i], " but rank ", r, " has ", b[i]);
      fail("maestro options must be the same on every rank: ", diff);
    }
  } catch (const Error& e) {
    publishError(e.what());
    throw;
  }
  return config;
}

Mesh QpManager::plan(const Config& config, const std::string& rendezvous_host) {
  Mesh mesh;
  try {
    // Do all ranks share this host (and network namespace)?
    std::vector<std::string> hosts = allGather("host", net::hostIdentity());
    bool one_host = true;
    for (const auto& h : hosts) one_host = one_host && h == hosts[rank_];
    mesh.hosts = hosts;

    mesh.vnics = chooseVnics(config, one_host, rendezvous_host);
    std::string mine;
    for (const auto& a : mesh.vnics.addresses) mine += (mine.empty() ? "" : ",") + a;
    std::vector<std::string> all_vnics = allGather("vnics", mine);
    for (const auto& v : all_vnics) mesh.peer_vnics.push_back(splitList(v));
    int vnic_paths = static_cast<int>(mesh.vnics.addresses.size());
    for (const auto& v : all_vnics) vnic_paths = std::min<int>(vnic_paths, static_cast<int>(splitList(v).size()));
    MAESTRO_CHECK(vnic_paths >= 1, "no vNIC addresses: set MAESTRO_VNICS or MAESTRO_IFNAME");
    mesh.paths = config.paths > 0 ? config.paths : vnic_paths;
    mesh.paths_why = config.paths > 0 ? "MAESTRO_PATHS" : "auto: one per vNIC";

    transport::TransportOptions& options = mesh.options;
    options.rank = rank_;
    options.world_size = size_;
    options.max_inflight_per_path = config.window;
    options.busy_poll = config.busy_poll;
    options.tcp_congestion = net::chooseCongestion(config.tcp_congestion, &mesh.congestion_why);
    options.single_copy = config.tcp_single_copy == "auto";
    options.port_lo = config.port_lo;
    options.port_hi = config.port_hi;
    std::string secret_hex;
    if (rank_ == 0) {
      for (size_t i = 0; i < options.secret.size(); i += 8) {
        uint64_t r = randomU64();
        std::memcpy(options.secret.data() + i, &r, 8);
      }
      secret_hex = hex(options.secret.data(), options.secret.size());
    }
    // Everyone publishes under "secret" (errors travel there); only rank 0's
    // value is used.
    std::vector<std::string> secrets = allGather("secret", secret_hex);
    unhex(secrets[0], options.secret.data(), options.secret.size());

    // Transport: verbs only if every rank can use it (auto), else tcp.
    std::string why;
    std::string kind = transport::chooseTransport(config.transport, mesh.vnics.addresses, &why);
    std::vector<std::string> kinds = allGather("transport", kind);
    for (int r = 0; r < size_; ++r) {
      if (kinds[r] == kind) continue;
      MAESTRO_CHECK(config.transport == "auto", "rank ", r, " uses the ", kinds[r], " transport but rank ", rank_,
                    " uses ", kind);
      why += strcat("; rank ", r, " chose ", kinds[r], ", so the group uses ", transport::kPortableKind);
      kind = transport::kPortableKind;
    }
    mesh.transport_kind = kind;
    mesh.transport_why = why;

    mesh.discovery = config.discovery;
    // Whether its routes can be probed and chosen: decided before the
    // transport exists, so by what its kind declares.
    const bool routable = transport::capabilities(kind).route_control;
    // The route survey: needed to decide discovery=auto, and to count the
    // core hops for paths=auto where discovery runs.
    const bool can_probe = routable && !one_host;
    // MAESTRO_WEIGHTS names one weight per path: auto keeps one path per vNIC.
    const bool count_spines = config.paths == 0 && config.weights.empty();
    RouteSurvey survey;
    if (can_probe && (config.discovery == "auto" || (config.discovery == "ttl" && count_spines)))
      survey = surveyRoutes(config, mesh);
    if (config.discovery == "auto") {
      bool any = false;
      for (const auto& v : allGather("routed", survey.routed() ? "1" : "0")) any = any || v == "1";
      mesh.discovery = any ? "ttl" : "off";
      if (!routable)
        mesh.discovery_why = strcat("the ", kind, " transport cannot probe routes");
      else if (one_host) mesh.discovery_why = "every rank is on this host";
      else if (any) mesh.discovery_why = "routers between the ranks answered probes";
      else mesh.discovery_why = survey.why;
    } else if (mesh.discovery == "ttl" && !routable) {
      mesh.discovery_why = strcat("the ", kind, " transport cannot probe routes: its paths are opened as without it");
      MAESTRO_WARN("MAESTRO_DISCOVERY=ttl: ", mesh.discovery_why);
    }
    if (config.paths == 0 && !count_spines)
      mesh.paths_why = "auto: one per vNIC (MAESTRO_WEIGHTS gives one weight per path)";
    if (count_spines && mesh.discovery == "ttl" && can_probe) {
      std::vector<int> hops;
      for (const auto& v : allGather("core_hops", std::to_string(survey.core_hops))) hops.push_back(std::stoi(v));
      PathCount count = autoPathCount(vnic_paths, hops);
      mesh.paths = count.paths;
      mesh.paths_why = count.why;
    }
    // Route probes from a listener's own port need it shared (SO_REUSEPORT);
    // otherwise no other socket may bind it.
    options.share_listen_ports = mesh.discovery == "ttl";
  } catch (const Error& e) {
    publishError(e.what());
    throw;
  }
  return mesh;
}

QpManager::RouteSurvey QpManager::surveyRoutes(const Config& config, const Mesh& mesh) {
  // TTL-limited SYNs from our vNICs towards the matching vNICs of the ring
  // neighbour (any port: the routers look at it only to hash), each from a
  // source port of its own, in rounds. A router that answers means the paths
  // are routed, so they may be hashed: discovery then finds out (and costs
  // one probing round where routes are pinned). The peer itself answering,
  // or no answer, means no router that far (one switch, or ICMP filtered:
  // discovery could not help anyway). The distinct routers that answer are
  // the core hops the flows between the two hosts are spread over: the
  // spines, which paths=auto matches. The first round sends one probe per
  // vNIC, each next one twice as many, until one finds no new hop
  // (surveyDone): few probes where one router answers them all (it answers
  // only a few a second, and discovery needs them next). With 4 vNICs one
  // survey finds all of 8 spines 95 times in 100, all of 16 spines 76 times
  // (15.7 on average; benchmarks/fabric_sim.py models this rule), and the
  // group takes the largest of its ranks' surveys.
  //
  // The answer is kept for every later group of this process between the
  // same addresses: the network does not change under a job, and routers
  // limit the ICMP answers they send (Linux: a burst of 6 per destination,
  // then one a second), so the probes of a job's fourth group in a row go
  // unanswered and would turn its discovery off, a second late.
  RouteSurvey survey;
  const int right = (rank_ + 1) % size_;
  const auto& theirs = mesh.peer_vnics[right];
  if (right == rank_ || theirs.empty()) return survey;
  const size_t n = mesh.vnics.addresses.size();
  auto probe = [&](size_t i) {
    return std::make_pair(net::parseAddress(mesh.vnics.addresses[i % n], 0),
                          net::parseAddress(theirs[i % n % theirs.size()], 9));
  };
  std::string key = strcat("ttl ", config.probe_ttl, ":");
  for (size_t i = 0; i < n; ++i) key += strcat(" ", mesh.vnics.addresses[i], ">", theirs[i % theirs.size()]);
  static std::mutex surveys_mu;
  static std::map<std::string, RouteSurvey> surveys;
  {
    std::lock_guard<std::mutex> lock(surveys_mu);
    auto it = surveys.find(key);
    if (it != surveys.end()) {
      survey = it->second;
      if (!survey.routed()) survey.why += " (probed by an earlier group of this process)";
      return survey;
    }
  }
  std::set<std::string> seen;
  std::string probe_why;
  const auto until = Clock::now() + std::chrono::seconds(1);
  for (int sent = 0, round_size = static_cast<int>(n);; round_size *= 2) {
    round_size = std::min(round_size, kSurveyProbes - sent);
    std::vector<std::pair<net::SockAddr, net::SockAddr>> round;
    for (int i = 0; i < round_size; ++i) round.push_back(probe(sent + i));
    const size_t before = seen.size();
    for (const auto& h : net::probeHops(round, config.probe_ttl, until, &probe_why))
      if (!h.empty()) seen.insert(h);
    sent += round_size;
    if (surveyDone(sent, static_cast<int>(seen.size()), static_cast<int>(seen.size() - before)) ||
        Clock::now() >= until)
      break;
  }
  survey.core_hops = static_cast<int>(seen.size());
  if (!survey.routed())
    survey.why = probe_why.empty() ? strcat("no router ", config.probe_ttl, " hops towards rank ", right) : probe_why;
  std::lock_guard<std::mutex> lock(surveys_mu);
  surveys.emplace(key, survey);
  return survey;
}

void QpManager::connectAll(const Config& config, Mesh& mesh, const std::vector<Planned>& planned, Deadline deadline,
                           std::map<int, std::vector<int>>* connected, std::map<int, std::string>* errors) {
  // In parallel: a path whose link is down costs connect_timeout once, not
  // once per path.
  auto until = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(config.connect_timeout)));
  std::vector<std::string> outcome(planned.size());
  std::vector<char> ok(planned.size(), 0);
  // A bounded pool of connecting threads (while connecting only): a thread
  // per path is too many at hundreds of peers. Every attempt ends by
  // `until`, so a path whose link is down holds one thread for
  // connect_timeout; the pool is large enough that a few dead links do not
  // starve the rest.
  constexpr size_t kConnectThreads = 32;
  std::atomic<size_t> next{0};
  auto connectOne = [&](size_t i) {
    const Planned& p = planned[i];
    transport::PathSpec spec;
    spec.peer = p.peer;
    spec.path = p.path;
    spec.local_addr = mesh.vnics.addresses[p.path % mesh.vnics.addresses.size()];
    spec.remote_endpoint = mesh.endpoints[p.peer][p.path % mesh.endpoints[p.peer].size()];
    spec.local_port = p.local_port;
    transport::Hello hello;
    std::memcpy(hello.secret, mesh.options.secret.data(), mesh.options.secret.size());
    hello.rank = rank_;
    hello.path = p.path;
    try {
      mesh.transport->connect(spec, hello, until);
      ok[i] = 1;
    } catch (const Error& e) {
      outcome[i] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min(kConnectThreads, planned.size()); ++t)
    threads.push_back(startNamedThread("maestro-connect", [&] {
      for (size_t i; (i = next++) < planned.size();) connectOne(i);
    }));
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < planned.size(); ++i) {
    if (ok[i]) (*connected)[planned[i].peer].push_back(planned[i].path);
    else (*errors)[planned[i].peer] += "\n  " + outcome[i];
  }
}

void QpManager::discover(const Config& config, Mesh& mesh, const std::vector<RankPair>& pairs,
                         const Exchange& exchange, transport::RouteControl& routes, std::map<int, PeerPaths>* paths,
                         std::map<int, std::vector<uint16_t>>* ports) {
  // Candidates are 5-tuples, not connections: the opener reserves a source
  // port per candidate; both ends send a TTL-limited SYN on their direction
  // of it (the opener from the reserved port to the peer's listener, the
  // other end from its listener back to the reserved port); the router where
  // the SYN expires names the core path. Both ends publish what they found
  // and run the same selection, so they agree on which candidates become
  // the paths -- and only those are connected.
  const auto& endpoints = mesh.endpoints;
  const int P = mesh.paths, cap = P * config.candidates, per_round = std::min(cap, 2 * P);
  std::map<int, std::vector<uint16_t>> cand_port;           // pair -> port of each candidate
  Hops fwd, bwd;
  std::map<int, bool> done;
  for (const auto& [a, b] : pairs) done[pairKey(a, b, size_)] = false;
  std::string why;
  for (int round = 0;; ++round) {
    const int from = round * per_round, to = std::min(cap, from + per_round);
    // 1. The opener (lower rank) reserves this round's source ports.
    std::string record;
    for (const auto& [a, peer] : pairs) {
      if (a != rank_ || done[pairKey(rank_, peer, size_)]) continue;
      record += strcat(peer, ":");
      for (int c = from; c < to; ++c)
        record += strcat(c == from ? "" : ",",
                         routes.reservePort(mesh.vnics.addresses[c % mesh.vnics.addresses.size()]));
      record += ";";
    }
    std::vector<std::string> records = exchange(strcat("candidates.", round), record);
    // 2. Probe our direction of every new candidate we take part in.
    std::vector<transport::RouteProbe> probes;
    std::vector<std::pair<int, int>> which;  // (pair key, candidate), and we are the opener?
    std::vector<bool> forward;
    for (int r = 0; r < size_; ++r) {
      size_t at = 0;
      const std::string& rec = records[r];
      while (at < rec.size()) {
        size_t colon = rec.find(':', at), semi = rec.find(';', at);
        int peer = std::stoi(rec.substr(at, colon - at));
        int key = pairKey(r, peer, size_);
        int c = from;
        for (const auto& p : splitList(rec.substr(colon + 1, semi - colon - 1))) {
          uint16_t port = static_cast<uint16_t>(std::stoi(p));
          auto& v = cand_port[key];
          if (static_cast<int>(v.size()) <= c) v.resize(c + 1, 0);
          v[c] = port;
          const std::string opener = strcat(mesh.peer_vnics[r][c % mesh.peer_vnics[r].size()], ":", port);
          const std::string listener = endpoints[peer][c % endpoints[peer].size()];
          if (r == rank_) {  // we open it: probe towards the peer's listener
            probes.push_back({opener, listener});
            which.emplace_back(key, c);
            forward.push_back(true);
          } else if (peer == rank_) {  // we accept it: probe back from our listener
            probes.push_back({listener, opener});
            which.emplace_back(key, c);
            forward.push_back(false);
          }
          ++c;
        }
        at = semi + 1;
      }
    }
    std::string probe_why;
    std::vector<std::string> hops =
        probes.empty() ? std::vector<std::string>()
                       : routes.probeRoutes(probes, config.probe_ttl, Clock::now() + std::chrono::milliseconds(1500),
                                            &probe_why);
    if (!probe_why.empty()) why = probe_why;
    std::string found;
    for (size_t i = 0; i < probes.size(); ++i)
      found += strcat(which[i].first, ":", which[i].second, ":", forward[i] ? "f" : "b", "=", hops[i], ";");
    std::vector<std::string> all_found = exchange(strcat("routes.", round), found);
    for (const auto& rec : all_found) {
      size_t at = 0;
      while (at < rec.size()) {
        size_t c1 = rec.find(':', at), c2 = rec.find(':', c1 + 1), eq = rec.find('=', at), semi = rec.find(';', at);
        int key = std::stoi(rec.substr(at, c1 - at));
        int c = std::stoi(rec.substr(c1 + 1, c2 - c1 - 1));
        auto& dir = rec[c2 + 1] == 'f' ? fwd[key] : bwd[key];
        if (static_cast<int>(dir.size()) <= c) dir.resize(c + 1);
        dir[c] = rec.substr(eq + 1, semi - eq - 1);
        at = semi + 1;
      }
    }
    // 3. Every rank decides for every pair, from the same data.
    bool all_done = true;
    for (auto& [key, is_done] : done) {
      if (is_done) continue;
      int a = key / size_, b = key % size_;
      const std::vector<Candidate> cands = candidatesOf(fwd[key], bwd[key], to);
      bool answers = false;
      for (const Candidate& c : cands) answers = answers || !c.forward.empty() || !c.backward.empty();
      bool f, w;
      directionsOf(a, b, size_, &f, &w);
      // Stop when disjoint, when probes get no answers (same leaf, ICMP
      // filtered: more candidates would not help), or at the cap.
      is_done = fullyDisjoint(selectDisjoint(cands, P, f, w), P, f, w) || !answers || to >= cap;
      all_done = all_done && is_done;
    }
    if (all_done) break;
  }
  if (!why.empty()) MAESTRO_WARN("discovery: ", why);

  chooseCandidates(mesh, routes, cand_port, fwd, bwd, paths, ports);
}

void QpManager::chooseCandidates(Mesh& mesh, transport::RouteControl& routes,
                                 std::map<int, std::vector<uint16_t>>& cand_port, Hops& fwd, Hops& bwd,
                                 std::map<int, PeerPaths>* paths, std::map<int, std::vector<uint16_t>>* ports) {
  const int P = mesh.paths;
  for (auto& [peer, out] : *paths) {
    int key = pairKey(rank_, peer, size_), a = std::min(rank_, peer), b = std::max(rank_, peer);
    int n = static_cast<int>(cand_port[key].size());
    const std::vector<Candidate> cands = candidatesOf(fwd[key], bwd[key], n);
    bool f, w;
    directionsOf(a, b, size_, &f, &w);
    Selection sel = selectDisjoint(cands, P, f, w);
    out.ids = sel.chosen;
    (*ports)[peer] = cand_port[key];
    bool lower = rank_ < peer;
    std::ostringstream report;
    report << "rank " << peer << ": " << n << " candidates, "
           << (lower ? sel.distinct_forward : sel.distinct_backward) << " distinct outgoing core hops; paths via";
    for (int c : sel.chosen) {
      const std::string& hop = lower ? cands[c].forward : cands[c].backward;
      report << " " << (hop.empty() ? "?" : hop);
    }
    out.report = report.str();
    if (lower) {
      for (int c = 0; c < n; ++c)
        if (std::find(sel.chosen.begin(), sel.chosen.end(), c) == sel.chosen.end())
          routes.releasePort(mesh.vnics.addresses[c % mesh.vnics.addresses.size()], cand_port[key][c]);
    }
    out.routes.clear();
    for (int c : sel.chosen) out.routes.push_back(lower ? cands[c].forward : cands[c].backward);
  }
}

void QpManager::open(Mesh& mesh, transport::CompletionSink* sink) {
  try {
    mesh.options.sink = sink;
    mesh.transport = transport::makeTransport(mesh.transport_kind, mesh.options);

    // Listen on every local vNIC and publish the endpoints.
    std::string mine;
    for (const auto& a : mesh.vnics.addresses) mine += (mine.empty() ? "" : ",") + mesh.transport->listen(a);
    std::vector<std::vector<std::string>> endpoints;
    for (const auto& e : allGather("endpoints", mine)) endpoints.push_back(splitList(e));
    mesh.transport->expectPeers(endpoints);
    mesh.endpoints = endpoints;
    // Every rank published its endpoints after it read the group secret:
    // the store need not keep it (anyone who can read the store could
    // otherwise present it).
    if (rank_ == 0) store_.erase(key("secret", 0));
  } catch (const Error& e) {
    publishError(e.what());
    if (mesh.transport) mesh.transport->shutdown();
    throw;
  }
}

std::map<int, PeerPaths> QpManager::connectPairs(const Config& config, Mesh& mesh, const std::vector<RankPair>& pairs,
                                                 const Exchange& exchange, Deadline deadline) {
  const int P = mesh.paths;
  std::map<int, PeerPaths> out;
  for (const auto& [a, b] : pairs) {
    if (a != rank_ && b != rank_) continue;
    const int peer = a == rank_ ? b : a;
    out[peer].initiator = rank_ < peer;
  }
  // TCP: a socket per path to each peer, and a few for route probes and
  // reconnects in flight.
  if (mesh.transport->capabilities().descriptor_per_path && !out.empty())
    net::reserveDescriptors(out.size() * P + 16, strcat(out.size(), " peer(s) with ", P, " paths each"));
  // Which transport path id each path of each peer is: the path index, or
  // under discovery the chosen candidate (connected from its probed port).
  std::map<int, std::vector<uint16_t>> ports;
  if (mesh.discovery == "ttl" && mesh.transport->routeControl()) {
    discover(config, mesh, pairs, exchange, *mesh.transport->routeControl(), &out, &ports);
  } else {
    for (auto& [peer, pp] : out) pp.plain(P);
  }
  std::vector<Planned> planned;
  for (auto& [peer, pp] : out) {
    if (peer < rank_) continue;
    for (int id : pp.ids) planned.push_back({peer, id, ports.count(peer) ? ports[peer][id] : static_cast<uint16_t>(0)});
  }
  std::map<int, std::vector<int>> connected;
  std::map<int, std::string> errors;
  connectAll(config, mesh, planned, deadline, &connected, &errors);

  // The peers learn which paths connected ("peer:id,id;..."), and wait for
  // the ones opened towards them.
  std::string record;
  for (auto& [peer, pp] : out) {
    if (peer < rank_) continue;
    record += strcat(peer, ":");
    for (size_t i = 0; i < connected[peer].size(); ++i) record += strcat(i ? "," : "", connected[peer][i]);
    record += ";";
  }
  std::vector<std::string> records = exchange("connected", record);
  for (auto& [r, pp] : out) {
    if (r > rank_) continue;
    size_t at = 0;
    const std::string& rec = records[r];
    while (at < rec.size()) {
      size_t colon = rec.find(':', at), semi = rec.find(';', at);
      if (std::stoi(rec.substr(at, colon - at)) == rank_)
        for (const auto& id : splitList(rec.substr(colon + 1, semi - colon - 1))) connected[r].push_back(std::stoi(id));
      at = semi + 1;
    }
    if (!connected[r].empty()) mesh.transport->awaitAcceptedFrom(r, connected[r], connected[r].size(), deadline);
  }
  for (auto& [peer, pp] : out) {
    const std::vector<int>& conn = connected[peer];
    if (conn.empty())
      fail("cannot reach rank ", peer, " on any of its ", pp.ids.size(), " paths:",
           errors[peer].empty() ? strcat(" (rank ", peer, " could not connect to us)") : errors[peer]);
    pp.markUp(conn);
  }
  return out;
}

std::map<int, PeerPaths> QpManager::connectAtStart(const Config& config, Mesh& mesh, const std::vector<RankPair>& pairs) {
  try {
    return connectPairs(config, mesh, pairs,
                        [this](const std::string& step, const std::string& value) { return allGather(step, value); },
                        deadline_);
  } catch (const Error& e) {
    publishError(e.what());
    if (mesh.transport) mesh.transport->shutdown();
    throw;
  }
}

PeerPaths QpManager::connectPair(const Config& config, Mesh& mesh, int peer, Deadline deadline,
                                 const std::atomic<bool>& stop) {
  if (mesh.discovery != "ttl") return connectPairDirectly(config, mesh, peer, deadline, stop);
  const std::string prefix = strcat("maestro/pair.", std::min(rank_, peer), ".", std::max(rank_, peer), "/");
  // The two ranks alone, by polling: a blocking wait would hold the store
  // client (one connection per process) while other pairs connect beside it.
  auto exchange = [&](const std::string& step, const std::string& value) {
    store_.set(strcat(prefix, step, "/", rank_), "ok:" + value);
    std::vector<std::string> out(size_);
    out[rank_] = value;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      std::string v;
      if (store_.tryGet(strcat(prefix, step, "/", peer), &v) || store_.tryGet(strcat(prefix, "failed/", peer), &v)) {
        if (v.rfind("error:", 0) == 0) throw Error(strcat("rank ", peer, " failed to connect to rank ", rank_, ": ",
                                                          v.substr(6)));
        MAESTRO_CHECK(v.rfind("ok:", 0) == 0, "malformed maestro connection record from rank ", peer);
        out[peer] = v.substr(3);
        return out;
      }
      if (stop.load()) fail("the group is shutting down");
      if (Clock::now() >= deadline)
        fail("timed out waiting for rank ", peer, " to connect (step '", step,
             "'): it has not reached an operation with this rank");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  };
  try {
    std::map<int, PeerPaths> out = connectPairs(config, mesh, {{std::min(rank_, peer), std::max(rank_, peer)}},
                                                exchange, deadline);
    return out.at(peer);
  } catch (const Error& e) {
    try {
      store_.set(strcat(prefix, "failed/", rank_), strcat("error:", e.what()));
    } catch (const Error&) {
    }
    throw;
  }
}

PeerPaths QpManager::connectPairDirectly(const Config& config, Mesh& mesh, int peer, Deadline deadline,
                                         const std::atomic<bool>& stop) {
  // Without discovery there is nothing to agree on: the lower rank opens
  // path i to the peer's published endpoint i, and the peer takes what
  // arrives. No store: the rank that hosts it may have left by now (a job's
  // last operation ends on some ranks before it does on others).
  PeerPaths out;
  out.initiator = rank_ < peer;
  out.plain(mesh.paths);
  if (mesh.transport->capabilities().descriptor_per_path)
    net::reserveDescriptors(mesh.paths + 16, strcat("rank ", peer, "'s ", mesh.paths, " paths"));
  std::vector<int> up;
  if (out.initiator) {
    std::vector<Planned> planned;
    for (int id : out.ids) planned.push_back({peer, id, 0});
    std::map<int, std::vector<int>> connected;
    std::map<int, std::string> errors;
    connectAll(config, mesh, planned, deadline, &connected, &errors);
    up = connected[peer];
    if (up.empty()) fail("cannot reach rank ", peer, " on any of its ", mesh.paths, " paths:", errors[peer]);
  } else {
    // The first path comes when the peer asks for the pair too (it may be
    // late: its side of the operation has not started); the others within
    // connect_timeout of it, or they start down and their opener retries.
    for (;;) {
      if (stop.load()) fail("the group is shutting down");
      if (Clock::now() >= deadline)
        fail("timed out waiting for rank ", peer, " to connect: it has not reached an operation with this rank");
      auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (!mesh.transport->awaitAcceptedFrom(peer, out.ids, 0, slice).empty()) break;
    }
    auto rest = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(config.connect_timeout)));
    up = mesh.transport->awaitAcceptedFrom(peer, out.ids, 1, rest);
  }
  out.markUp(up);
  return out;
}

}  // namespace multipath
}  // namespace maestro
