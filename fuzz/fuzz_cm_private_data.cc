// libFuzzer target: what rdma_cm hands the verbs transport from the wire --
// a connect request's private data (the hello), a rejection's reason -- and
// the endpoint strings ranks publish in the store.
#include <cstdint>
#include <string>

#include "common/error.h"
#include "transport/verbs/cm_wire.h"

namespace verbs = maestro::transport::verbs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  maestro::transport::Hello hello;
  if (verbs::decodeHello(data, size, &hello)) {
    uint8_t again[verbs::kHelloWireBytes];
    verbs::encodeHello(hello, again);
    maestro::transport::Hello back;
    if (!verbs::decodeHello(again, sizeof again, &back) || back.rank != hello.rank || back.path != hello.path)
      __builtin_trap();
  }
  std::string reason;
  if (verbs::decodeReject(data, size, &reason) && reason.size() > size) __builtin_trap();
  try {
    std::string ip;
    uint16_t port = 0;
    verbs::splitEndpoint(std::string(reinterpret_cast<const char*>(data), size), &ip, &port);
  } catch (const maestro::Error&) {
    // refused with a message: fine
  }
  return 0;
}
