#include "transport/factory.h"

#include "common/error.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/verbs/verbs_transport.h"  // free of rdma-core: its declarations are there in every build

namespace maestro {
namespace transport {

Capabilities capabilities(const std::string& kind) {
  if (kind == "tcp") return tcp::kCapabilities;
  if (kind == "verbs") return verbs::kCapabilities;
  fail("unknown transport '", kind, "'");
}

std::unique_ptr<Transport> makeTransport(const std::string& kind, const TransportOptions& options) {
  if (kind == "tcp") return std::make_unique<tcp::TcpTransport>(options);
  if (kind == "verbs") {
#ifdef MAESTRO_HAVE_VERBS
    return verbs::makeVerbsTransport(options);
#else
    fail("MAESTRO_TRANSPORT=verbs, but this build of maestro has no verbs transport (install "
         "libibverbs-dev and librdmacm-dev and reinstall maestro_torch)");
#endif
  }
  fail("unknown transport '", kind, "'");
}

std::string chooseTransport(const std::string& requested, const std::vector<std::string>& vnics,
                            std::string* why) {
  if (requested == "tcp") {
    *why = "MAESTRO_TRANSPORT=tcp";
    return "tcp";
  }
#ifdef MAESTRO_HAVE_VERBS
  std::string reason;
  bool usable = verbs::verbsUsableFor(vnics, &reason);
  if (requested == "verbs") {
    MAESTRO_CHECK(usable, "MAESTRO_TRANSPORT=verbs, but ", reason);
    *why = "MAESTRO_TRANSPORT=verbs: " + reason;
    return "verbs";
  }
  *why = strcat("auto: ", reason);
  return usable ? "verbs" : "tcp";
#else
  MAESTRO_CHECK(requested != "verbs", "MAESTRO_TRANSPORT=verbs, but this build of maestro has no verbs "
                "transport (install libibverbs-dev and librdmacm-dev and reinstall maestro_torch)");
  *why = "auto: this build has no verbs transport";
  return "tcp";
#endif
}

}  // namespace transport
}  // namespace maestro
