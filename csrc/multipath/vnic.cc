#include "multipath/vnic.h"

#include "common/error.h"
#include "common/net.h"

namespace maestro {
namespace multipath {

VnicChoice chooseVnics(const Config& config, bool all_ranks_on_this_host, const std::string& rendezvous_host) {
  VnicChoice c;
  if (!config.vnics.empty()) {
    for (const auto& a : config.vnics)
      MAESTRO_CHECK(net::isLocalAddress(a), "MAESTRO_VNICS: ", a,
                    " is not an address of this host (add it as an IP alias first, e.g. "
                    "`ip addr add ", a, "/24 dev <ifname>` or `maestro-vnic add`)");
    c.addresses = config.vnics;
    c.source = "MAESTRO_VNICS";
    return c;
  }
  if (!config.ifname.empty()) {
    c.addresses = net::interfaceAddresses(config.ifname);
    c.source = "MAESTRO_IFNAME=" + config.ifname;
    return c;
  }
  if (all_ranks_on_this_host) {
    for (int i = 1; i <= kLoopbackPaths; ++i) c.addresses.push_back(strcat("127.0.0.", i));
    c.source = "loopback aliases (every rank runs on this host)";
    return c;
  }
  std::string host = rendezvous_host.empty() ? std::string("localhost") : rendezvous_host;
  c.addresses = {net::sourceAddressFor(host)};
  // Ranks on other hosts cannot reach a loopback address: say why here,
  // not with a connect error later.
  MAESTRO_CHECK(!net::isLoopbackAddress(c.addresses[0]), "the ranks run on several hosts, but with neither "
                "MAESTRO_VNICS nor MAESTRO_IFNAME set this host's paths would start at ", c.addresses[0], ", the "
                "address that reaches the rendezvous host ", rendezvous_host.empty() ? std::string("(none: no MASTER_ADDR, as with init_method tcp:// or file://; tried localhost)") : rendezvous_host,
                " -- a loopback address the other hosts cannot reach (a host name mapped to 127.0.1.1 in "
                "/etc/hosts does this). Set MAESTRO_IFNAME or MAESTRO_VNICS to this host's vNICs, or MASTER_ADDR "
                "to an address the other hosts reach");
  c.source = strcat("the address that reaches ", host);
  c.warning = strcat("maestro runs a single path per peer (", c.addresses[0],
                     "): multi-path needs virtual NICs; set MAESTRO_VNICS to this host's IP aliases "
                     "or MAESTRO_IFNAME to an interface that carries them");
  return c;
}

}  // namespace multipath
}  // namespace maestro
