// Comparing a presented group secret with ours: in constant time, so the
// time a refusal takes says nothing about how much of a guess was right.
#pragma once

#include <cstddef>
#include <cstdint>

namespace maestro {

inline bool sameSecret(const uint8_t* a, const uint8_t* b, size_t n) {
  // Accumulate every byte's difference, no early exit; volatile keeps the
  // compiler from turning this back into a short-circuiting compare.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace maestro
