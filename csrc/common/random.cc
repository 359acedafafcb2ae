#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstddef>

#include "common/error.h"

namespace maestro {

uint64_t randomU64() {
  uint64_t v = 0;
  auto* p = reinterpret_cast<uint8_t*>(&v);
  size_t got = 0;
  while (got < sizeof v) {
    ssize_t n = getrandom(p + got, sizeof v - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else if (errno != EINTR) fail("getrandom failed");
  }
  return v;
}

}  // namespace maestro
