// Where each rank opens its paths from, as Transport::expectPeers() learns
// it: path `path` of rank `rank` comes from the address of
// endpoints[rank][path % size] (the vNIC that rank opens it from). Both
// transports accept a path only from there.
#pragma once

#include <string>
#include <vector>

#include "common/error.h"
#include "common/net.h"

namespace maestro {
namespace transport {

class PublishedSources {
 public:
  PublishedSources() = default;
  // endpoints[rank][i], "ip:port"; `who` names the transport in errors.
  PublishedSources(const std::vector<std::vector<std::string>>& endpoints, int world_size, const char* who) {
    MAESTRO_CHECK(endpoints.size() == static_cast<size_t>(world_size), who, ": expectPeers: ", endpoints.size(),
                  " ranks' endpoints for a world of ", world_size);
    addresses_.resize(endpoints.size());
    for (size_t r = 0; r < endpoints.size(); ++r)
      for (const auto& e : endpoints[r]) addresses_[r].push_back(net::parseEndpoint(e).ip());
  }
  // The address `rank` opens `path` from; "" where it published none. The
  // rank is one a checked hello named (in range).
  const std::string& of(int rank, int path) const {
    static const std::string none;
    const auto& mine = addresses_.at(rank);
    return mine.empty() ? none : mine[path % mine.size()];
  }
  bool admits(int rank, int path, const std::string& ip) const {
    const std::string& want = of(rank, path);
    return !want.empty() && want == ip;
  }

 private:
  std::vector<std::vector<std::string>> addresses_;  // [rank][i]: ip of its i-th vNIC
};

}  // namespace transport
}  // namespace maestro
