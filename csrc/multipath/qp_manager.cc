#include "multipath/qp_manager.h"

#include "multipath/discovery.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/net.h"
#include "transport/tcp/region_table.h"  // randomU64

namespace maestro {
namespace multipath {
namespace {

// Every step of the start-up, in order; an error is published under all of
// them so that a peer waiting at any step sees it.
const std::vector<std::string> kSteps = {"host", "config", "vnics", "secret", "transport", "endpoints"};

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

}  // namespace

QpManager::QpManager(Rendezvous& store, int rank, int size, Deadline deadline)
    : store_(store), rank_(rank), size_(size), deadline_(deadline) {}

void QpManager::publishError(const std::string& message) {
  // Under every step not yet published, and the rounds of the connection
  // phase: a peer waiting at any of them sees the error.
  std::vector<std::string> steps = kSteps;
  for (int round = 0; round < 64; ++round) {
    steps.push_back(strcat("connected.", round));
    steps.push_back(strcat("routes.", round));
  }
  for (const auto& step : steps) {
    bool done = false;
    for (const auto& p : published_) done = done || p == step;
    if (!done) store_.set(key(step, rank_), "error:" + message);
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

    mesh.vnics = chooseVnics(config, one_host, rendezvous_host);
    std::string mine;
    for (const auto& a : mesh.vnics.addresses) mine += (mine.empty() ? "" : ",") + a;
    std::vector<std::string> all_vnics = allGather("vnics", mine);
    if (config.paths > 0) {
      mesh.paths = config.paths;
    } else {
      mesh.paths = static_cast<int>(mesh.vnics.addresses.size());
      for (const auto& v : all_vnics) mesh.paths = std::min<int>(mesh.paths, static_cast<int>(splitList(v).size()));
    }
    MAESTRO_CHECK(mesh.paths >= 1, "no vNIC addresses: set MAESTRO_VNICS or MAESTRO_IFNAME");

    transport::TransportOptions& options = mesh.options;
    options.rank = rank_;
    options.world_size = size_;
    options.max_inflight_per_path = config.window;
    options.busy_poll = config.busy_poll;
    std::string secret_hex;
    if (rank_ == 0) {
      for (size_t i = 0; i < options.secret.size(); i += 8) {
        uint64_t r = transport::tcp::randomU64();
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
      kind = "tcp";
      why += strcat("; rank ", r, " cannot use verbs, so the group uses tcp");
    }
    mesh.transport_kind = kind;
    mesh.transport_why = why;
  } catch (const Error& e) {
    publishError(e.what());
    throw;
  }
  return mesh;
}

void QpManager::connectRange(const Config& config, Mesh& mesh,
                             const std::vector<std::vector<std::string>>& endpoints, const std::vector<int>& peers,
                             int from, int to, std::vector<std::vector<int>>* connected,
                             std::vector<std::string>* errors) {
  // Connect in parallel: a path whose link is down costs connect_timeout
  // once, not once per path.
  struct Attempt {
    int peer, cand;
    bool ok = false;
    std::string error;
  };
  std::vector<Attempt> attempts;
  for (int peer : peers)
    for (int c = from; c < to; ++c) attempts.push_back({peer, c, false, ""});
  auto until = std::min(deadline_, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(config.connect_timeout)));
  std::vector<std::thread> threads;
  for (auto& a : attempts)
    threads.emplace_back([&, until] {
      transport::PathSpec spec;
      spec.peer = a.peer;
      spec.path = a.cand;
      spec.local_addr = mesh.vnics.addresses[a.cand % mesh.vnics.addresses.size()];
      spec.remote_endpoint = endpoints[a.peer][a.cand % endpoints[a.peer].size()];
      transport::Hello hello;
      std::memcpy(hello.secret, mesh.options.secret.data(), mesh.options.secret.size());
      hello.rank = rank_;
      hello.path = a.cand;
      try {
        mesh.transport->connect(spec, hello, until);
        a.ok = true;
      } catch (const Error& e) {
        a.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& a : attempts) {
    if (a.ok) (*connected)[a.peer].push_back(a.cand);
    else (*errors)[a.peer] += "\n  " + a.error;
  }
}

void QpManager::open(const Config& config, Mesh& mesh, transport::CompletionSink* sink) {
  try {
    mesh.options.sink = sink;
    mesh.transport = transport::makeTransport(mesh.transport_kind, mesh.options);

    // Listen on every local vNIC and publish the endpoints.
    std::string mine;
    for (const auto& a : mesh.vnics.addresses) mine += (mine.empty() ? "" : ",") + mesh.transport->listen(a);
    std::vector<std::vector<std::string>> endpoints;
    for (const auto& e : allGather("endpoints", mine)) endpoints.push_back(splitList(e));

    const bool discover = config.discovery == "ttl";
    const int P = mesh.paths;
    const int cap = discover ? P * config.candidates : P;
    const int per_round = discover ? std::min(cap, 2 * P) : P;
    mesh.initiator.assign(size_, false);
    std::vector<int> mine_to;  // peers this rank opens paths to: the higher ranks
    for (int peer = rank_ + 1; peer < size_; ++peer) {
      mesh.initiator[peer] = true;
      mine_to.push_back(peer);
    }

    // pair (a < b): candidates opened, which connected, probed hops each way.
    auto pairKey = [&](int a, int b) { return std::min(a, b) * size_ + std::max(a, b); };
    std::map<int, int> opened;
    std::map<int, std::vector<int>> connected;
    std::map<int, std::vector<std::string>> fwd, bwd;  // indexed by candidate
    std::map<int, bool> done;
    std::vector<std::string> errors(size_);
    for (int a = 0; a < size_; ++a)
      for (int b = a + 1; b < size_; ++b) {
        opened[pairKey(a, b)] = 0;
        done[pairKey(a, b)] = false;
      }
    std::string probe_why;
    for (int round = 0;; ++round) {
      // 1. Open this round's candidates to the higher ranks whose pair needs more.
      std::vector<int> targets;
      for (int peer : mine_to)
        if (!done[pairKey(rank_, peer)]) targets.push_back(peer);
      int from = round * per_round, to = std::min(cap, from + per_round);
      std::vector<std::vector<int>> now(size_);
      connectRange(config, mesh, endpoints, targets, from, to, &now, &errors);
      // 2. Everyone learns which candidates connected ("peer:c,c;peer:c").
      std::string record;
      for (int peer : targets) {
        record += strcat(peer, ":");
        for (size_t i = 0; i < now[peer].size(); ++i) record += strcat(i ? "," : "", now[peer][i]);
        record += ";";
      }
      std::vector<std::string> records = allGather(strcat("connected.", round), record);
      size_t expected = 0;
      std::vector<std::pair<int, int>> fresh;  // (peer, candidate) connected this round, from my side
      for (int r = 0; r < size_; ++r) {
        size_t at = 0;
        const std::string& rec = records[r];
        while (at < rec.size()) {
          size_t colon = rec.find(':', at), semi = rec.find(';', at);
          int peer = std::stoi(rec.substr(at, colon - at));
          for (const auto& c : splitList(rec.substr(colon + 1, semi - colon - 1))) {
            int cand = std::stoi(c);
            connected[pairKey(r, peer)].push_back(cand);
            if (peer == rank_) ++expected;
            if (r == rank_ || peer == rank_) fresh.emplace_back(r == rank_ ? peer : r, cand);
          }
          opened[pairKey(r, peer)] = to;
          at = semi + 1;
        }
      }
      mesh.transport->awaitAccepted(accepted_ += expected, deadline_);
      if (!discover) break;

      // 3. Probe every fresh candidate in our outgoing direction.
      std::vector<std::string> hops =
          fresh.empty() ? std::vector<std::string>()
                        : mesh.transport->probeRoutes(fresh, config.probe_ttl, Clock::now() + std::chrono::milliseconds(1500),
                                                      &probe_why);
      std::string routes;
      for (size_t i = 0; i < fresh.size(); ++i) routes += strcat(fresh[i].first, ":", fresh[i].second, "=", hops[i], ";");
      std::vector<std::string> all_routes = allGather(strcat("routes.", round), routes);
      for (int r = 0; r < size_; ++r) {
        size_t at = 0;
        const std::string& rec = all_routes[r];
        while (at < rec.size()) {
          size_t colon = rec.find(':', at), eq = rec.find('=', at), semi = rec.find(';', at);
          int peer = std::stoi(rec.substr(at, colon - at));
          int cand = std::stoi(rec.substr(colon + 1, eq - colon - 1));
          auto& dir = r < peer ? fwd[pairKey(r, peer)] : bwd[pairKey(r, peer)];
          if (static_cast<int>(dir.size()) <= cand) dir.resize(cand + 1);
          dir[cand] = rec.substr(eq + 1, semi - eq - 1);
          at = semi + 1;
        }
      }
      // 4. Every rank decides for every pair, from the same data.
      bool all_done = true;
      for (auto& [key, is_done] : done) {
        if (is_done) continue;
        int a = key / size_, b = key % size_;
        std::vector<Candidate> cands;
        bool answers = false;
        for (int c : connected[key]) {
          Candidate cd;
          if (c < static_cast<int>(fwd[key].size())) cd.forward = fwd[key][c];
          if (c < static_cast<int>(bwd[key].size())) cd.backward = bwd[key][c];
          answers = answers || !cd.forward.empty() || !cd.backward.empty();
          cands.push_back(cd);
        }
        bool f = b == (a + 1) % size_ || size_ == 2, w = a == (b + 1) % size_ || size_ == 2;
        if (!f && !w) f = w = true;  // not ring neighbours: both directions count alike
        Selection sel = selectDisjoint(cands, P, f, w);
        // Stop when disjoint, when probes get no answers (same leaf, or ICMP
        // filtered: more candidates would not help), or at the cap.
        is_done = fullyDisjoint(sel, P, f, w) || !answers || opened[key] >= cap;
        all_done = all_done && is_done;
      }
      if (all_done) break;
    }

    // The paths of every peer.
    mesh.ids.assign(size_, {});
    mesh.up.assign(size_, {});
    mesh.routes.assign(size_, {});
    std::ostringstream report;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      int key = pairKey(rank_, peer);
      std::vector<int>& conn = connected[key];
      std::sort(conn.begin(), conn.end());
      if (conn.empty())
        fail("cannot reach rank ", peer, " on any of its ", P, " paths:",
             errors[peer].empty() ? std::string(" (rank ") + std::to_string(peer) + " could not connect to us)"
                                  : errors[peer]);
      if (!discover) {
        for (int p = 0; p < P; ++p) {
          mesh.ids[peer].push_back(p);
          mesh.up[peer].push_back(std::find(conn.begin(), conn.end(), p) != conn.end());
          mesh.routes[peer].push_back("");
        }
        continue;
      }
      bool lower = rank_ < peer;
      std::vector<Candidate> cands;
      for (int c : conn) {
        Candidate cd;
        if (c < static_cast<int>(fwd[key].size())) cd.forward = fwd[key][c];
        if (c < static_cast<int>(bwd[key].size())) cd.backward = bwd[key][c];
        cands.push_back(cd);
      }
      int a = std::min(rank_, peer), b = std::max(rank_, peer);
      bool f = b == (a + 1) % size_ || size_ == 2, w = a == (b + 1) % size_ || size_ == 2;
      if (!f && !w) f = w = true;
      Selection sel = selectDisjoint(cands, P, f, w);
      std::vector<bool> keep(conn.size(), false);
      for (int i : sel.chosen) {
        keep[i] = true;
        mesh.ids[peer].push_back(conn[i]);
        mesh.up[peer].push_back(true);
        mesh.routes[peer].push_back(lower ? cands[i].forward : cands[i].backward);
      }
      report << "\n  rank " << peer << ": " << conn.size() << " candidates, " << (lower ? sel.distinct_forward : sel.distinct_backward)
             << " distinct outgoing hops, paths via";
      for (const auto& r : mesh.routes[peer]) report << " " << (r.empty() ? "?" : r);
      // The initiator closes the candidates nobody uses.
      if (mesh.initiator[peer])
        for (size_t i = 0; i < conn.size(); ++i)
          if (!keep[i]) mesh.transport->closePath(peer, conn[i], "unused discovery candidate");
      if (static_cast<int>(sel.chosen.size()) < P)
        MAESTRO_WARN("discovery: only ", sel.chosen.size(), " usable candidates to rank ", peer, " for ", P, " paths");
    }
    if (discover) {
      mesh.discovery_report = report.str();
      if (!probe_why.empty()) MAESTRO_WARN("discovery: ", probe_why);
    }
  } catch (const Error& e) {
    publishError(e.what());
    if (mesh.transport) mesh.transport->shutdown();
    throw;
  }
}

}  // namespace multipath
}  // namespace maestro
