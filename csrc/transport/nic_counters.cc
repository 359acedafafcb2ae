#include "transport/nic_counters.h"

#include <fstream>

namespace maestro {
namespace transport {
namespace {

// Congestion: DCQCN's notification and reaction points (mlx5). Loss: the
// retransmission and out-of-sequence counts of mlx5 and of Soft-RoCE (rxe).
constexpr const char* kCounters[] = {
    "np_cnp_sent",           "rp_cnp_handled",       "rp_cnp_ignored",       "np_ecn_marked_roce_packets",
    "out_of_sequence",       "packet_seq_err",       "local_ack_timeout_err", "implied_nak_seq_err",
    "out_of_seq_request",    "rcvd_seq_err",         "duplicate_request",     "completer_retry_err",
    "retry_exceeded_err",
};

}  // namespace

std::map<std::string, uint64_t> readNicCounters(const std::string& port_dir) {
  std::map<std::string, uint64_t> out;
  for (const char* name : kCounters) {
    std::ifstream f(port_dir + "/hw_counters/" + name);
    uint64_t v = 0;
    if (f >> v) out[name] = v;
  }
  return out;
}

std::string nicPortDir(const std::string& device, int port) {
  return "/sys/class/infiniband/" + device + "/ports/" + std::to_string(port);
}

}  // namespace transport
}  // namespace maestro
