// The shared transport contract (tests/cpp/transport_contract.h), run on the
// verbs transport over the vNICs of the Soft-RoCE VM (MAESTRO_VNICS, set by
// scripts/softroce/run.sh). Without a usable RDMA device nothing is
// generated, so this binary outside the VM runs only what can run there.
#include <sstream>

#include "../transport_contract.h"
#include "transport/verbs/verbs_transport.h"

namespace maestro {
namespace testing {
namespace {

std::vector<ContractParam> verbsParams() {
  std::vector<std::string> vnics;
  if (const char* env = std::getenv("MAESTRO_VNICS")) {
    std::stringstream in(env);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (!item.empty()) vnics.push_back(item);
    }
  }
  if (vnics.empty() || !transport::verbs::verbsUsableFor(vnics, nullptr)) return {};
  return {ContractParam{"verbs", vnics}};
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportContract);
INSTANTIATE_TEST_SUITE_P(Verbs, TransportContract, ::testing::ValuesIn(verbsParams()), contractName);

}  // namespace
}  // namespace testing
}  // namespace maestro
