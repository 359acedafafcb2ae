#include "transport/verbs/memory_region.h"

#include <infiniband/verbs.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

std::string memlockLimitText() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return strcat(limit.rlim_cur / 1024, " KiB");
}

}  // namespace

ibv_mr* registerOrExplain(ibv_pd* pd, void* addr, size_t length, int access, const char* what) {
  ibv_mr* mr = ibv_reg_mr(pd, addr, length, access);
  if (mr != nullptr) return mr;
  const int err = errno;
  if (err == ENOMEM || err == EPERM) {
    fail("verbs: registering ", length, " bytes of ", what, " failed: ", std::strerror(err),
         ". The locked-memory limit (RLIMIT_MEMLOCK, now ", memlockLimitText(),
         ") is most likely too low for RDMA: raise it with `ulimit -l unlimited` in the shell "
         "that starts the job, LimitMEMLOCK=infinity in a systemd unit, `* - memlock unlimited` "
         "in /etc/security/limits.conf, or --ulimit memlock=-1 for a container");
  }
  fail("verbs: registering ", length, " bytes of ", what, " at ", addr, " failed: ", std::strerror(err));
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
