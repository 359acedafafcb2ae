#include "multipath/qp_manager.h"

#include <algorithm>
#include <cstring>
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
const std::vector<std::string> kSteps = {"host", "config", "vnics", "secret", "transport", "endpoints", "connected"};

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
  for (const auto& step : kSteps) {
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

void QpManager::open(const Config& config, Mesh& mesh, transport::CompletionSink* sink) {
  try {
    mesh.options.sink = sink;
    mesh.transport = transport::makeTransport(mesh.transport_kind, mesh.options);

    // Listen on every local vNIC and publish the endpoints.
    std::string endpoints;
    for (const auto& a : mesh.vnics.addresses) endpoints += (endpoints.empty() ? "" : ",") + mesh.transport->listen(a);
    std::vector<std::string> all_endpoints = allGather("endpoints", endpoints);

    mesh.specs.assign(size_, {});
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      std::vector<std::string> remote = splitList(all_endpoints[peer]);
      for (int p = 0; p < mesh.paths; ++p) {
        transport::PathSpec spec;
        spec.peer = peer;
        spec.path = p;
        spec.local_addr = mesh.vnics.addresses[p % mesh.vnics.addresses.size()];
        spec.remote_endpoint = remote[p % remote.size()];
        mesh.specs[peer].push_back(spec);
      }
    }
    // The lower rank of each pair opens the paths: path i joins our vNIC i
    // to the peer's vNIC i.
    transport::Hello hello;
    std::memcpy(hello.secret, mesh.options.secret.data(), mesh.options.secret.size());
    hello.rank = rank_;
    for (int peer = rank_ + 1; peer < size_; ++peer)
      for (int p = 0; p < mesh.paths; ++p) {
        hello.path = p;
        mesh.transport->connect(mesh.specs[peer][p], hello, deadline_);
      }
    // Wait for the lower ranks' paths, watching for a rank that failed.
    size_t expected = static_cast<size_t>(rank_) * mesh.paths;
    for (;;) {
      try {
        mesh.transport->awaitAccepted(expected, std::min(deadline_, Clock::now() + std::chrono::milliseconds(100)));
        break;
      } catch (const Error&) {
        if (Clock::now() >= deadline_) throw;
      }
      for (int r = 0; r < rank_; ++r) {
        std::string v;
        if (store_.tryGet(key("connected", r), &v) && v.rfind("error:", 0) == 0)
          fail("rank ", r, " failed to join the maestro group: ", v.substr(6));
      }
    }
    store_.set(key("connected", rank_), "ok:");
    published_.push_back("connected");
  } catch (const Error& e) {
    publishError(e.what());
    if (mesh.transport) mesh.transport->shutdown();
    throw;
  }
}

}  // namespace multipath
}  // namespace maestro
