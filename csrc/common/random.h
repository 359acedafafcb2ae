// Random bits from the kernel's CSPRNG: region keys, group secrets.
#pragma once

#include <cstdint>

namespace maestro {

uint64_t randomU64();

}  // namespace maestro
